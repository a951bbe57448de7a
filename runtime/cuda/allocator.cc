#include "runtime/cuda/allocator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem::cuda {

int64_t SizeClassBytes(int64_t bytes) {
  constexpr int64_t kMinGranule = 512;
  constexpr int64_t kMaxGranule = int64_t{2} << 20;
  int64_t power = 1;
  while (power * 2 <= bytes) power *= 2;
  const int64_t granule = std::min(kMaxGranule, std::max(kMinGranule, power / 8));
  return (bytes + granule - 1) / granule * granule;
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemory> memory, std::string device_id,
                                   int64_t budget_bytes)
    : AccountingAllocator(std::move(device_id), budget_bytes), memory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [size, blocks] : free_) {
    for (void* p : blocks) {
      memory_->Free(p);
      cache_.cached_bytes -= size;
      cache_.reserved_bytes -= size;
      ++cache_.released_blocks;
    }
  }
  free_.clear();
}

CacheStats CachingAllocator::cache_stats() const {
  absl::MutexLock lock(&mu_);
  return cache_;
}

void* CachingAllocator::RawAllocate(int64_t bytes) {
  const int64_t size = SizeClassBytes(bytes);
  // Read before taking mu_: AccountingAllocator's lock is never held around calls
  // into this class, so the order mu_ -> base lock cannot deadlock either way.
  const int64_t budget = stats().budget_bytes;
  absl::MutexLock lock(&mu_);
  auto it = free_.find(size);
  if (it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    cache_.cached_bytes -= size;
    ++cache_.hits;
    live_[p] = size;
    return p;
  }
  ++cache_.misses;
  // Keep the device footprint near the budget: cached blocks of other sizes go
  // back before the device is asked for more than the budget allows.
  if (budget > 0 && cache_.reserved_bytes + size > budget) EmptyCacheLocked();
  void* p = memory_->Malloc(size);
  if (p == nullptr) {
    ++cache_.device_failures;
    EmptyCacheLocked();
    p = memory_->Malloc(size);
    if (p == nullptr) {
      ++cache_.device_failures;
      return nullptr;
    }
  }
  cache_.reserved_bytes += size;
  live_[p] = size;
  return p;
}

void CachingAllocator::RawFree(void* ptr, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    // Freeing memory this allocator never handed out (or twice) would corrupt the
    // cache; it is a bug in the caller.
    std::fprintf(stderr, "%s: free of unknown pointer %p (%lld bytes)\n", device_id().c_str(), ptr,
                 static_cast<long long>(bytes));
    std::abort();
  }
  const int64_t size = it->second;
  live_.erase(it);
  free_[size].push_back(ptr);
  cache_.cached_bytes += size;
}

#ifdef TANDEM_HAVE_CUDA
namespace {

// cudaMalloc/cudaFree on one device, restoring the caller's current device.
class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int ordinal) : ordinal_(ordinal) {}

  void* Malloc(int64_t bytes) override {
    DeviceScope scope(ordinal_);
    if (!scope.ok()) return nullptr;
    void* p = nullptr;
    if (cudaMalloc(&p, static_cast<size_t>(bytes)) != cudaSuccess) {
      cudaGetLastError();  // Out of memory is not sticky; clear it for later calls.
      return nullptr;
    }
    return p;
  }

  void Free(void* ptr) override {
    DeviceScope scope(ordinal_);
    cudaFree(ptr);
  }

 private:
  class DeviceScope {
   public:
    explicit DeviceScope(int ordinal) {
      if (cudaGetDevice(&previous_) != cudaSuccess) {
        cudaGetLastError();
        previous_ = -1;
      }
      ok_ = previous_ == ordinal || cudaSetDevice(ordinal) == cudaSuccess;
      if (!ok_) cudaGetLastError();
    }
    ~DeviceScope() {
      int now = -1;
      if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
        cudaSetDevice(previous_);
      }
    }
    bool ok() const { return ok_; }

   private:
    int previous_ = -1;
    bool ok_ = false;
  };

  const int ordinal_;
};

}  // namespace

CudaAllocator::CudaAllocator(int ordinal, int64_t budget_bytes)
    : CachingAllocator(std::make_unique<CudaDeviceMemory>(ordinal), absl::StrCat("cuda:", ordinal),
                       budget_bytes),
      ordinal_(ordinal) {}
#endif  // TANDEM_HAVE_CUDA

}  // namespace tandem::cuda
