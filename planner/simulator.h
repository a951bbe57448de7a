// PlanSimulator: the planner's single source of truth for predictions. Given a
// plan and a CostModel it builds the exact event timeline of training, reads
// one steady-state iteration out of it, and reports that iteration's time,
// per-resource idle time, memory over time and bytes moved per link.
//
// The plan executor follows exactly these rules, so that its measured
// timeline matches the simulated one.
//
// RESOURCES. Each runs one span at a time:
//   ACCELERATOR_COMPUTE  the accelerator's compute stream;
//   COPY_H2D, COPY_D2H   the two copy engines of the host link;
//   HOST_UPDATE          the host update pool: one layer's optimizer step at a
//                        time, all `host_update_threads` threads on it (as
//                        ZeRO-Offload's CPU-Adam splits one tensor over its
//                        OpenMP threads), lane 0;
//   HOST_COMPUTE         host forward/backward (cpu_only, hetero_dp's host
//                        replica).
// Compute streams run their spans in program order (below). Every other
// resource is FIFO in issue order, where a span is issued the moment its last
// dependency is met; spans issued at the same instant go in program order.
//
// ONE ITERATION, accelerator plans (gpu_only, zero_offload, reuse_distance).
// Layers l = 0..L-1, micro-batches j = 0..M-1 of `micro_batch_size` samples.
// The compute stream's program is
//     for j: FORWARD(0..L-1, j), then for l = L-1..0: [RECOMPUTE(l, j)],
//            BACKWARD(l, j), and when j = M-1 and l updates on the
//            accelerator, UPDATE(l) right after its backward.
// The loss is the chain's last layer (cross_entropy) and runs as any layer.
// Gradients accumulate over micro-batches; updates follow the last one.
// Layers without parameters have no update and no gradient traffic.
//
// A layer updated on the host: when BACKWARD(l, M-1) ends, GRADIENT_D2H(l) on
// the D2H engine, then UPDATE(l) on the host update pool (so updates run in
// gradient-ready order, L-1 first), then PARAMETER_H2D(l) on the H2D engine.
// FORWARD(l, 0) of iteration k+1 waits for that PARAMETER_H2D of iteration k;
// with delayed_parameter_update, for the one of iteration k-1 (the forward
// uses weights one update old).
//
// Parameter home HOST_STREAMED (update must be HOST): before each
// FORWARD(l, j) and again before each BACKWARD(l, j) (or its RECOMPUTE), a
// PARAMETER_H2D of its weights, issued when the compute stream starts the
// previous FORWARD/BACKWARD in program order (prefetch one layer ahead). The
// forward copy of micro-batch 0 also waits for UPDATE(l) of the previous
// iteration (k-1 with delayed updates): it is the copy that brings the new
// weights, so such a layer has no separate post-update PARAMETER_H2D. The
// device copy is allocated when the copy starts and freed when the forward
// (resp. backward) ends.
//
// Activations, per micro-batch (A = activation bytes at micro_batch_size; the
// layer's checkpoint C = min(A, output bytes of layer l-1), 0 for l = 0):
//   KEEP       A allocated when FORWARD starts, freed when BACKWARD ends.
//   OFFLOAD    A allocated when FORWARD starts; ACTIVATION_D2H on the D2H
//              engine after the forward, A freed on the device when it ends
//              (host holds A from its start until the ACTIVATION_H2D ends);
//              ACTIVATION_H2D before BACKWARD, issued like a streamed
//              parameter (one layer ahead) and after the D2H; A allocated
//              when it starts, freed when BACKWARD ends.
//   RECOMPUTE  A allocated when FORWARD starts; A - C freed when the next
//              layer's FORWARD ends (its own, for the last layer); a
//              RECOMPUTE span (the forward again) before BACKWARD allocates
//              A - C when it starts; A freed when BACKWARD ends.
// Workspace bytes are held during each FORWARD, RECOMPUTE and BACKWARD.
//
// Memory. Accelerator: resident parameters and the optimizer state of layers
// updated on the accelerator for the whole run; gradient buffers from the
// start of BACKWARD(l, 0) until GRADIENT_D2H(l) ends (host update) or
// UPDATE(l) ends (accelerator update); activations, streamed weights and
// workspace as above. Host: master parameters, gradient buffer and optimizer
// state of every layer updated on the host, for the whole run; offloaded
// activations while they are there.
//
// cpu_only. The same program on HOST_COMPUTE with parameters, gradients and
// optimizer state all in host memory; UPDATE(l) on the host update pool when
// BACKWARD(l, M-1) ends; FORWARD(l, 0) of iteration k+1 waits for it.
// (delayed_parameter_update does not apply.)
//
// hetero_dp. Two replicas each iteration: the accelerator runs the program
// above over accelerator_batch_share samples in micro-batches (layers KEEP or
// RECOMPUTE, all state resident); HOST_COMPUTE runs all layers over the other
// batch_size - share samples in one micro-batch, keeping its activations. Per
// layer, L-1 first: GRADIENT_SYNC on the D2H engine (accelerator gradient to
// host) once the accelerator's last BACKWARD(l) ends; GRADIENT_SYNC on the host
// update pool (average the two) once that copy and the host's BACKWARD(l) end;
// GRADIENT_SYNC on the H2D engine (averaged gradient back); UPDATE(l) of the
// host replica on the host update pool after the average. After the
// accelerator's last backward its program runs UPDATE(L-1..0), each waiting
// for its averaged gradient. Each replica's next FORWARD(l) waits for its own
// UPDATE(l). The plan's LayerPlans describe the accelerator replica.
//
// STEADY STATE. The run starts with all weights in place and is simulated for
// InitialSimulatedIterations() iterations, doubled until PeriodSettled()
// (steady_state.h). Iteration k starts when its first forward starts (the
// earlier of the two replicas' in hetero_dp); the reported iteration is the
// second to last, its time is the gap to the next start, and its window is
// [start, next start). Idle time of a resource is the window minus the time
// any span (of any iteration) occupies it within the window. Memory peak is
// the largest level at any instant of the window (PeakInWindow). Bytes per
// link count the reported iteration's copies. Stall is the compute stream's
// idle time, within the reported iteration, before spans whose last
// dependency was a copy that brings updated weights.
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
// IMPLEMENTATION. The rules above are an event graph over every span of every
// simulated iteration, and the general path builds and runs exactly that.
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

#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model.h"
#include "planner/schedule.h"
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
};

class PlanSimulator {
 public:
  // Keeps a reference to `cost`, which must outlive the simulator.
  explicit PlanSimulator(const CostModel& cost) : cost_(cost) {}

  // INVALID_ARGUMENT (naming the plan field) for a schedule the rules above do
  // not cover, e.g. a HOST_STREAMED layer updated on the accelerator.
  absl::Status Validate(const Schedule& schedule) const;

  absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule,
                                            const SimulationOptions& options = {}) const;
  absl::StatusOr<SimulationResult> Simulate(const tandem::v1::Plan& plan,
                                            const SimulationOptions& options = {}) const;

  const CostModel& cost() const { return cost_; }

 private:
  const CostModel& cost_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_SIMULATOR_H_
