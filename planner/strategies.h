// The strategies the planner offers (docs/planning.md, "What a plan decides"). Each fills a
// Decisions under the budgets and takes its prediction only from the
// simulator:
//
//   gpu_only        every layer computes and updates on the accelerator with
//                   all state resident; memory by micro-batching and
//                   recompute (nothing leaves the device).
//   cpu_only        everything on the host.
//   zero_offload    ZeRO-Offload: compute on the accelerator, optimizer state
//                   and every update on the host, overlapped with backward;
//                   memory by micro-batching, activation offload/recompute
//                   and parameter streaming.
//   reuse_distance  CoTrain: zero_offload's memory settings, then
//                   SearchUpdatePlacement moves the optimizer state and
//                   update of chosen layers to the accelerator, within the
//                   budget; when that leaves the accelerator stalling, also
//                   with half the micro-batch (freeing activation memory for
//                   optimizer state); and gpu_only's
//                   plan (every layer on the accelerator) competes. So it is
//                   never slower than zero_offload or gpu_only when those fit.
//   hetero_dp       an accelerator replica and a host replica split each
//                   batch; the split equalises their compute (binary search
//                   on the accelerator share, then the neighbours and
//                   smaller shares by simulation); gradients are averaged on
//                   the host each step (GRADIENT_SYNC spans).
//
// An infeasible strategy reports the smallest accelerator budget under which
// it would fit, to the byte (MemoryFitter::MinimumBudget, computed from the
// strategy's own plans rather than searched), and the plan it would run
// there, with the numbers in its note: its prediction, but no timeline.
//
// Free functions; thread-compatible.
#ifndef TANDEM_PLANNER_STRATEGIES_H_
#define TANDEM_PLANNER_STRATEGIES_H_

#include <cstdint>
#include <string>

#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "planner/simulator.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::planner {

struct StrategyContext {
  const PlanSimulator* simulator = nullptr;
  int batch_size = 1;
  // In bytes; host 0 = no limit.
  int64_t accelerator_memory_budget_bytes = 0;
  int64_t host_memory_budget_bytes = 0;
  // 0 = the solver's choice.
  int micro_batch_size = 0;
  bool delayed_parameter_update = false;
  int host_update_threads = 1;
  // reuse_distance may stream a layer's optimizer state in for an
  // accelerator update (state_streaming.h).
  bool stream_optimizer_state = true;

  const CostModel& cost() const { return simulator->cost(); }
};

struct StrategyOutcome {
  tandem::v1::Strategy strategy = tandem::v1::STRATEGY_UNSPECIFIED;
  bool feasible = false;
  // The plan (when infeasible: the one it would run at the minimum budget,
  // if any) and its simulation.
  Decisions schedule;
  SimulationResult simulation;
  bool simulated = false;
  int64_t min_accelerator_memory_bytes = 0;
  std::string method;
  std::string note;
  int64_t plans_evaluated = 0;
  double solve_seconds = 0;
  // reuse_distance: the exact placement search finished for every memory
  // configuration searched, so no placement of updates is faster under them.
  bool placement_proven_optimal = false;
};

// With find_min_budget false an infeasible outcome skips the search for the
// smallest budget (reuse_distance only needs to know whether it fits).
StrategyOutcome SolveGpuOnly(const StrategyContext& context, bool find_min_budget = true);
StrategyOutcome SolveCpuOnly(const StrategyContext& context);
// With record_timeline false the outcome's simulation has no timeline (for
// when only reuse_distance, which builds on it, is wanted).
StrategyOutcome SolveZeroOffload(const StrategyContext& context, bool record_timeline = true);
// Reuses the zero_offload and gpu_only outcomes solved under the same context.
StrategyOutcome SolveReuseDistance(const StrategyContext& context,
                                   const StrategyOutcome& zero_offload,
                                   const StrategyOutcome& gpu_only);
StrategyOutcome SolveHeteroDp(const StrategyContext& context);

// The Plan proto of an outcome: decisions, layer names, reuse distances,
// slack, per-layer accelerator bytes, budgets, prediction, timeline, solver.
// Pass the outcome by std::move to hand over its timeline without a copy.
tandem::v1::Plan ToPlan(const StrategyContext& context, StrategyOutcome outcome);

// "gpu_only", "reuse_distance", ...
std::string StrategyName(tandem::v1::Strategy strategy);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_STRATEGIES_H_
