// Device memory for the CUDA backend: a caching allocator with the byte
// accounting and hard budget every Tandem allocator shares (core/allocator.h).
//
// cudaMalloc and cudaFree are slow (cudaFree synchronises the device), and a
// training step allocates and frees the same activation and workspace sizes every
// iteration. CachingAllocator keeps freed blocks in per-size-class free lists and
// hands them out again; the device is asked for memory only on a miss. The
// budget is charged by AccountingAllocator on the *requested* bytes, exactly as on
// the host, so a plan's memory figure means the same on every device; the cache's
// own footprint (rounding, cached free blocks) is reported by cache_stats().
//
// When a miss would take the device footprint over the budget, or the device
// refuses, the cache is emptied first and the request retried once; only then is
// the allocation refused (RESOURCE_EXHAUSTED, by AccountingAllocator).
//
// Stream semantics: a freed block may be handed out again at once. That is safe
// for work queued on one stream (the compute stream of a CudaContext), because
// the stream orders the old user's kernels before the new user's. Memory used
// on another stream (a copy stream) must be freed only after that stream's work
// is known complete (an event the compute stream waited on, or a sync).
//
// The device-independent part (size classes, free lists, accounting) runs on a
// DeviceMemory interface, so tests drive it with a fake device and no GPU.
// Everything here is thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_ALLOCATOR_H_
#define TANDEM_RUNTIME_CUDA_ALLOCATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "runtime/core/allocator.h"

namespace tandem::cuda {

// Raw memory of one device, without caching or accounting: the seam that tests
// replace with a fake.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `bytes` of device memory aligned to at least 256 bytes, or null when the
  // device has none left.
  virtual void* Malloc(int64_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
};

// The size class a request of `bytes` (> 0) is served from: at least 512 bytes;
// rounded up to 1/8 of the request's power of two (so at most 12.5% is wasted),
// and to at most 2 MiB for large requests.
int64_t SizeClassBytes(int64_t bytes);

struct CacheStats {
  // Device memory held by the allocator: blocks in use (at their class size) plus
  // cached free blocks.
  int64_t reserved_bytes = 0;
  int64_t cached_bytes = 0;
  // Requests served from the cache, and from the device.
  int64_t hits = 0;
  int64_t misses = 0;
  // Blocks returned to the device by EmptyCache (explicit or on pressure).
  int64_t released_blocks = 0;
  // Device allocations that failed (each is retried once after emptying the cache).
  int64_t device_failures = 0;
};

class CachingAllocator : public AccountingAllocator {
 public:
  CachingAllocator(std::unique_ptr<DeviceMemory> memory, std::string device_id,
                   int64_t budget_bytes);
  // Returns the cached blocks to the device. Blocks still in use at destruction
  // are leaked (their owners would otherwise free into a dead allocator).
  ~CachingAllocator() override;

  // Returns every cached (free) block to the device.
  void EmptyCache();
  CacheStats cache_stats() const;

 protected:
  void* RawAllocate(int64_t bytes) override;
  void RawFree(void* ptr, int64_t bytes) override;

 private:
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<DeviceMemory> memory_;
  mutable absl::Mutex mu_;
  // Free blocks by class size; reused last-in first-out (the warmest first).
  absl::flat_hash_map<int64_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);
  // Blocks handed out, with their class size.
  absl::flat_hash_map<void*, int64_t> live_ ABSL_GUARDED_BY(mu_);
  CacheStats cache_ ABSL_GUARDED_BY(mu_);
};

#ifdef TANDEM_HAVE_CUDA
// Device memory of CUDA device `ordinal` from cudaMalloc, cached; device_id
// "cuda:<ordinal>". Construction touches no device: a missing device shows up as
// refused allocations.
class CudaAllocator final : public CachingAllocator {
 public:
  explicit CudaAllocator(int ordinal, int64_t budget_bytes = 0);
  int ordinal() const { return ordinal_; }

 private:
  const int ordinal_;
};
#endif  // TANDEM_HAVE_CUDA

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_ALLOCATOR_H_
