#include "planner/chain_evaluator.h"

#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/random_chains.h"

namespace tandem::planner {
namespace {

using testing::RandomChain;
using testing::RandomResidentChain;
using testing::WithUpdates;

// Every other chain clips its gradients.
TEST(ChainEvaluatorTest, AgreesWithTheSimulatorExactly) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 600; ++trial) {
    const int layers = 1 + trial % 9;
    RandomChain inst = RandomResidentChain(layers, &rng);
    inst.cost.set_clips_gradients(trial % 2 == 1);
    std::vector<bool> acc(layers);
    for (int l = 0; l < layers; ++l) acc[l] = (rng() & 1) != 0;
    ASSERT_TRUE(ChainEvaluator::Supports(inst.cost, inst.base));
    ChainEvaluator evaluator(inst.cost, inst.base);
    const PlacementScore fast = evaluator.Score(acc, /*need_peak=*/true);
    PlanSimulator sim(inst.cost);
    absl::StatusOr<SimulationResult> exact = sim.Simulate(WithUpdates(inst.base, acc));
    ASSERT_TRUE(exact.ok()) << exact.status();
    ASSERT_EQ(fast.iteration_seconds, exact->prediction.iteration_seconds()) << "trial " << trial;
    ASSERT_EQ(fast.accelerator_peak_bytes, exact->prediction.accelerator_peak_bytes())
        << "trial " << trial;
    // Without the peak, the closed form (or the same run with DPU).
    const double quick = evaluator.Score(acc, /*need_peak=*/false).iteration_seconds;
    ASSERT_NEAR(quick, exact->prediction.iteration_seconds(),
                1e-12 * exact->prediction.iteration_seconds())
        << "trial " << trial;
  }
}

// The estimate's peak never exceeds the exact one (the search prunes with it),
// and is usually equal to it.
TEST(ChainEvaluatorTest, EstimatedPeakIsALowerBound) {
  std::mt19937 rng(8);
  int equal = 0, total = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int layers = 1 + trial % 12;
    testing::RandomChainOptions options;
    options.coarse_times = trial % 3 == 0;
    RandomChain inst = RandomResidentChain(layers, &rng, options);
    inst.cost.set_clips_gradients(trial % 2 == 1);
    ChainEvaluator evaluator(inst.cost, inst.base);
    std::vector<bool> acc(layers);
    for (int l = 0; l < layers; ++l) acc[l] = (rng() & 1) != 0;
    const int64_t bound = evaluator.Estimated(acc).peak_lower_bound_bytes;
    const int64_t exact = evaluator.Score(acc, /*need_peak=*/true).accelerator_peak_bytes;
    ASSERT_LE(bound, exact) << "trial " << trial;
    equal += bound == exact;
    ++total;
  }
  std::cout << "bound equals the exact peak in " << equal << " of " << total << "\n";
  EXPECT_GT(equal, total / 2);
}

TEST(ChainEvaluatorTest, PeakLimitSkipsExactRunsAboveIt) {
  std::mt19937 rng(9);
  RandomChain inst = RandomResidentChain(6, &rng);
  ChainEvaluator evaluator(inst.cost, inst.base);
  const std::vector<bool> none(6, false);
  const int64_t bound = evaluator.Estimated(none).peak_lower_bound_bytes;
  evaluator.set_peak_limit(bound - 1);
  EXPECT_EQ(evaluator.Score(none, /*need_peak=*/true).accelerator_peak_bytes, bound);
  EXPECT_EQ(evaluator.exact_runs(), 0);
  evaluator.set_peak_limit(INT64_MAX);
  EXPECT_GE(evaluator.Score(none, /*need_peak=*/true).accelerator_peak_bytes, bound);
  EXPECT_EQ(evaluator.exact_runs(), 1);
}

}  // namespace
}  // namespace tandem::planner
