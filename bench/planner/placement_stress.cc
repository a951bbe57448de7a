// Stress for the update-placement search: random chains of 1 to 12 layers (the
// generator of the planner's tests), a random budget from "only all-host
// fits" to "everything fits" and a bit outside, and the search's answer
// against exhaustive search over every subset of layers (scored by
// ChainEvaluator, which equals PlanSimulator to the last bit). Prints the
// instances where the search is slower than the optimum, and totals.
//
//   bazel run -c opt //bench/planner:placement_stress -- [INSTANCES [SEED]]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "planner/chain_evaluator.h"
#include "planner/testing/random_chains.h"
#include "planner/update_placement.h"

namespace tandem::planner {
namespace {

struct Best {
  bool feasible = false;
  double iteration_seconds = 0;
};

Best Exhaustive(ChainEvaluator* evaluator, const std::vector<bool>& eligible, int64_t budget) {
  std::vector<int> e;
  for (int l = 0; l < static_cast<int>(eligible.size()); ++l) {
    if (eligible[l]) e.push_back(l);
  }
  evaluator->set_peak_limit(budget);
  Best best;
  for (uint32_t mask = 0; mask < (1u << e.size()); ++mask) {
    std::vector<bool> acc(eligible.size(), false);
    for (size_t i = 0; i < e.size(); ++i) acc[e[i]] = (mask >> i) & 1;
    const PlacementScore s = evaluator->Score(acc, /*need_peak=*/true);
    if (s.accelerator_peak_bytes > budget) continue;
    if (!best.feasible || s.iteration_seconds < best.iteration_seconds) {
      best.feasible = true;
      best.iteration_seconds = s.iteration_seconds;
    }
  }
  return best;
}

int Run(int instances, uint32_t seed) {
  std::mt19937 rng(seed);
  int misses = 0, wrong_feasibility = 0, over_budget = 0, unproven = 0;
  double worst = 0, search_seconds = 0;
  int64_t evaluations = 0, exhaustive_evaluations = 0, nodes = 0, work = 0, max_work = 0;
  int64_t histogram[24] = {0};
  for (int trial = 0; trial < instances; ++trial) {
    const int layers = 1 + trial % 12;
    testing::PlacementProblem problem = testing::RandomPlacementProblem(trial, &rng);
    const testing::RandomChain& inst = problem.chain;
    const std::vector<bool>& eligible = problem.eligible;
    const int64_t budget = problem.budget_bytes;
    ChainEvaluator reference(inst.cost, inst.base);
    const Best truth = Exhaustive(&reference, eligible, budget);
    int subsets = 1;
    for (bool e : eligible) subsets *= e ? 2 : 1;
    exhaustive_evaluations += subsets;

    ChainEvaluator evaluator(inst.cost, inst.base);
    const auto start = std::chrono::steady_clock::now();
    const PlacementSearchResult found = SearchChainUpdatePlacement(&evaluator, eligible, budget);
    search_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    evaluations += found.evaluations;
    nodes += found.search_nodes;
    work += found.search_work;
    max_work = std::max(max_work, found.search_work);
    for (int b = 0; b < 24 && found.search_work >= (int64_t{1} << b); ++b) ++histogram[b];
    if (!found.proven_optimal) {
      ++unproven;
      std::printf("seed %u trial %d (%d layers): exact search stopped (%ld nodes, work %ld)\n",
                  seed, trial, layers, static_cast<long>(found.search_nodes),
                  static_cast<long>(found.search_work));
    }
    if (found.feasible != truth.feasible) {
      ++wrong_feasibility;
      std::printf("seed %u trial %d (%d layers): search says feasible=%d, exhaustive %d\n", seed,
                  trial, layers, found.feasible, truth.feasible);
      continue;
    }
    if (!truth.feasible) continue;
    if (found.accelerator_peak_bytes > budget) ++over_budget;
    const double excess = found.iteration_seconds / truth.iteration_seconds - 1;
    if (excess > 1e-9) {
      ++misses;
      worst = std::max(worst, excess);
      std::printf(
          "seed %u trial %d (%d layers, dpu %d, micro-batches %d): %.6g s vs %.6g s (+%.3g%%)\n",
          seed, trial, layers, inst.base.delayed_parameter_update, inst.base.micro_batches(),
          found.iteration_seconds, truth.iteration_seconds, 100 * excess);
    }
  }
  std::printf(
      "%d instances (seed %u): %d slower than the optimum (worst +%.3g%%), %d wrong "
      "feasibility, %d over budget, %d not proven optimal; search %.1f us and %.1f "
      "evaluations per instance on average (exhaustive: %.1f)\n",
      instances, seed, misses, 100 * worst, wrong_feasibility, over_budget, unproven,
      1e6 * search_seconds / instances, static_cast<double>(evaluations) / instances,
      static_cast<double>(exhaustive_evaluations) / instances);
  std::printf("exact search: %.1f nodes and %.1f work per instance on average, %ld at most\n",
              static_cast<double>(nodes) / instances, static_cast<double>(work) / instances,
              static_cast<long>(max_work));
  std::printf("instances whose exact search took at least 2^b work, b: count:");
  for (int b = 10; b < 24; ++b) std::printf(" %d: %ld", b, static_cast<long>(histogram[b]));
  std::printf("\n");
  return misses + wrong_feasibility + over_budget > 0 ? 1 : 0;
}

}  // namespace
}  // namespace tandem::planner

int main(int argc, char** argv) {
  const int instances = argc > 1 ? std::atoi(argv[1]) : 20000;
  const uint32_t seed = argc > 2 ? static_cast<uint32_t>(std::atoll(argv[2])) : 1;
  return tandem::planner::Run(instances, seed);
}
