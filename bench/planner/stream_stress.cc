// Stress for the streamed-state search (planner/state_streaming.h): random
// chains of 1 to N layers (the planner tests' generator) with a random budget,
// the two-place optimum (SearchChainUpdatePlacement, exact on these sizes)
// improved by SearchStreamedState, against ExhaustivePlaces (every
// combination of the three places under every prefetch distance and lag).
// Prints every instance where the search is slower, then totals; exits
// non-zero on a miss.
//
//   bazel run -c opt //bench/planner:stream_stress -- [INSTANCES [MAX_LAYERS [SEED [EVALUATIONS
//   [MIN_LAYERS [EXACT_EVALUATIONS [search | proved N]]]]]]]
//
// EVALUATIONS: the local search's simulations (StreamSearchOptions.
// max_evaluations); EXACT_EVALUATIONS: the branch and bound's. A seventh
// argument "search" prints the planner's answers alone; "proved N" compares
// them with the branch and bound's at N simulations where that proves its
// answer (chains too long for the exhaustive search).
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

// The planner's answer to one chain: the exact two-place answer, improved
// by the third place; where no two-place placement fits, the third place
// searched from every layer on the host as from an infinitely slow start
// (strategies.cc).
struct Answer {
  bool feasible = false, exact = false;
  double seconds = HUGE_VAL;
  std::string places;
  int64_t evaluations = 0;
};

Answer PlannerAnswer(const testing::PlacementProblem& p, const PlanSimulator& simulator,
                     const StreamSearchOptions& options) {
  ChainEvaluator evaluator(p.chain.cost, p.chain.base);
  const PlacementSearchResult two =
      SearchChainUpdatePlacement(&evaluator, p.eligible, p.budget_bytes);
  const Decisions start = testing::WithUpdates(
      p.chain.base,
      two.feasible ? two.on_accelerator : std::vector<bool>(p.eligible.size(), false));
  const double start_seconds = two.feasible ? two.iteration_seconds : HUGE_VAL;
  const StreamSearchResult r =
      SearchStreamedState(simulator, start, start_seconds, p.budget_bytes, options);
  Answer a;
  a.evaluations = r.evaluations;
  a.exact = r.exact;
  a.feasible = two.feasible || r.improved;
  if (!a.feasible) return a;
  const Decisions& d = r.improved ? r.decisions : start;
  a.seconds = r.improved ? r.simulation.prediction.iteration_seconds() : start_seconds;
  a.places = Describe(UpdatePlacesOf(d), r.improved ? d.state_prefetch_layers : 1,
                      r.improved ? d.state_update_lag : 0);
  return a;
}

struct Totals {
  int misses = 0, streamed_optima = 0, feasible = 0, wrong_feasibility = 0, exact = 0,
      exact_misses = 0;
  double worst = 0, search_seconds = 0, exhaustive_seconds = 0;
  int64_t evaluations = 0, exhaustive_evaluations = 0;
};

// Scores one trial's answer against the exhaustive optimum, printing a miss.
void Compare(uint32_t seed, int trial, int layers, const Answer& found,
             const ExhaustiveResult& truth, Totals* t) {
  if (found.feasible != truth.feasible) {
    ++t->wrong_feasibility;
    std::printf("seed %u trial %d (%d layers): search feasible=%d, exhaustive %d\n", seed, trial,
                layers, found.feasible, truth.feasible);
    return;
  }
  if (!truth.feasible) return;
  ++t->feasible;
  t->exact += found.exact;
  bool streams = false;
  for (UpdatePlace x : truth.places) streams |= x == UpdatePlace::kStreamed;
  t->streamed_optima += streams;
  const double excess = found.seconds / truth.iteration_seconds - 1;
  if (excess <= 1e-9) return;
  ++t->misses;
  t->exact_misses += found.exact;
  t->worst = std::max(t->worst, excess);
  std::printf("seed %u trial %d (%d layers): %.6g s (%s) vs optimum %.6g s (%s) (+%.3g%%)\n", seed,
              trial, layers, found.seconds, found.places.c_str(), truth.iteration_seconds,
              Describe(truth.places, truth.prefetch_layers, truth.update_lag).c_str(),
              100 * excess);
  if (found.exact) std::printf("  ... and the search called its answer exact\n");
}

// Calls visit(trial, layers, problem, simulator) for `instances` random
// chains of min_layers to max_layers layers (in turn), seeded `seed`.
template <typename Visit>
void ForEachInstance(int instances, int min_layers, int max_layers, uint32_t seed, Visit visit) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < instances; ++trial) {
    const int layers = min_layers + trial % (max_layers - min_layers + 1);
    const testing::PlacementProblem p = testing::RandomPlacementProblemOf(layers, &rng);
    const PlanSimulator simulator(p.chain.cost);
    visit(trial, layers, p, simulator);
  }
}

// PlannerAnswer, its wall time added to `*seconds`.
Answer TimedAnswer(const testing::PlacementProblem& p, const PlanSimulator& simulator,
                   const StreamSearchOptions& options, double* seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  Answer a = PlannerAnswer(p, simulator, options);
  *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return a;
}

// The planner's answers alone (no exhaustive search to compare with): how
// many it calls exact, their summed step times (lower is better between two
// builds on the same instances) and the search's cost.
int RunSearchOnly(int instances, int min_layers, int max_layers, uint32_t seed,
                  const StreamSearchOptions& options) {
  int feasible = 0, exact = 0;
  double seconds = 0, search_seconds = 0;
  int64_t evaluations = 0;
  ForEachInstance(instances, min_layers, max_layers, seed,
                  [&](int, int, const testing::PlacementProblem& p, const PlanSimulator& sim) {
                    const Answer found = TimedAnswer(p, sim, options, &search_seconds);
                    evaluations += found.evaluations;
                    if (!found.feasible) return;
                    ++feasible;
                    exact += found.exact;
                    seconds += found.seconds;
                  });
  std::printf(
      "%d instances of %d-%d layers (seed %u), search only: %d feasible, %d answers called exact, "
      "their steps summed %.6g s; search %.1f ms and %.1f simulations per instance\n",
      instances, min_layers, max_layers, seed, feasible, exact, seconds,
      1e3 * search_seconds / instances, static_cast<double>(evaluations) / instances);
  return 0;
}

// The planner's answers against the branch and bound's with `reference`
// simulations, where that proves its answer (StreamSearchResult.exact): a
// reference for chains too long for ExhaustivePlaces. Prints every instance
// where the planner is slower; exits non-zero on one.
int RunAgainstProved(int instances, int min_layers, int max_layers, uint32_t seed,
                     const StreamSearchOptions& options, int64_t reference) {
  StreamSearchOptions proving = options;
  proving.max_exact_evaluations = reference;
  int feasible = 0, proved = 0, exact = 0, misses = 0, wrong_feasibility = 0;
  double worst = 0, search_seconds = 0;
  ForEachInstance(instances, min_layers, max_layers, seed,
                  [&](int trial, int layers, const testing::PlacementProblem& p,
                      const PlanSimulator& simulator) {
                    const Answer found = TimedAnswer(p, simulator, options, &search_seconds);
                    const Answer truth = PlannerAnswer(p, simulator, proving);
                    if (found.feasible != truth.feasible && truth.exact) {
                      ++wrong_feasibility;
                      std::printf("seed %u trial %d (%d layers): planner feasible=%d, proved %d\n",
                                  seed, trial, layers, found.feasible, truth.feasible);
                      return;
                    }
                    if (!found.feasible || !truth.feasible) return;
                    ++feasible;
                    exact += found.exact;
                    if (!truth.exact) return;
                    ++proved;
                    const double excess = found.seconds / truth.seconds - 1;
                    if (excess <= 1e-9) return;
                    ++misses;
                    worst = std::max(worst, excess);
                    std::printf(
                        "seed %u trial %d (%d layers): %.6g s (%s) vs proved optimum %.6g s (%s) "
                        "(+%.3g%%)\n",
                        seed, trial, layers, found.seconds, found.places.c_str(), truth.seconds,
                        truth.places.c_str(), 100 * excess);
                  });
  std::printf(
      "%d instances of %d-%d layers (seed %u): %d feasible, %d answers called exact; %d optima "
      "proved at %lld simulations, %d of them missed (worst +%.3g%%), %d wrong feasibility; "
      "search %.1f ms per instance\n",
      instances, min_layers, max_layers, seed, feasible, exact, proved,
      static_cast<long long>(reference), misses, 100 * worst, wrong_feasibility,
      1e3 * search_seconds / instances);
  return misses + wrong_feasibility > 0 ? 1 : 0;
}

int Run(int instances, int min_layers, int max_layers, uint32_t seed,
        const StreamSearchOptions& options) {
  Totals t;
  ForEachInstance(
      instances, min_layers, max_layers, seed,
      [&](int trial, int layers, const testing::PlacementProblem& p,
          const PlanSimulator& simulator) {
        const auto t0 = std::chrono::steady_clock::now();
        const ExhaustiveResult truth = ExhaustivePlaces(simulator, p.chain.base, p.budget_bytes);
        t.exhaustive_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const Answer found = TimedAnswer(p, simulator, options, &t.search_seconds);
        t.exhaustive_evaluations += truth.evaluations;
        t.evaluations += found.evaluations;
        Compare(seed, trial, layers, found, truth, &t);
      });
  std::printf(
      "%d instances of %d-%d layers (seed %u): %d feasible, %d whose optimum streams state; %d "
      "slower than the optimum (worst +%.3g%%, %d of them called exact), %d wrong feasibility; "
      "%d answers called exact; search %.1f ms and %.1f simulations per instance, exhaustive "
      "%.1f ms and %.1f\n",
      instances, min_layers, max_layers, seed, t.feasible, t.streamed_optima, t.misses,
      100 * t.worst, t.exact_misses, t.wrong_feasibility, t.exact,
      1e3 * t.search_seconds / instances, static_cast<double>(t.evaluations) / instances,
      1e3 * t.exhaustive_seconds / instances,
      static_cast<double>(t.exhaustive_evaluations) / instances);
  return t.misses + t.wrong_feasibility > 0 ? 1 : 0;
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
  // The branch and bound's simulations on every chain; "planner" keeps the
  // planner's (StreamSearchOptions::max_exact_evaluations).
  if (argc > 6 && std::string(argv[6]) != "planner")
    options.max_exact_evaluations = std::atoll(argv[6]);
  // "search": the planner's answers alone, without the exhaustive search.
  if (argc > 7 && std::string(argv[7]) == "search") {
    return tandem::planner::RunSearchOnly(instances, min_layers, max_layers, seed, options);
  }
  // "proved N": against the branch and bound's answers at N simulations
  // where it proves them, instead of the exhaustive search.
  if (argc > 7 && std::string(argv[7]) == "proved") {
    if (argc < 9) {
      std::fprintf(stderr, "proved: give the reference's simulations (e.g. proved 1000000)\n");
      return 2;
    }
    return tandem::planner::RunAgainstProved(instances, min_layers, max_layers, seed, options,
                                             std::atoll(argv[8]));
  }
  return tandem::planner::Run(instances, min_layers, max_layers, seed, options);
}
