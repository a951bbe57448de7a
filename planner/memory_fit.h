// Fitting a plan under an accelerator memory budget: the micro-batch size, the
// activation policy of each layer (keep, offload to the host, recompute) and
// the parameter home (resident or streamed from the host), keeping every other
// decision of a base schedule.
//
// Every saving is an action with the bytes it frees at the peak and the
// seconds it is estimated to cost, ranked by bytes saved per second lost, as
// Capuchin and Checkmate do:
//   recompute l   frees A_l - C_l (its checkpoint stays), costs M * fwd_l;
//   offload l     frees A_l, costs M * (the copy out not hidden by the
//                 compute after the layer + the copy back not hidden by the
//                 next layer's backward, since it is prefetched one layer
//                 ahead);
//   stream l      (layers updated on the host) frees its weights, costs
//                 M * the part of each of its two copies that the previous
//                 layer's compute does not hide.
// The copy engines are shared: each has one micro-batch's compute time to
// hide copies behind, less the gradient and weight traffic already on it.
// Offloads (earliest layers first) and then streams (largest first) use that
// up; past it a copy is charged in full (M * its copy time).
// A layer takes the better of recompute and offload. For each micro-batch
// size (the largest first; divisors of the replica's samples, each at most
// half the previous), the plan with no action is simulated; if it fits, the
// search stops (smaller micro-batches only add per-call overhead). Otherwise
// the shortest prefix of the ranked actions that fits is binary-searched with
// the simulator. The fastest plan that fits wins. Predictions come only from
// the simulator.
//
// Free functions; thread-compatible.
#ifndef TANDEM_PLANNER_MEMORY_FIT_H_
#define TANDEM_PLANNER_MEMORY_FIT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/cost_model.h"
#include "planner/schedule.h"
#include "planner/simulator.h"

namespace tandem::planner {

// What a strategy allows the fitter to change.
struct MemoryChoices {
  bool offload = false;
  bool recompute = false;
  bool stream = false;
};

struct MemoryBudget {
  int64_t accelerator_bytes = 0;
  // 0 = no host limit.
  int64_t host_bytes = 0;
};

struct FitResult {
  bool feasible = false;
  // The fastest schedule that fits; when none does, the one with the
  // smallest accelerator peak.
  Schedule schedule;
  SimulationResult simulation;
  // The smallest accelerator peak among the plans tried, in bytes.
  int64_t smallest_peak_bytes = 0;
  int64_t plans_evaluated = 0;
};

struct MemoryAction {
  enum Kind { kOffload, kRecompute, kStream };
  int layer = 0;
  Kind kind = kRecompute;
  double bytes_saved = 0;
  double seconds_lost = 0;
};

// The savings available to `schedule` (at its micro-batch size), best first.
std::vector<MemoryAction> RankMemoryActions(const CostModel& cost, const Schedule& schedule,
                                            const MemoryChoices& choices);

// Micro-batch sizes to try for `samples` samples: `fixed` alone when > 0 (if
// it divides), else the largest first, each a divisor at most half the
// previous, down to 1.
std::vector<int> MicroBatchSizes(int samples, int fixed);

// `base` with its micro-batch size and memory policies chosen to fit `budget`.
// `fixed_micro_batch_size` > 0 pins the micro-batch size.
FitResult FitToBudget(const PlanSimulator& simulator, const Schedule& base,
                      const MemoryBudget& budget, const MemoryChoices& choices,
                      int fixed_micro_batch_size);

// The accelerator peak of `base` with every ranked saving applied at the
// smallest micro-batch size: one simulation, a guess at the least memory
// FitToBudget can reach (0 when it cannot be simulated).
int64_t SmallestPeakGuess(const PlanSimulator& simulator, const Schedule& base,
                          const MemoryChoices& choices, int fixed_micro_batch_size);

// The smallest accelerator budget (to 1 MiB) under which `feasible` holds,
// given that it fails at `infeasible_bytes` and `guess_bytes` is a likely
// answer: feasible(result) and !feasible(result - 1 MiB). 0 when no budget up
// to 2^52 bytes works.
int64_t MinimumFeasibleBudget(const std::function<bool(int64_t)>& feasible,
                              int64_t infeasible_bytes, int64_t guess_bytes);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_MEMORY_FIT_H_
