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
// the simulator (which simulates resident-weight and hetero_dp schedules by
// exact recurrences, fast enough to simulate every candidate).
//
// MemoryFitter keeps the plans it simulated, so fitting the same base at
// several budgets (and finding the smallest that works) simulates each plan
// once. Free functions are thread-compatible.
#ifndef TANDEM_PLANNER_MEMORY_FIT_H_
#define TANDEM_PLANNER_MEMORY_FIT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "planner/cost_model.h"
#include "planner/decisions.h"
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
  // smallest accelerator peak among those simulated.
  Decisions schedule;
  // Simulated without a timeline.
  SimulationResult simulation;
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
std::vector<MemoryAction> RankMemoryActions(const CostModel& cost, const Decisions& schedule,
                                            const MemoryChoices& choices);

// Micro-batches per step the planner considers for a chain of `layers`
// layers. Each micro-batch is a call per layer in every simulated iteration,
// so the bound keeps one plan's simulation, and its timeline, to at most
// kMaxLayerCallsPerStep layer calls per iteration (a 4,096-layer model: 64
// micro-batches), and never more than kMaxMicroBatchesPerStep. Without it a
// batch of 65,536 on a tight budget would be simulated at micro-batch 1.
inline constexpr int kMaxMicroBatchesPerStep = 1024;
inline constexpr int64_t kMaxLayerCallsPerStep = int64_t{1} << 18;
int MaxMicroBatches(int layers);
// The smallest micro-batch that bound allows for `samples` samples per step.
int SmallestMicroBatch(int samples, int layers);
// OK, or INVALID_ARGUMENT saying how many micro-batches `micro_batch_size`
// makes, the bound, and the smallest micro-batch allowed (no field named: the
// caller prefixes its own).
absl::Status CheckMicroBatchBound(int samples, int micro_batch_size, int layers);

// Micro-batch sizes to try for `samples` samples, each leaving at most
// `max_micro_batches` micro-batches: `fixed` alone when > 0 (if it divides and
// respects the bound), else the largest first, each a divisor at most half
// the previous, down to the smallest the bound allows.
std::vector<int> MicroBatchSizes(int samples, int fixed, int max_micro_batches);

// The fitting above for one base schedule, at any accelerator budget, with
// the plans it simulates kept for the next call. Not thread-safe.
class MemoryFitter {
 public:
  // `fixed_micro_batch_size` > 0 pins the micro-batch size; host_memory_budget_bytes
  // 0 = no host limit. Keeps a reference to `simulator`.
  MemoryFitter(const PlanSimulator& simulator, const Decisions& base, const MemoryChoices& choices,
               int fixed_micro_batch_size, int64_t host_memory_budget_bytes);

  FitResult Fit(int64_t accelerator_bytes);

  struct Minimum {
    // The smallest accelerator budget under which Fit finds a plan, to the
    // byte; 0 when host memory rules out every plan.
    int64_t accelerator_bytes = 0;
    // The least host memory any plan Fit can choose needs.
    int64_t host_bytes = 0;
  };
  // Fit succeeds exactly when, for some micro-batch size it tries, the plan
  // with no saving or the plan with every saving fits (the binary search
  // between them starts from a fitting end), so the minimum is the least
  // accelerator peak of those plans among the ones within the host budget:
  // two simulations per micro-batch size, no search over budgets.
  Minimum MinimumBudget();

  // Simulations run so far.
  int64_t plans_evaluated() const { return plans_evaluated_; }

 private:
  struct Candidate {
    bool simulated = false;
    bool ok = false;
    SimulationResult simulation;
  };
  struct Size {
    int micro_batch_size = 0;
    bool ranked = false;
    std::vector<MemoryAction> actions;
    // By number of ranked actions applied; only those simulated.
    std::map<int, Candidate> plans;
  };
  // The ranked savings of `size`, computed on first use.
  const std::vector<MemoryAction>& Actions(Size* size);
  Decisions PlanAt(const Size& size, int actions) const;
  const Candidate& Simulated(Size* size, int actions);
  bool HostFits(const SimulationResult& r) const;

  const PlanSimulator& simulator_;
  Decisions base_;
  MemoryChoices choices_;
  int64_t host_memory_budget_bytes_;
  std::vector<Size> sizes_;
  int64_t plans_evaluated_ = 0;
};

// MemoryFitter(...).Fit(budget.accelerator_bytes), for one budget.
FitResult FitToBudget(const PlanSimulator& simulator, const Decisions& base,
                      const MemoryBudget& budget, const MemoryChoices& choices,
                      int fixed_micro_batch_size);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_MEMORY_FIT_H_
