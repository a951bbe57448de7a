#include "planner/update_placement.h"

#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/random_chains.h"

namespace tandem::planner {
namespace {

using testing::LayersWithParameters;
using testing::RandomChain;
using testing::RandomResidentChain;
using testing::WithUpdates;

using Instance = RandomChain;

Instance RandomInstance(int layers, std::mt19937* rng) { return RandomResidentChain(layers, rng); }

std::vector<bool> Eligible(const CostModel& cost) { return LayersWithParameters(cost); }

// The best choice over all 2^E subsets of eligible layers, by the simulator.
struct Exhaustive {
  bool feasible = false;
  double iteration_seconds = 0;
};
Exhaustive Enumerate(const Instance& inst, int64_t budget) {
  const std::vector<bool> eligible = Eligible(inst.cost);
  std::vector<int> e;
  for (int l = 0; l < static_cast<int>(eligible.size()); ++l) {
    if (eligible[l]) e.push_back(l);
  }
  PlanSimulator sim(inst.cost);
  SimulationOptions options;
  options.record_timeline = false;
  Exhaustive best;
  uint32_t best_mask = 0;
  for (uint32_t mask = 0; mask < (1u << e.size()); ++mask) {
    std::vector<bool> acc(eligible.size(), false);
    for (size_t i = 0; i < e.size(); ++i) acc[e[i]] = (mask >> i) & 1;
    absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, acc), options);
    EXPECT_TRUE(r.ok());
    if (r->prediction.accelerator_peak_bytes() > budget) continue;
    if (!best.feasible || r->prediction.iteration_seconds() < best.iteration_seconds) {
      best.feasible = true;
      best.iteration_seconds = r->prediction.iteration_seconds();
      best_mask = mask;
    }
  }
  if (getenv("DEBUG_EX")) {
    fprintf(stderr, "best mask over eligible:");
    for (size_t i = 0; i < e.size(); ++i) fprintf(stderr, " %d:%d", e[i], (best_mask >> i) & 1);
    fprintf(stderr, "\n");
  }
  return best;
}

int64_t total_evaluations = 0;

void ExpectOptimal(int layers, int instances, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < instances; ++trial) {
    Instance inst = RandomInstance(layers, &rng);
    const std::vector<bool> eligible = Eligible(inst.cost);
    ChainEvaluator evaluator(inst.cost, inst.base);
    const int64_t low =
        evaluator.Score(std::vector<bool>(layers, false), true).accelerator_peak_bytes;
    const int64_t high = evaluator.Score(eligible, true).accelerator_peak_bytes;
    // From "only all-host fits" to "everything fits", and a bit outside.
    const int64_t budget = low + static_cast<int64_t>((high - low) * (1.2 * u(rng) - 0.1));
    const Exhaustive truth = Enumerate(inst, budget);
    const PlacementSearchResult found =
        SearchUpdatePlacement(eligible, budget, [&](const std::vector<bool>& acc, bool need_peak) {
          return evaluator.Score(acc, need_peak);
        });
    ASSERT_EQ(found.feasible, truth.feasible) << "trial " << trial;
    total_evaluations += found.evaluations;
    if (!truth.feasible) continue;
    // Never above the budget, by the simulator.
    PlanSimulator sim(inst.cost);
    absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, found.on_accelerator));
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->prediction.accelerator_peak_bytes(), budget) << "trial " << trial;
    EXPECT_LE(found.iteration_seconds, truth.iteration_seconds * (1 + 1e-9))
        << "trial " << trial << ": search " << found.iteration_seconds << " s, exhaustive "
        << truth.iteration_seconds << " s";
    if (getenv("DEBUG_EX") && found.iteration_seconds > truth.iteration_seconds * (1 + 1e-9)) {
      fprintf(stderr, "found:");
      for (int l = 0; l < layers; ++l) fprintf(stderr, " %d", (int)found.on_accelerator[l]);
      fprintf(stderr, " budget %ld peak %ld dpu %d mb %d\n", (long)budget,
              (long)found.accelerator_peak_bytes, inst.base.delayed_parameter_update,
              inst.base.micro_batch_size);
      Enumerate(inst, budget);
    }
  }
}

TEST(SearchUpdatePlacementTest, MatchesExhaustiveSearchOnSmallChains) {
  for (int layers = 2; layers <= 8; ++layers) ExpectOptimal(layers, 60, 100 + layers);
  // Far fewer candidates than exhaustive search (2^L each).
  std::cout << "search evaluations: " << total_evaluations << "\n";
}

TEST(SearchUpdatePlacementTest, MatchesExhaustiveSearchAtTwelveLayers) {
  ExpectOptimal(12, 12, 4242);
}

TEST(SearchUpdatePlacementTest, InfeasibleWhenNothingFits) {
  std::mt19937 rng(3);
  Instance inst = RandomInstance(4, &rng);
  ChainEvaluator evaluator(inst.cost, inst.base);
  const int64_t low = evaluator.Score(std::vector<bool>(4, false), true).accelerator_peak_bytes;
  const PlacementSearchResult r = SearchUpdatePlacement(
      Eligible(inst.cost), low - 1, [&](const std::vector<bool>& acc, bool need_peak) {
        return evaluator.Score(acc, need_peak);
      });
  EXPECT_FALSE(r.feasible);
}

}  // namespace
}  // namespace tandem::planner
