#include "planner/memory_fit.h"

#include <vector>

#include "gtest/gtest.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(MicroBatchSizesTest, HalvesThroughDivisors) {
  EXPECT_EQ(MicroBatchSizes(64, 0), (std::vector<int>{64, 32, 16, 8, 4, 2, 1}));
  EXPECT_EQ(MicroBatchSizes(12, 0), (std::vector<int>{12, 6, 3, 1}));
  EXPECT_EQ(MicroBatchSizes(7, 0), (std::vector<int>{7, 1}));
  EXPECT_EQ(MicroBatchSizes(12, 4), (std::vector<int>{4}));
  EXPECT_TRUE(MicroBatchSizes(12, 5).empty());
}

TEST(MinimumFeasibleBudgetTest, FindsTheThresholdToOneMiB) {
  for (int64_t threshold : {int64_t{5} * kMiB + 123, int64_t{3} << 30, int64_t{77} << 30}) {
    auto feasible = [&](int64_t b) { return b >= threshold; };
    // An exact guess, a low one and a high one.
    for (int64_t guess : {threshold, threshold / 3, threshold * 5}) {
      const int64_t found = MinimumFeasibleBudget(feasible, kMiB, guess);
      EXPECT_TRUE(feasible(found)) << threshold << " " << guess;
      EXPECT_FALSE(feasible(found - kMiB)) << threshold << " " << guess;
    }
  }
  // Nothing works.
  EXPECT_EQ(MinimumFeasibleBudget([](int64_t) { return false; }, kMiB, 10 * kMiB), 0);
}

TEST(RankMemoryActionsTest, PrefersCheapSavingsAndHonoursTheChoices) {
  // Three layers: recomputing layer 1 is cheap (fast forward, big saving);
  // layer 2's forward is slow.
  std::vector<testing::SyntheticLayer> layers(3);
  for (int l = 0; l < 3; ++l) {
    layers[l].name = "l";
    layers[l].accelerator_forward_seconds = l == 2 ? 10.0 : 0.1;
    layers[l].accelerator_backward_seconds = 0.2;
    layers[l].host_forward_seconds = layers[l].host_backward_seconds = 1;
    layers[l].activation_bytes = 1000;
    layers[l].output_bytes = 10;
    layers[l].parameter_bytes = 100;
  }
  testing::SyntheticNode node;
  node.h2d_bytes_per_second = node.d2h_bytes_per_second = 10;  // Offload is hopeless.
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(layers, 1, node));
  ASSERT_TRUE(cost.ok());
  Schedule s;
  s.layers.resize(3);
  s.batch_size = s.micro_batch_size = 1;
  MemoryChoices recompute_only;
  recompute_only.recompute = true;
  std::vector<MemoryAction> actions = RankMemoryActions(*cost, s, recompute_only);
  ASSERT_EQ(actions.size(), 3u);
  for (const MemoryAction& a : actions) EXPECT_EQ(a.kind, MemoryAction::kRecompute);
  EXPECT_EQ(actions.back().layer, 2);  // The slow forward goes last.
  MemoryChoices all;
  all.recompute = all.offload = all.stream = true;
  actions = RankMemoryActions(*cost, s, all);
  for (const MemoryAction& a : actions) {
    EXPECT_NE(a.kind, MemoryAction::kOffload);  // 200 s of copies lose to recompute.
    EXPECT_NE(a.kind, MemoryAction::kStream);   // These layers update on the accelerator.
  }
}

}  // namespace
}  // namespace tandem::planner
