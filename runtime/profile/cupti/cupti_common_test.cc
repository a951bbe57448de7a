// External correlation ids and the bounded activity buffer pool.
#include <cstdint>
#include <set>

#include "gtest/gtest.h"
#include "runtime/profile/cupti/activity_buffer_pool.h"
#include "runtime/profile/cupti/external_id.h"

namespace tandem::profile {
namespace {

TEST(ExternalIdTest, RoundTripsEveryLayerPhaseAndRepetition) {
  for (const PhaseKey key :
       {PhaseKey{0, Phase::kForward, 0}, PhaseKey{-1, Phase::kUpdate, 0},
        PhaseKey{4095, Phase::kBackward, 999}, PhaseKey{7, Phase::kUpdate, 1 << 30}}) {
    const uint64_t id = PackExternalId(key);
    EXPECT_NE(id, 0u);
    PhaseKey back;
    ASSERT_TRUE(UnpackExternalId(id, &back));
    EXPECT_EQ(back, key) << key.layer;
  }
  std::set<uint64_t> ids;
  for (int l = -1; l < 10; ++l) {
    for (Phase p : {Phase::kForward, Phase::kBackward, Phase::kUpdate}) {
      for (int r = 0; r < 10; ++r) ids.insert(PackExternalId({l, p, r}));
    }
  }
  EXPECT_EQ(ids.size(), 11u * 3 * 10);
}

TEST(ExternalIdTest, RejectsIdsThatAreNotOurs) {
  PhaseKey key;
  EXPECT_FALSE(UnpackExternalId(0, &key));
  EXPECT_FALSE(UnpackExternalId(12345, &key));
}

TEST(ActivityBufferPoolTest, HandsOutAFixedNumberOfAlignedBuffersThenRefuses) {
  ActivityBufferPool pool(3, 1000);
  EXPECT_EQ(pool.buffer_bytes() % ActivityBufferPool::kAlignment, 0u);
  EXPECT_GE(pool.buffer_bytes(), 1000u);
  std::set<uint8_t*> got;
  for (int i = 0; i < 3; ++i) {
    uint8_t* b = pool.Acquire();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % ActivityBufferPool::kAlignment, 0u);
    got.insert(b);
  }
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.in_use(), 3);
  // Exhausted: no growth, a counted refusal.
  EXPECT_EQ(pool.Acquire(), nullptr);
  EXPECT_EQ(pool.Acquire(), nullptr);
  EXPECT_EQ(pool.refusals(), 2);
  // A returned buffer is handed out again; foreign pointers and double
  // releases change nothing.
  uint8_t* first = *got.begin();
  pool.Release(first);
  pool.Release(first);
  uint8_t foreign[8];
  pool.Release(foreign);
  EXPECT_EQ(pool.in_use(), 2);
  EXPECT_EQ(pool.Acquire(), first);
  EXPECT_EQ(pool.Acquire(), nullptr);
  EXPECT_EQ(pool.refusals(), 3);
}

}  // namespace
}  // namespace tandem::profile
