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

// A pipeline's stages: one device pulls from another's memory over the peer
// link, at its cap, without touching either host link; a device without a
// peer link, or pointers outside the two devices, are refused.
TEST(EmulatedAcceleratorTest, PeerCopiesPullFromAnotherDevicesMemoryAtThePeerCap) {
  const EmulatedOptions linked{.capacity_bytes = 64 << 20, .peer_bytes_per_second = 100e6};
  EmulatedAccelerator a(linked, 0), b(linked, 1);
  EmulatedAccelerator unlinked({.capacity_bytes = 64 << 20, .peer_link = false}, 2);
  ASSERT_TRUE(b.HasPeerLink(a));
  EXPECT_FALSE(b.HasPeerLink(b));
  EXPECT_FALSE(b.HasPeerLink(unlinked));
  EXPECT_FALSE(unlinked.HasPeerLink(a));
  Buffer from = *Buffer::Allocate(a.allocator(), 10 << 20, MemoryCategory::kActivations);
  Buffer to = *Buffer::Allocate(b.allocator(), 10 << 20, MemoryCategory::kActivations);
  std::vector<char> host(10 << 20, 5), back(10 << 20, 0);
  ASSERT_TRUE(a.CopyToDevice(from.data(), host.data(), host.size()).ok());
  const double start = WallSeconds();
  ASSERT_TRUE(b.CopyFromPeer(to.data(), a, from.data(), host.size()).ok());
  EXPECT_GE(WallSeconds() - start, 0.104);  // 10 MiB at 100 MB/s
  EXPECT_EQ(b.bytes_from_peers(), 10 << 20);
  EXPECT_EQ(b.bytes_to_device() + b.bytes_to_host(), 0);
  ASSERT_TRUE(b.CopyToHost(back.data(), to.data(), back.size()).ok());
  EXPECT_EQ(host, back);
  // The source must be the peer's memory and the target this device's.
  EXPECT_EQ(b.CopyFromPeer(to.data(), a, to.data(), 100).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(b.CopyFromPeer(from.data(), a, from.data(), 100).code(), absl::StatusCode::kInternal);
  Buffer other = *Buffer::Allocate(unlinked.allocator(), 100, MemoryCategory::kActivations);
  EXPECT_EQ(b.CopyFromPeer(to.data(), unlinked, other.data(), 100).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(EmulatedAcceleratorTest, RefusesHostPointersAsDevicePointers) {
  EmulatedAccelerator device({.capacity_bytes = 1 << 20});
  std::vector<char> a(100), b(100);
  EXPECT_EQ(device.CopyToDevice(a.data(), b.data(), 100).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tandem
