#include "planner/update_placement.h"

#include <algorithm>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/random_chains.h"

namespace tandem::planner {
namespace {

using testing::LayersWithParameters;
using testing::PlacementProblem;
using testing::RandomChain;
using testing::RandomPlacementProblem;
using testing::RandomResidentChain;
using testing::WithUpdates;

// The best choice over all 2^E subsets of eligible layers, by the simulator.
struct Exhaustive {
  bool feasible = false;
  double iteration_seconds = 0;
  int64_t lowest_peak_bytes = INT64_MAX;
};
Exhaustive Enumerate(const RandomChain& inst, const std::vector<bool>& eligible, int64_t budget) {
  std::vector<int> e;
  for (int l = 0; l < static_cast<int>(eligible.size()); ++l) {
    if (eligible[l]) e.push_back(l);
  }
  PlanSimulator sim(inst.cost);
  SimulationOptions options;
  options.record_timeline = false;
  Exhaustive best;
  for (uint32_t mask = 0; mask < (1u << e.size()); ++mask) {
    std::vector<bool> acc(eligible.size(), false);
    for (size_t i = 0; i < e.size(); ++i) acc[e[i]] = (mask >> i) & 1;
    absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, acc), options);
    EXPECT_TRUE(r.ok());
    best.lowest_peak_bytes =
        std::min(best.lowest_peak_bytes, r->prediction.accelerator_peak_bytes());
    if (r->prediction.accelerator_peak_bytes() > budget) continue;
    if (!best.feasible || r->prediction.iteration_seconds() < best.iteration_seconds) {
      best.feasible = true;
      best.iteration_seconds = r->prediction.iteration_seconds();
    }
  }
  return best;
}

int64_t total_evaluations = 0;
int64_t total_subsets = 0;

// The production search for resident chains against exhaustive search: the
// same feasibility, never over the budget (by the simulator), never slower,
// and the exact search says it finished.
void ExpectOptimal(const PlacementProblem& p, const std::string& where) {
  const RandomChain& inst = p.chain;
  const Exhaustive truth = Enumerate(inst, p.eligible, p.budget_bytes);
  ChainEvaluator evaluator(inst.cost, inst.base);
  const PlacementSearchResult found =
      SearchChainUpdatePlacement(&evaluator, p.eligible, p.budget_bytes);
  total_evaluations += found.evaluations;
  total_subsets += int64_t{1} << std::count(p.eligible.begin(), p.eligible.end(), true);
  EXPECT_TRUE(found.proven_optimal) << where;
  ASSERT_EQ(found.feasible, truth.feasible) << where;
  if (!truth.feasible) return;
  PlanSimulator sim(inst.cost);
  absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, found.on_accelerator));
  ASSERT_TRUE(r.ok());
  EXPECT_LE(r->prediction.accelerator_peak_bytes(), p.budget_bytes) << where;
  EXPECT_EQ(r->prediction.iteration_seconds(), found.iteration_seconds) << where;
  EXPECT_LE(found.iteration_seconds, truth.iteration_seconds * (1 + 1e-9))
      << where << ": search " << found.iteration_seconds << " s, exhaustive "
      << truth.iteration_seconds << " s";
}

// From "only all-host fits" to "everything fits", and a bit outside.
PlacementProblem ProblemOf(int layers, std::mt19937* rng) {
  PlacementProblem p{RandomResidentChain(layers, rng), {}, 0};
  p.eligible = LayersWithParameters(p.chain.cost);
  ChainEvaluator evaluator(p.chain.cost, p.chain.base);
  const int64_t low =
      evaluator.Score(std::vector<bool>(layers, false), true).accelerator_peak_bytes;
  const int64_t high = evaluator.Score(p.eligible, true).accelerator_peak_bytes;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  p.budget_bytes = low + static_cast<int64_t>((high - low) * (1.2 * u(*rng) - 0.1));
  return p;
}

TEST(SearchChainUpdatePlacementTest, MatchesExhaustiveSearchOnSmallChains) {
  for (int layers = 2; layers <= 8; ++layers) {
    std::mt19937 rng(100 + layers);
    for (int trial = 0; trial < 60; ++trial) {
      ExpectOptimal(ProblemOf(layers, &rng),
                    std::to_string(layers) + " layers, trial " + std::to_string(trial));
    }
  }
  std::cout << "search evaluations: " << total_evaluations << ", exhaustive: " << total_subsets
            << "\n";
}

TEST(SearchChainUpdatePlacementTest, MatchesExhaustiveSearchAtTwelveLayers) {
  std::mt19937 rng(4242);
  for (int trial = 0; trial < 12; ++trial) {
    ExpectOptimal(ProblemOf(12, &rng), "trial " + std::to_string(trial));
  }
}

// The first 600 problems of placement_stress's stream (seed 1), and ones of
// its first 10,140 that earlier searches got wrong: a local search missed
// 1439, 4424 and 4773 by 0.25-2.6% and called 2994 infeasible; exact searches
// that bounded the period with delayed updates by the copy engines' load
// (10110, 10139) or by half the latest weight return (1215, 3002: +3%, +0.25%)
// cut the optimum, because the simulator's period can still be a transient.
TEST(SearchChainUpdatePlacementTest, MatchesExhaustiveSearchOnTheStressStream) {
  const std::vector<int> hard = {1215, 1439, 2994, 3002, 4424, 4773, 10110, 10139};
  std::mt19937 rng(1);
  for (int trial = 0; trial <= hard.back(); ++trial) {
    const PlacementProblem p = RandomPlacementProblem(trial, &rng);
    if (trial < 600 || std::find(hard.begin(), hard.end(), trial) != hard.end()) {
      ExpectOptimal(p, "stress trial " + std::to_string(trial));
    }
  }
}

TEST(SearchChainUpdatePlacementTest, InfeasibleWhenNothingFits) {
  std::mt19937 rng(3);
  RandomChain inst = RandomResidentChain(4, &rng);
  const std::vector<bool> eligible = LayersWithParameters(inst.cost);
  const int64_t lowest = Enumerate(inst, eligible, 0).lowest_peak_bytes;
  ChainEvaluator evaluator(inst.cost, inst.base);
  const PlacementSearchResult r = SearchChainUpdatePlacement(&evaluator, eligible, lowest - 1);
  EXPECT_FALSE(r.feasible);
  EXPECT_TRUE(r.proven_optimal);
  ChainEvaluator again(inst.cost, inst.base);
  EXPECT_TRUE(SearchChainUpdatePlacement(&again, eligible, lowest).feasible);
}

// The local search alone (what schedules with offload or streaming get, with
// the simulator as scorer): within the budget, and no slower than putting
// every update on the host when that fits.
TEST(SearchUpdatePlacementTest, StaysWithinTheBudgetAndBeatsAllHost) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const PlacementProblem p = RandomPlacementProblem(trial, &rng);
    PlanSimulator sim(p.chain.cost);
    const PlacementSearchResult found = SearchUpdatePlacement(
        p.eligible, p.budget_bytes, SimulatorPlacementScorer(sim, p.chain.base));
    absl::StatusOr<SimulationResult> none =
        sim.Simulate(WithUpdates(p.chain.base, std::vector<bool>(p.eligible.size(), false)));
    ASSERT_TRUE(none.ok());
    if (none->prediction.accelerator_peak_bytes() <= p.budget_bytes) {
      ASSERT_TRUE(found.feasible) << trial;
      EXPECT_LE(found.iteration_seconds, none->prediction.iteration_seconds()) << trial;
    }
    if (!found.feasible) continue;
    absl::StatusOr<SimulationResult> r =
        sim.Simulate(WithUpdates(p.chain.base, found.on_accelerator));
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->prediction.accelerator_peak_bytes(), p.budget_bytes) << trial;
  }
}

}  // namespace
}  // namespace tandem::planner
