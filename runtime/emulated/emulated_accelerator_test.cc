#include "runtime/emulated/emulated_accelerator.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/clock.h"

namespace tandem {
namespace {

TEST(ArenaAllocatorTest, HardCapacityAndReuseAfterFree) {
  EmulatedAccelerator device({.capacity_bytes = 1 << 20});
  Allocator* a = device.allocator();
  Buffer x = *Buffer::Allocate(a, 600 << 10, MemoryCategory::kParameters);
  absl::StatusOr<Buffer> y = Buffer::Allocate(a, 600 << 10, MemoryCategory::kActivations);
  ASSERT_FALSE(y.ok());
  EXPECT_EQ(y.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(y.status().message().find("emulated:0"), std::string::npos) << y.status();
  x.Reset();
  EXPECT_TRUE(Buffer::Allocate(a, 600 << 10, MemoryCategory::kActivations).ok());
}

TEST(ArenaAllocatorTest, RandomChurnCoalescesAndNeverOverlaps) {
  ArenaAllocator arena("emulated:0", 8 << 20, 8 << 20);
  std::mt19937 rng(5);
  std::vector<std::pair<char*, int64_t>> live;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const int64_t bytes = 64 + rng() % (64 << 10);
      absl::StatusOr<void*> p = arena.Allocate(bytes, MemoryCategory::kWorkspace);
      if (!p.ok()) continue;
      ASSERT_TRUE(arena.Contains(*p, bytes));
      std::memset(*p, i & 0xff, bytes);
      for (auto& [q, n] : live) {
        ASSERT_TRUE(static_cast<char*>(*p) + bytes <= q || q + n <= static_cast<char*>(*p));
      }
      live.emplace_back(static_cast<char*>(*p), bytes);
    } else {
      const size_t k = rng() % live.size();
      arena.Free(live[k].first, live[k].second, MemoryCategory::kWorkspace);
      live.erase(live.begin() + k);
    }
  }
  for (auto& [p, n] : live) arena.Free(p, n, MemoryCategory::kWorkspace);
  // Everything coalesced back: the whole region is one block again.
  EXPECT_TRUE(arena.Allocate(8 << 20, MemoryCategory::kWorkspace).ok());
}

TEST(EmulatedAcceleratorTest, CopiesHonourTheBandwidthCap) {
  EmulatedAccelerator device({.capacity_bytes = 64 << 20, .link_bytes_per_second = 100e6});
  Buffer d = *Buffer::Allocate(device.allocator(), 10 << 20, MemoryCategory::kParameters);
  std::vector<char> host(10 << 20, 7), back(10 << 20, 0);
  const double start = WallSeconds();
  ASSERT_TRUE(device.CopyToDevice(d.data(), host.data(), host.size()).ok());
  ASSERT_TRUE(device.CopyToHost(back.data(), d.data(), back.size()).ok());
  const double seconds = WallSeconds() - start;
  EXPECT_GE(seconds, 2 * 0.104);  // 10 MiB at 100 MB/s, twice
  EXPECT_EQ(host, back);
}

TEST(EmulatedAcceleratorTest, RefusesHostPointersAsDevicePointers) {
  EmulatedAccelerator device({.capacity_bytes = 1 << 20});
  std::vector<char> a(100), b(100);
  EXPECT_EQ(device.CopyToDevice(a.data(), b.data(), 100).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tandem
