// PlanSimulator: the planner's single source of truth for predictions. Given a
// plan and a CostModel it builds the exact event timeline of training, reads
// one steady-state iteration out of it, and reports that iteration's time,
// per-resource idle time, memory over time and bytes moved per link.
//
// The step is not written here: schedule::Lower (schedule/lower.h) turns the
// plan's decisions into a schedule::Schedule (schedule/schedule.h), the
// per-resource ordered operations with their dependencies and memory events,
// and schedule::Simulate runs it as an event graph with the cost model's
// durations. The plan executor runs the same schedule.
//
// RESOURCES (schedule.h): ACCELERATOR_COMPUTE, the accelerator's compute
// stream; COPY_H2D, COPY_D2H, the two copy engines of the host link;
// HOST_UPDATE, the host update pool: one layer's optimizer step at a time,
// all `host_update_threads` threads on it (as ZeRO-Offload's CPU-Adam splits
// one tensor over its OpenMP threads), lane 0; HOST_COMPUTE, host
// forward/backward (cpu_only, hetero_dp's host replica). Compute streams run
// their operations in the schedule's order; the copy engines and the update
// pool in the order they become ready (ties in program order).
//
// STEADY STATE. The run starts with all weights in place and is simulated for
// InitialSimulatedIterations() iterations, doubled while KeepSimulating()
// (steady_state.h: until the period settles, is no shorter than any
// resource's work and iterations stop ending later after their start; up to
// 64 iterations, or 1,024 while a backlog still grows). Iteration k starts when its first
// forward starts (the earlier of the two replicas' in hetero_dp); the
// reported iteration is the second to last, its window is [start, next
// start), and its time is that gap where the run settled, else the mean
// gap over the run's second half (ReportedPeriod), at least the busiest
// resource's work (SimulationResult.resource_work_seconds). Idle time of a resource is the window
// minus the time any span (of any iteration) occupies it within the window. Memory peak is the
// largest level at any instant of the window (PeakInWindow). Bytes per link count the reported
// iteration's copies. Stall is the compute stream's idle time, within the reported iteration,
// before spans whose last dependency was a copy that brings updated weights.
//
// Reuse distance of layer l: the stall-free program time between the end of
// BACKWARD(l, M-1) (of its own UPDATE when that follows on the accelerator)
// and the start of the next iteration's FORWARD(l, 0), i.e.
// the durations of the compute spans between them (docs/planning.md). Slack: reuse
// distance (+ one iteration with delayed updates) minus the time from that
// backward's end until the updated weights are back (end of PARAMETER_H2D,
// or update end + copy time for streamed layers); 0 for layers that update
// where they compute.
//
// IMPLEMENTATION. The general path lowers the decisions and runs the schedule
// for every simulated iteration.
// Two classes of schedule are run instead as recurrences that perform the
// same floating-point operations, so their results are bit-for-bit the
// graph's (tests compare every field on random schedules): resident-weight
// accelerator plans without offload or streaming (resident_chain.h) and
// hetero_dp (hetero_replicas.h). SimulationOptions.use_event_graph forces the
// general path.
//
// Thread-safe: Simulate is const and keeps no state between calls.
#ifndef TANDEM_PLANNER_SIMULATOR_H_
#define TANDEM_PLANNER_SIMULATOR_H_

#include <functional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "schedule/schedule.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::planner {

struct SimulationOptions {
  // Fill SimulationResult.timeline (spans and memory samples). Solvers that
  // only need the prediction turn it off.
  bool record_timeline = true;
  // Run the general event graph even for a schedule ResidentChain or
  // HeteroReplicas covers (resident_chain.h, hetero_replicas.h), whose
  // recurrences give the same result bit for bit, faster. For tests that
  // compare the two.
  bool use_event_graph = false;
  // Data parallelism (schedule/lower.h, DATA-PARALLEL RANKS): the step is
  // one of `ranks` ranks', as a rank's executor runs it: its gradients summed
  // in buckets of `bucket_bytes` on the NETWORK stream, each collective
  // taking collective_seconds(kind, bytes) (kAllReduce, kReduceScatter,
  // kAllGather; required when ranks > 1). With partition_host_state, the host
  // updates step 1/ranks of their layers (ZeRO with offload).
  int ranks = 1;
  int64_t bucket_bytes = int64_t{25} << 20;
  bool partition_host_state = false;
  std::function<double(schedule::OpKind kind, int64_t bytes)> collective_seconds;
};

struct LayerTiming {
  double reuse_distance_seconds = 0;
  double slack_seconds = 0;
};

struct SimulationResult {
  tandem::v1::PlanPrediction prediction;
  // The reported iteration, times relative to its start; source "simulated".
  tandem::v1::Timeline timeline;
  std::vector<LayerTiming> layers;
  int iterations_simulated = 0;
  // One iteration's work on each resource (its operations' durations
  // summed), indexed by TimelineResource: a steady-state period is at least
  // each (steady_state.h). Empty for hetero_dp, whose replicas need not keep
  // pace and whose period is the earlier replica's.
  std::vector<double> resource_work_seconds;
  // Bytes the step keeps on the accelerator throughout (resident weights and
  // optimizer state): its memory never falls below them.
  int64_t accelerator_resident_bytes = 0;
};

class PlanSimulator {
 public:
  // Keeps a reference to `cost`, which must outlive the simulator. `stop`,
  // when set, is asked before each simulation; once it says true, Simulate
  // answers CANCELLED, which the solvers treat as a plan that failed, so a
  // strategy's search runs out in cheap calls and SolvePlan answers CANCELLED
  // after it (planner.h).
  explicit PlanSimulator(const CostModel& cost, std::function<bool()> stop = nullptr)
      : cost_(cost), stop_(std::move(stop)) {}

  // INVALID_ARGUMENT (naming the plan field) for a schedule the rules above do
  // not cover, e.g. a HOST_STREAMED layer updated on the accelerator.
  absl::Status Validate(const Decisions& schedule) const;

  absl::StatusOr<SimulationResult> Simulate(const Decisions& schedule,
                                            const SimulationOptions& options = {}) const;
  absl::StatusOr<SimulationResult> Simulate(const tandem::v1::Plan& plan,
                                            const SimulationOptions& options = {}) const;

  const CostModel& cost() const { return cost_; }

 private:
  const CostModel& cost_;
  std::function<bool()> stop_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_SIMULATOR_H_
