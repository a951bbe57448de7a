// Core: the allocator's accounting and budget, buffers, counter-based randomness,
// the thread pool, OpenMP teams on threads of their own.
#include <omp.h>

#include <atomic>
#include <set>

#include "gtest/gtest.h"
#include "runtime/core/allocator.h"
#include "runtime/core/omp_threads.h"
#include "runtime/core/random.h"
#include "runtime/core/shape.h"
#include "runtime/core/thread_pool.h"

namespace tandem {
namespace {

TEST(AllocatorTest, AccountsByCategoryAndTracksThePeak) {
  HostAllocator allocator;
  {
    Buffer a = *Buffer::Allocate(&allocator, 1000, MemoryCategory::kParameters);
    Buffer b = *Buffer::Allocate(&allocator, 500, MemoryCategory::kActivations);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % kAllocationAlignment, 0u);
    const MemoryStats s = allocator.stats();
    EXPECT_EQ(s.in_use(MemoryCategory::kParameters), 1000);
    EXPECT_EQ(s.in_use(MemoryCategory::kActivations), 500);
    EXPECT_EQ(s.total_in_use_bytes, 1500);
  }
  const MemoryStats s = allocator.stats();
  EXPECT_EQ(s.total_in_use_bytes, 0);
  EXPECT_EQ(s.peak_total_bytes, 1500);
  allocator.ResetPeak();
  EXPECT_EQ(allocator.stats().peak_total_bytes, 0);
}

TEST(AllocatorTest, BudgetRefusesWithTheAccounting) {
  HostAllocator allocator(/*budget_bytes=*/4096);
  Buffer a = *Buffer::Allocate(&allocator, 3000, MemoryCategory::kGradients);
  absl::StatusOr<Buffer> b = Buffer::Allocate(&allocator, 2000, MemoryCategory::kWorkspace);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("workspace"), std::string::npos) << b.status();
  EXPECT_NE(b.status().message().find("gradients 2.9 KiB"), std::string::npos) << b.status();
  EXPECT_EQ(allocator.stats().refusals, 1);
  // What was refused is not counted.
  EXPECT_EQ(allocator.stats().total_in_use_bytes, 3000);
}

TEST(AllocatorTest, ConcurrentAllocationsNeverOvershootTheBudget) {
  HostAllocator allocator(/*budget_bytes=*/100 * 1024);
  std::atomic<int> refused{0};
  {
    ThreadPool pool(4, "alloc");
    for (int t = 0; t < 4; ++t) {
      pool.Schedule([&] {
        for (int i = 0; i < 200; ++i) {
          absl::StatusOr<Buffer> b =
              Buffer::Allocate(&allocator, 30 * 1024, MemoryCategory::kActivations);
          if (!b.ok()) ++refused;
        }
      });
    }
  }
  EXPECT_LE(allocator.stats().peak_total_bytes, 100 * 1024);
  EXPECT_EQ(allocator.stats().total_in_use_bytes, 0);
}

TEST(RandomTest, CounterBasedValuesArePureFunctions) {
  EXPECT_EQ(UniformAt(1, 2, 3), UniformAt(1, 2, 3));
  EXPECT_NE(UniformAt(1, 2, 3), UniformAt(1, 2, 4));
  EXPECT_NE(UniformAt(1, 2, 3), UniformAt(1, 3, 3));
  std::vector<float> a(1001), b(1001);
  FillNormal(a.data(), a.size(), 0, 1, 5, 6);
  FillNormal(b.data(), b.size(), 0, 1, 5, 6);
  EXPECT_EQ(a, b);
  double mean = 0, var = 0;
  for (float v : a) mean += v / a.size();
  for (float v : a) var += (v - mean) * (v - mean) / a.size();
  EXPECT_NEAR(mean, 0, 0.1);
  EXPECT_NEAR(var, 1, 0.15);
}

TEST(RandomTest, PermutationIsAPermutationAndDependsOnTheSeed) {
  std::vector<int64_t> p = Permutation(1000, 1, 1);
  EXPECT_EQ(std::set<int64_t>(p.begin(), p.end()).size(), 1000u);
  EXPECT_NE(p, Permutation(1000, 2, 1));
  EXPECT_EQ(p, Permutation(1000, 1, 1));
}

TEST(ThreadPoolTest, RunsEveryTaskAndWaitsForIdle) {
  ThreadPool pool(2, "test");
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i) pool.Schedule([&] { ++done; });
  pool.WaitIdle();
  EXPECT_EQ(done.load(), 100);
}

TEST(ShapeTest, BatchAndElements) {
  const Shape s({28, 28, 1});
  EXPECT_EQ(s.elements(), 784);
  EXPECT_EQ(s.WithBatch(128), Shape({128, 28, 28, 1}));
  EXPECT_EQ(s.WithBatch(4).WithoutBatch(), s);
  EXPECT_EQ(s.ToString(), "[28, 28, 1]");
}

// A parallel region leaves its workers docked on the thread that ran it;
// RunOnOwnOmpThread's leave with its thread. The second half shows the count
// sees a docked worker, so the first half can fail.
TEST(OmpThreadsTest, OwnThreadLeavesNoDockedWorkers) {
  const int before = ProcessThreadCount();
  ASSERT_GT(before, 0);
  int team = 0;
  RunOnOwnOmpThread(2, [&] {
#pragma omp parallel
    {
#pragma omp single
      team = omp_get_num_threads();
    }
  });
  EXPECT_EQ(team, 2);
  EXPECT_EQ(ProcessThreadCountOnceAt(before), before);

  omp_set_num_threads(2);
#pragma omp parallel
  {
#pragma omp single
    team = omp_get_num_threads();
  }
  EXPECT_EQ(team, 2);
  EXPECT_EQ(ProcessThreadCountOnceAt(before + 1), before + 1);
}

}  // namespace
}  // namespace tandem
