// The exact update-placement search: branch and bound over the layers in
// backward order (the order the gradient chain runs), for a schedule
// ChainEvaluator supports. Choosing which layers update on the accelerator
// under a memory budget contains 0/1 knapsack (budget = knapsack capacity,
// optimizer state = weights, host update time saved = values, when the host
// pool is the bottleneck), so no polynomial method is exact in general; this
// one is exact when it finishes, and stops at a work limit.
//
// A node fixes the layers L-1..l. Everything the closed-form period and the
// peak's lower bound (chain_evaluator.h) read from those layers is then known:
// the compute stream's time, the three FIFO resources' free times, the latest
// weight return, and the allocation level at each of their backward starts.
// The layers still free can only add: a host update inserts spans into
// fixed-order FIFO chains, an accelerator update lengthens the compute
// stream, and max-plus recurrences are monotone in both. So a node's bounds
// hold for every completion:
//
//   time  >= compute so far + the backward still to run, and, without
//            delayed updates, >= the latest weight return so far (the closed
//            form is the period). With delayed updates the simulator reports
//            the period once two consecutive iterations agree, which can still
//            be a transient (a copy engine's backlog growing too slowly to
//            stall yet): neither the copy engines' load nor half the latest
//            return bounds it (update_placement_test has counter-examples),
//            so only the compute stream does and the search is weaker there;
//   peak  >= resident weights + optimizer state moved so far
//            + max(the levels reached so far, the levels still to come less
//                  any waiting gradient).
//
// A job that clips its gradients (ChainEvaluator::clips_gradients) runs its
// updates after the norm, which waits for the last backward and every
// gradient's copy down: a node knows the D2H engine's time but not the host
// chains', which start at the norm. Its time bound is the backward still to
// run or the D2H engine, whichever ends later, plus the accelerator updates
// fixed so far; its peak bound adds the gradients those hold until then (at
// every later backward too); a leaf is timed by the closed form.
//
// A node is cut when its time bound is no shorter than the best plan found
// (1e-12 relative) or its peak bound exceeds the budget; children are tried
// in order of their time bound. A leaf's time is the closed form (without
// delayed updates) or an exact run; a leaf that beats the best pays one exact
// peak (ResidentChain) before it is taken.
//
// Work: one unit per node, iterations * micro-batches * layers per exact run;
// the search stops after max_nodes nodes or max_work work, whichever first.
// Thread-compatible.
#ifndef TANDEM_PLANNER_EXACT_PLACEMENT_H_
#define TANDEM_PLANNER_EXACT_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "planner/chain_evaluator.h"

namespace tandem::planner {

struct ExactPlacementResult {
  // A plan within the budget faster than the starting one was found.
  bool improved = false;
  std::vector<bool> on_accelerator;
  // The search finished: nothing within the budget is faster than the best.
  bool complete = false;
  int64_t nodes = 0;
  int64_t exact_runs = 0;
  int64_t work = 0;
};

// `start` (empty: none) is a placement known to fit the budget. Layers with
// eligible[l] false update on the host.
ExactPlacementResult SearchExactPlacement(ChainEvaluator* evaluator,
                                          const std::vector<bool>& eligible, int64_t budget_bytes,
                                          const std::vector<bool>& start, int64_t max_nodes,
                                          int64_t max_work);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_EXACT_PLACEMENT_H_
