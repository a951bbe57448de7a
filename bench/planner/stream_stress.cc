// Stress for the streamed-state search (planner/state_streaming.h): random
// chains of 1 to N layers (the planner tests' generator) with a random budget,
// the two-place optimum (SearchChainUpdatePlacement, exact on these sizes)
// improved by SearchStreamedState, against ExhaustivePlaces (every
// combination of the three places under every prefetch distance and lag).
// Prints every instance where the search is slower, then totals; exits
// non-zero on a miss.
//
//   bazel run -c opt //bench/planner:stream_stress -- [INSTANCES [MAX_LAYERS [SEED [EVALUATIONS
//   [MIN_LAYERS [EXACT_EVALUATIONS]]]]]]
//
// EVALUATIONS: the local search's simulations (StreamSearchOptions.
// max_evaluations); EXACT_EVALUATIONS: the branch and bound's.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "planner/chain_evaluator.h"
#include "planner/state_streaming.h"
#include "planner/testing/random_chains.h"
#include "planner/update_placement.h"

namespace tandem::planner {
namespace {

// "HRS- d1 q0": each layer's place (- without parameters), the prefetch
// distance and the update lag.
std::string Describe(const std::vector<UpdatePlace>& places, int ahead, int lag) {
  std::string s;
  for (UpdatePlace p : places) s += "HRS"[static_cast<int>(p)];
  return s + " d" + std::to_string(ahead) + " q" + std::to_string(lag);
}

int Run(int instances, int min_layers, int max_layers, uint32_t seed,
        const StreamSearchOptions& options) {
  std::mt19937 rng(seed);
  int misses = 0, streamed_optima = 0, feasible = 0, wrong_feasibility = 0, exact = 0,
      exact_misses = 0;
  double worst = 0, search_seconds = 0, exhaustive_seconds = 0;
  int64_t evaluations = 0, exhaustive_evaluations = 0;
  for (int trial = 0; trial < instances; ++trial) {
    const int layers = min_layers + trial % (max_layers - min_layers + 1);
    testing::PlacementProblem p = testing::RandomPlacementProblemOf(layers, &rng);
    const PlanSimulator simulator(p.chain.cost);
    auto t0 = std::chrono::steady_clock::now();
    const ExhaustiveResult truth = ExhaustivePlaces(simulator, p.chain.base, p.budget_bytes);
    auto t1 = std::chrono::steady_clock::now();
    exhaustive_seconds += std::chrono::duration<double>(t1 - t0).count();
    exhaustive_evaluations += truth.evaluations;
    // The planner's path: the exact two-place answer, then the third place.
    ChainEvaluator evaluator(p.chain.cost, p.chain.base);
    const PlacementSearchResult two =
        SearchChainUpdatePlacement(&evaluator, p.eligible, p.budget_bytes);
    double found = HUGE_VAL;
    bool found_feasible = false, found_exact = false;
    std::string found_places;
    if (two.feasible) {
      const Decisions start = testing::WithUpdates(p.chain.base, two.on_accelerator);
      const StreamSearchResult r =
          SearchStreamedState(simulator, start, two.iteration_seconds, p.budget_bytes, options);
      evaluations += r.evaluations;
      found_exact = r.exact;
      found = r.improved ? r.simulation.prediction.iteration_seconds() : two.iteration_seconds;
      found_places = Describe(UpdatePlacesOf(r.improved ? r.decisions : start),
                              r.improved ? r.decisions.state_prefetch_layers : 1,
                              r.improved ? r.decisions.state_update_lag : 0);
      found_feasible = true;
    } else {
      // No two-place placement fits: the planner searches the third place
      // from every layer on the host, as from an infinitely slow start.
      const Decisions start =
          testing::WithUpdates(p.chain.base, std::vector<bool>(p.eligible.size(), false));
      const StreamSearchResult r =
          SearchStreamedState(simulator, start, HUGE_VAL, p.budget_bytes, options);
      evaluations += r.evaluations;
      found_exact = r.exact;
      found_feasible = r.improved;
      if (r.improved) {
        found = r.simulation.prediction.iteration_seconds();
        found_places = Describe(UpdatePlacesOf(r.decisions), r.decisions.state_prefetch_layers,
                                r.decisions.state_update_lag);
      }
    }
    search_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    if (found_feasible != truth.feasible) {
      ++wrong_feasibility;
      std::printf("seed %u trial %d (%d layers): search feasible=%d, exhaustive %d\n", seed, trial,
                  layers, found_feasible, truth.feasible);
      continue;
    }
    if (!truth.feasible) continue;
    ++feasible;
    exact += found_exact;
    bool streams = false;
    for (UpdatePlace x : truth.places) streams |= x == UpdatePlace::kStreamed;
    streamed_optima += streams;
    const double excess = found / truth.iteration_seconds - 1;
    if (excess > 1e-9) {
      ++misses;
      exact_misses += found_exact;
      worst = std::max(worst, excess);
      std::printf("seed %u trial %d (%d layers): %.6g s (%s) vs optimum %.6g s (%s) (+%.3g%%)\n",
                  seed, trial, layers, found, found_places.c_str(), truth.iteration_seconds,
                  Describe(truth.places, truth.prefetch_layers, truth.update_lag).c_str(),
                  100 * excess);
      if (found_exact) std::printf("  ... and the search called its answer exact\n");
    }
  }
  std::printf(
      "%d instances of %d-%d layers (seed %u): %d feasible, %d whose optimum streams state; %d "
      "slower than the optimum (worst +%.3g%%, %d of them called exact), %d wrong feasibility; "
      "%d answers called exact; search %.1f ms and %.1f simulations per instance, exhaustive "
      "%.1f ms and %.1f\n",
      instances, min_layers, max_layers, seed, feasible, streamed_optima, misses, 100 * worst,
      exact_misses, wrong_feasibility, exact, 1e3 * search_seconds / instances,
      static_cast<double>(evaluations) / instances, 1e3 * exhaustive_seconds / instances,
      static_cast<double>(exhaustive_evaluations) / instances);
  return misses + wrong_feasibility > 0 ? 1 : 0;
}

}  // namespace
}  // namespace tandem::planner

int main(int argc, char** argv) {
  const int instances = argc > 1 ? std::atoi(argv[1]) : 200;
  const int max_layers = argc > 2 ? std::atoi(argv[2]) : 8;
  const uint32_t seed = argc > 3 ? static_cast<uint32_t>(std::atoll(argv[3])) : 1;
  tandem::planner::StreamSearchOptions options;
  if (argc > 4) options.max_evaluations = std::atoll(argv[4]);
  const int min_layers = argc > 5 ? std::atoi(argv[5]) : 1;
  // The branch and bound's simulations on every chain (the planner's: 2,000,
  // and 20,000 on chains of up to 8 movable layers).
  if (argc > 6)
    options.max_exact_evaluations = options.small_exact_evaluations = std::atoll(argv[6]);
  return tandem::planner::Run(instances, min_layers, max_layers, seed, options);
}
