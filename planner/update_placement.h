// The reuse_distance decision: which layers update on the accelerator (their
// optimizer state moves there) and which on the host, minimising the
// iteration time under the accelerator memory budget (docs/planning.md, "Reuse
// distance"; CoTrain's fine-grained scheme).
//
// Two solvers share one local search:
//
// SearchChainUpdatePlacement, for schedules ChainEvaluator supports (resident
// weights, activations kept or recomputed: most plans). Steps 1-3 below give a
// start; the exact search (exact_placement.h) runs from it; when that search
// finishes its answer is optimal and is returned, otherwise steps 4-5 improve
// on the best placement known. On random chains of up to 12 layers the exact
// search has always finished (bench/planner/placement_stress: 100,000 random
// instances, none slower than exhaustive search, ~25 nodes each; a test holds
// 600 of them and the ones earlier searches got wrong); on long chains it
// stops at its limit and the local search decides, which the result reports.
//
// SearchUpdatePlacement, for any PlacementScorer (the simulator itself, for
// schedules that offload activations or stream weights): steps 1-5.
//
//   1. order the eligible layers by reuse distance (ascending: layer 0 first,
//      since RD(l) = sum_{k<l} (fwd(k) + bwd(k)) + boundary grows along the
//      chain);
//   2. for runs of that order from either end (the shortest reuse distances,
//      CoTrain's choice; and the head of the host update queue, whose removal
//      lets every later host update start earlier), binary-search the longest
//      run that fits the budget, then the fastest run below it (integer
//      ternary search on the unimodal time, then neighbours);
//   3. greedy fill after the shortest-reuse-distance run: later layers join
//      when they fit and shorten the iteration; the start is the fastest of
//      that, the queue-head run and nothing on the accelerator (or, when even
//      that exceeds the budget, the single window layer on the accelerator
//      with the lowest peak);
//   4. steepest descent over single flips of layers within kWindow of either
//      run's boundary, and at a local optimum the first improving pair flip
//      (add two, drop two, swap), until neither improves;
//   5. kicks: flip one (then two) window layers of the best answer and
//      descend again without flipping the first back, keeping what improves,
//      while the evaluations spent are below options.max_kick_evaluations and
//      options.kick_layer_evaluations / layers.
// Iteration times are compared first; the costlier memory peak is computed
// only for a move about to be taken, at most fit_checks_per_step times per
// step.
#ifndef TANDEM_PLANNER_UPDATE_PLACEMENT_H_
#define TANDEM_PLANNER_UPDATE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "planner/chain_evaluator.h"
#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "planner/simulator.h"

namespace tandem::planner {

// Scores "these layers update on the accelerator" (true) or the host.
using PlacementScorer =
    std::function<PlacementScore(const std::vector<bool>& on_accelerator, bool need_peak)>;

// Layers whose update place the searches choose: those with parameters and
// resident weights (a streamed layer's master weights live on the host, so it
// updates there).
std::vector<bool> UpdateEligibleLayers(const CostModel& cost, const Decisions& decisions);

// Scores with PlanSimulator (any schedule): `base` with the update placements
// replaced; layers not eligible keep theirs.
PlacementScorer SimulatorPlacementScorer(const PlanSimulator& simulator, const Decisions& base);

struct PlacementSearchResult {
  bool feasible = false;
  std::vector<bool> on_accelerator;
  double iteration_seconds = 0;
  int64_t accelerator_peak_bytes = 0;
  int64_t evaluations = 0;
  // The exact search finished: no placement within the budget is faster.
  bool proven_optimal = false;
  // Nodes the exact search visited, and its work (exact_placement.h).
  int64_t search_nodes = 0;
  int64_t search_work = 0;
};

struct PlacementSearchOptions {
  // Descents stop taking moves past this many evaluations in all.
  int64_t max_evaluations = 100000;
  // Kicks start only below this many evaluations, and below
  // kick_layer_evaluations / layers (evaluations cost O(layers)).
  int64_t max_kick_evaluations = 4000;
  int64_t kick_layer_evaluations = 200000;
  // Memory checks per descent step (single flips, then pair flips) before
  // the step gives up: under a binding budget most faster moves do not fit,
  // and each check simulates memory.
  int fit_checks_per_step = 6;
  // SearchChainUpdatePlacement's exact search stops after this many nodes or
  // this much work (exact_placement.h), whichever comes first; the largest
  // work seen on the 12-layer stress instances is ~2^17.5.
  int64_t max_exact_nodes = 1 << 14;
  int64_t max_exact_work = 1 << 18;
};

// Layers with eligible[l] false always update on the host. Infeasible when
// neither "all on the host" nor any single window layer on the accelerator
// fits `budget_bytes`.
PlacementSearchResult SearchUpdatePlacement(const std::vector<bool>& eligible, int64_t budget_bytes,
                                            const PlacementScorer& score,
                                            const PlacementSearchOptions& options = {});

// For a schedule ChainEvaluator supports (above). Infeasible only when the
// exact search proves that nothing fits, or stops having found nothing while
// steps 1-3 found nothing either.
PlacementSearchResult SearchChainUpdatePlacement(ChainEvaluator* evaluator,
                                                 const std::vector<bool>& eligible,
                                                 int64_t budget_bytes,
                                                 const PlacementSearchOptions& options = {});

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_UPDATE_PLACEMENT_H_
