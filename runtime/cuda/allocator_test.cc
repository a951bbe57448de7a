// The caching allocator on a fake device (runs everywhere), and on a real one
// (skipped without a GPU).
#include "runtime/cuda/allocator.h"

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"

namespace tandem::cuda {
namespace {

// Host memory standing in for a device with `capacity_bytes`; counts calls.
class FakeDeviceMemory final : public DeviceMemory {
 public:
  struct Counters {
    int64_t mallocs = 0, frees = 0, in_use_bytes = 0, peak_bytes = 0;
  };

  explicit FakeDeviceMemory(int64_t capacity_bytes, Counters* counters)
      : capacity_(capacity_bytes), counters_(counters) {}

  void* Malloc(int64_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (counters_->in_use_bytes + bytes > capacity_) return nullptr;
    void* p = std::aligned_alloc(256, static_cast<size_t>(bytes));
    sizes_[p] = bytes;
    ++counters_->mallocs;
    counters_->in_use_bytes += bytes;
    counters_->peak_bytes = std::max(counters_->peak_bytes, counters_->in_use_bytes);
    return p;
  }

  void Free(void* ptr) override {
    absl::MutexLock lock(&mu_);
    counters_->in_use_bytes -= sizes_[ptr];
    sizes_.erase(ptr);
    ++counters_->frees;
    std::free(ptr);
  }

 private:
  absl::Mutex mu_;
  const int64_t capacity_;
  Counters* counters_;
  absl::flat_hash_map<void*, int64_t> sizes_;
};

std::unique_ptr<CachingAllocator> MakeAllocator(int64_t capacity, int64_t budget,
                                                FakeDeviceMemory::Counters* counters) {
  return std::make_unique<CachingAllocator>(std::make_unique<FakeDeviceMemory>(capacity, counters),
                                            "fake:0", budget);
}

TEST(SizeClassTest, RoundsUpByAtMostAnEighthAndTwoMiB) {
  EXPECT_EQ(SizeClassBytes(1), 512);
  EXPECT_EQ(SizeClassBytes(512), 512);
  EXPECT_EQ(SizeClassBytes(513), 1024);
  EXPECT_EQ(SizeClassBytes(4096), 4096);
  EXPECT_EQ(SizeClassBytes(4097), 4608);
  EXPECT_EQ(SizeClassBytes((1 << 20) + 1), (1 << 20) + (128 << 10));
  EXPECT_EQ(SizeClassBytes(int64_t{100} << 20), int64_t{100} << 20);
  EXPECT_EQ(SizeClassBytes((int64_t{100} << 20) + 1), int64_t{102} << 20);
  for (int64_t bytes = 1; bytes < (int64_t{1} << 34); bytes = bytes * 3 / 2 + 7) {
    const int64_t size = SizeClassBytes(bytes);
    EXPECT_GE(size, bytes);
    EXPECT_EQ(size % 512, 0) << bytes;
    EXPECT_LE(size - bytes, std::max<int64_t>(511, std::min<int64_t>(bytes / 8, 2 << 20))) << bytes;
  }
}

TEST(CachingAllocatorTest, ReusesAFreedBlockOfTheSameClass) {
  FakeDeviceMemory::Counters device;
  auto allocator = MakeAllocator(1 << 30, 0, &device);
  void* a = *allocator->Allocate(1000, MemoryCategory::kActivations);
  allocator->Free(a, 1000, MemoryCategory::kActivations);
  void* b = *allocator->Allocate(900, MemoryCategory::kWorkspace);  // Same 1 KiB class.
  EXPECT_EQ(a, b);
  EXPECT_EQ(device.mallocs, 1);
  void* c = *allocator->Allocate(5000, MemoryCategory::kWorkspace);  // Another class: a miss.
  EXPECT_NE(c, b);
  EXPECT_EQ(device.mallocs, 2);
  const CacheStats s = allocator->cache_stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.reserved_bytes, 1024 + SizeClassBytes(5000));
  // Accounting is by requested bytes, as on the host.
  EXPECT_EQ(allocator->stats().total_in_use_bytes, 900 + 5000);
  allocator->Free(b, 900, MemoryCategory::kWorkspace);
  allocator->Free(c, 5000, MemoryCategory::kWorkspace);
  EXPECT_EQ(allocator->cache_stats().cached_bytes, allocator->cache_stats().reserved_bytes);
  allocator->EmptyCache();
  EXPECT_EQ(allocator->cache_stats().reserved_bytes, 0);
  EXPECT_EQ(device.in_use_bytes, 0);
  EXPECT_EQ(device.frees, 2);
}

TEST(CachingAllocatorTest, BudgetBehavesExactlyLikeTheHostAllocator) {
  FakeDeviceMemory::Counters device;
  auto cached = MakeAllocator(1 << 30, 4096, &device);
  HostAllocator host(4096);
  for (Allocator* allocator :
       {static_cast<Allocator*>(cached.get()), static_cast<Allocator*>(&host)}) {
    void* a = *allocator->Allocate(3000, MemoryCategory::kGradients);
    absl::StatusOr<void*> b = allocator->Allocate(2000, MemoryCategory::kWorkspace);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(b.status().message().find("workspace"), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("gradients 2.9 KiB"), std::string::npos) << b.status();
    void* c = *allocator->Allocate(1096, MemoryCategory::kWorkspace);  // Exactly the budget.
    allocator->Free(c, 1096, MemoryCategory::kWorkspace);
    allocator->Free(a, 3000, MemoryCategory::kGradients);
  }
  const MemoryStats s1 = cached->stats(), s2 = host.stats();
  EXPECT_EQ(s1.total_in_use_bytes, s2.total_in_use_bytes);
  EXPECT_EQ(s1.peak_total_bytes, s2.peak_total_bytes);
  EXPECT_EQ(s1.peak_bytes, s2.peak_bytes);
  EXPECT_EQ(s1.allocations, s2.allocations);
  EXPECT_EQ(s1.refusals, s2.refusals);
  EXPECT_EQ(s1.refusals, 1);
}

TEST(CachingAllocatorTest, EmptiesTheCacheAndRetriesWhenTheDeviceRefuses) {
  FakeDeviceMemory::Counters device;
  auto allocator = MakeAllocator(/*capacity=*/10 * 1024, /*budget=*/0, &device);
  void* a = *allocator->Allocate(4096, MemoryCategory::kActivations);
  void* b = *allocator->Allocate(4096, MemoryCategory::kActivations);
  allocator->Free(a, 4096, MemoryCategory::kActivations);
  allocator->Free(b, 4096, MemoryCategory::kActivations);
  // 8 KiB cached on a 10 KiB device: a new 6 KiB class only fits after emptying.
  absl::StatusOr<void*> c = allocator->Allocate(6000, MemoryCategory::kActivations);
  ASSERT_TRUE(c.ok()) << c.status();
  const CacheStats s = allocator->cache_stats();
  EXPECT_EQ(s.device_failures, 1);
  EXPECT_EQ(s.released_blocks, 2);
  EXPECT_EQ(s.cached_bytes, 0);
  allocator->Free(*c, 6000, MemoryCategory::kActivations);
}

TEST(CachingAllocatorTest, RefusesWhatTheDeviceCannotHoldEvenAfterEmptying) {
  FakeDeviceMemory::Counters device;
  auto allocator = MakeAllocator(/*capacity=*/8 * 1024, /*budget=*/0, &device);
  void* a = *allocator->Allocate(6000, MemoryCategory::kParameters);
  absl::StatusOr<void*> b = allocator->Allocate(4000, MemoryCategory::kActivations);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("out of memory"), std::string::npos) << b.status();
  EXPECT_EQ(allocator->stats().total_in_use_bytes, 6000);
  EXPECT_EQ(allocator->stats().refusals, 1);
  EXPECT_EQ(allocator->cache_stats().device_failures, 2);
  allocator->Free(a, 6000, MemoryCategory::kParameters);
}

TEST(CachingAllocatorTest, DeviceFootprintStaysNearTheBudget) {
  FakeDeviceMemory::Counters device;
  constexpr int64_t kBudget = 1 << 20;
  auto allocator = MakeAllocator(1 << 30, kBudget, &device);
  // Sizes that change every round would grow an unbounded cache without the
  // budget-driven release.
  for (int round = 0; round < 50; ++round) {
    const int64_t bytes = 100000 + round * 3001;
    std::vector<void*> blocks;
    while (true) {
      absl::StatusOr<void*> p = allocator->Allocate(bytes, MemoryCategory::kActivations);
      if (!p.ok()) break;
      blocks.push_back(*p);
    }
    EXPECT_EQ(static_cast<int64_t>(blocks.size()), kBudget / bytes);
    for (void* p : blocks) allocator->Free(p, bytes, MemoryCategory::kActivations);
  }
  // Class rounding is at most 1/8 of each block.
  EXPECT_LE(device.peak_bytes, kBudget + kBudget / 8);
  EXPECT_GT(allocator->cache_stats().released_blocks, 0);
}

TEST(CachingAllocatorTest, ConcurrentUseKeepsTheBooksBalanced) {
  FakeDeviceMemory::Counters device;
  constexpr int64_t kBudget = 4 << 20;
  auto allocator = MakeAllocator(int64_t{1} << 30, kBudget, &device);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::pair<void*, int64_t>> held;
      for (int i = 0; i < 500; ++i) {
        const int64_t bytes = 1000 + ((i * 7919 + t * 104729) % 200000);
        absl::StatusOr<void*> p = allocator->Allocate(bytes, MemoryCategory::kActivations);
        if (p.ok()) held.push_back({*p, bytes});
        if (held.size() > 4 || !p.ok()) {
          for (auto [q, n] : held) allocator->Free(q, n, MemoryCategory::kActivations);
          held.clear();
        }
      }
      for (auto [q, n] : held) allocator->Free(q, n, MemoryCategory::kActivations);
    });
  }
  for (std::thread& t : threads) t.join();
  const MemoryStats s = allocator->stats();
  EXPECT_EQ(s.total_in_use_bytes, 0);
  EXPECT_LE(s.peak_total_bytes, kBudget);
  const CacheStats c = allocator->cache_stats();
  EXPECT_EQ(c.reserved_bytes, c.cached_bytes);
  EXPECT_EQ(c.reserved_bytes, device.in_use_bytes);
  allocator->EmptyCache();
  EXPECT_EQ(device.in_use_bytes, 0);
}

TEST(CachingAllocatorDeathTest, FreeingAnUnknownPointerAborts) {
  FakeDeviceMemory::Counters device;
  auto allocator = MakeAllocator(1 << 20, 0, &device);
  int not_from_the_allocator = 0;
  EXPECT_DEATH(allocator->Free(&not_from_the_allocator, 4, MemoryCategory::kWorkspace),
               "unknown pointer");
}

#ifdef TANDEM_HAVE_CUDA
TEST(CudaAllocatorTest, CachesDeviceBlocksUnderTheBudget) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CudaAllocator allocator(0, /*budget_bytes=*/64 << 20);
  EXPECT_EQ(allocator.device_id(), "cuda:0");
  void* a = *allocator.Allocate(10 << 20, MemoryCategory::kActivations);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kAllocationAlignment, 0u);
  allocator.Free(a, 10 << 20, MemoryCategory::kActivations);
  void* b = *allocator.Allocate(10 << 20, MemoryCategory::kActivations);
  EXPECT_EQ(a, b);
  EXPECT_EQ(allocator.cache_stats().hits, 1);
  absl::StatusOr<void*> too_big = allocator.Allocate(60 << 20, MemoryCategory::kWorkspace);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  allocator.Free(b, 10 << 20, MemoryCategory::kActivations);
  allocator.EmptyCache();
  EXPECT_EQ(allocator.cache_stats().reserved_bytes, 0);
}

TEST(CudaAllocatorTest, DeviceOutOfMemoryIsRefusedNotFatal) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CudaAllocator allocator(0);
  // More than any GPU has.
  absl::StatusOr<void*> p = allocator.Allocate(int64_t{1} << 50, MemoryCategory::kParameters);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted);
  // The allocator still works afterwards.
  void* q = *allocator.Allocate(4096, MemoryCategory::kParameters);
  allocator.Free(q, 4096, MemoryCategory::kParameters);
}
#endif  // TANDEM_HAVE_CUDA

}  // namespace
}  // namespace tandem::cuda
