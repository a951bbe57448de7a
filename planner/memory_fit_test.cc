#include "planner/memory_fit.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/testing/random_chains.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

TEST(MicroBatchSizesTest, HalvesThroughDivisors) {
  EXPECT_EQ(MicroBatchSizes(64, 0, 1024), (std::vector<int>{64, 32, 16, 8, 4, 2, 1}));
  EXPECT_EQ(MicroBatchSizes(12, 0, 1024), (std::vector<int>{12, 6, 3, 1}));
  EXPECT_EQ(MicroBatchSizes(7, 0, 1024), (std::vector<int>{7, 1}));
  EXPECT_EQ(MicroBatchSizes(12, 4, 1024), (std::vector<int>{4}));
  EXPECT_TRUE(MicroBatchSizes(12, 5, 1024).empty());
}

TEST(MicroBatchSizesTest, StopsAtTheMicroBatchBound) {
  // 65,536 samples, at most 64 micro-batches: down to 1,024, not to 1.
  EXPECT_EQ(MicroBatchSizes(65536, 0, 64),
            (std::vector<int>{65536, 32768, 16384, 8192, 4096, 2048, 1024}));
  // 12 samples, at most 5 micro-batches: 12/4 = 3 is the smallest allowed.
  EXPECT_EQ(MicroBatchSizes(12, 0, 5), (std::vector<int>{12, 6, 3}));
  EXPECT_EQ(MicroBatchSizes(12, 0, 1), (std::vector<int>{12}));
  // A fixed size past the bound is not tried.
  EXPECT_TRUE(MicroBatchSizes(65536, 1, 64).empty());
  EXPECT_EQ(MicroBatchSizes(65536, 1024, 64), (std::vector<int>{1024}));
}

TEST(MicroBatchSizesTest, TheBoundScalesWithTheLayers) {
  EXPECT_EQ(MaxMicroBatches(1), kMaxMicroBatchesPerStep);
  EXPECT_EQ(MaxMicroBatches(4096), 64);
  EXPECT_EQ(MaxMicroBatches(1 << 20), 1);
}

// The minimum is exact to the byte: Fit succeeds there and fails one byte
// below, for plans that update on the accelerator (gpu_only's choices), on
// the host (zero_offload's) and for a hetero_dp split.
TEST(MemoryFitterTest, MinimumBudgetIsTheSmallestThatFits) {
  std::mt19937 rng(17);
  for (int trial = 0; trial < 60; ++trial) {
    testing::RandomChain chain = testing::RandomResidentChain(2 + trial % 7, &rng);
    PlanSimulator simulator(chain.cost);
    Decisions base = chain.base;
    MemoryChoices choices;
    choices.recompute = true;
    switch (trial % 3) {
      case 0:
        base.strategy = tandem::v1::STRATEGY_GPU_ONLY;
        base.delayed_parameter_update = false;
        for (LayerDecisions& l : base.layers) l.update = tandem::v1::PLACEMENT_ACCELERATOR;
        break;
      case 1:
        base.strategy = tandem::v1::STRATEGY_ZERO_OFFLOAD;
        choices.offload = choices.stream = true;
        break;
      case 2:
        base.strategy = tandem::v1::STRATEGY_HETERO_DP;
        base.delayed_parameter_update = false;
        base.accelerator_batch_share = 1;
        for (LayerDecisions& l : base.layers) l.update = tandem::v1::PLACEMENT_ACCELERATOR;
        break;
    }
    for (LayerDecisions& l : base.layers) l.activation = tandem::v1::ACTIVATION_POLICY_KEEP;
    MemoryFitter fitter(simulator, base, choices, /*fixed_micro_batch_size=*/0,
                        /*host_memory_budget_bytes=*/0);
    const int64_t minimum = fitter.MinimumBudget().accelerator_bytes;
    ASSERT_GT(minimum, 0) << trial;
    const FitResult at = fitter.Fit(minimum);
    ASSERT_TRUE(at.feasible) << trial;
    EXPECT_LE(at.simulation.prediction.accelerator_peak_bytes(), minimum) << trial;
    EXPECT_FALSE(fitter.Fit(minimum - 1).feasible) << trial;
    // A fresh fitter (no cached plans) agrees.
    EXPECT_TRUE(FitToBudget(simulator, base, {minimum, 0}, choices, 0).feasible) << trial;
    EXPECT_FALSE(FitToBudget(simulator, base, {minimum - 1, 0}, choices, 0).feasible) << trial;
  }
}

// With a host budget no plan meets, no accelerator budget helps.
TEST(MemoryFitterTest, NoMinimumWhenTheHostCannotHoldAnyPlan) {
  std::mt19937 rng(18);
  testing::RandomChain chain = testing::RandomResidentChain(4, &rng);
  PlanSimulator simulator(chain.cost);
  MemoryChoices choices;
  choices.recompute = choices.offload = choices.stream = true;
  MemoryFitter fitter(simulator, chain.base, choices, 0, /*host_memory_budget_bytes=*/1);
  const MemoryFitter::Minimum minimum = fitter.MinimumBudget();
  EXPECT_EQ(minimum.accelerator_bytes, 0);
  EXPECT_GT(minimum.host_bytes, 1);
  EXPECT_FALSE(fitter.Fit(int64_t{1} << 50).feasible);
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
  Decisions s;
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
