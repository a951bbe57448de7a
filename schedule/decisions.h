// Decisions: the decisions of a Plan (per layer: where it computes, where its
// parameters live, where it updates, what happens to its activations; and the
// strategy-wide settings) as a plain struct the solvers copy and mutate cheaply.
// A Plan proto is a Decisions plus predictions; DecisionsFromPlan and
// WriteDecisionsToPlan convert. Value type; thread-compatible.
#ifndef TANDEM_SCHEDULE_DECISIONS_H_
#define TANDEM_SCHEDULE_DECISIONS_H_

#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::schedule {

struct LayerDecisions {
  tandem::v1::Placement compute = tandem::v1::PLACEMENT_ACCELERATOR;
  tandem::v1::ParameterHome parameter_home = tandem::v1::PARAMETER_HOME_ACCELERATOR;
  tandem::v1::Placement update = tandem::v1::PLACEMENT_ACCELERATOR;
  tandem::v1::ActivationPolicy activation = tandem::v1::ACTIVATION_POLICY_KEEP;
  // An accelerator update whose optimizer state lives on the host and is
  // streamed in for it (LayerPlan.stream_optimizer_state).
  bool stream_state = false;

  bool operator==(const LayerDecisions& o) const {
    return compute == o.compute && parameter_home == o.parameter_home && update == o.update &&
           activation == o.activation && stream_state == o.stream_state;
  }
};

struct Decisions {
  tandem::v1::Strategy strategy = tandem::v1::STRATEGY_GPU_ONLY;
  std::vector<LayerDecisions> layers;
  // Samples per optimizer step.
  int batch_size = 1;
  // Samples per micro-batch of the replica that computes layers (the
  // accelerator's, or the host's for cpu_only); divides its samples.
  int micro_batch_size = 1;
  // hetero_dp: samples the accelerator replica takes; the host the rest.
  int accelerator_batch_share = 0;
  bool delayed_parameter_update = false;
  int host_update_threads = 1;
  // Plan.state_prefetch_layers, at least 1, and Plan.state_update_lag.
  int state_prefetch_layers = 1;
  int state_update_lag = 0;

  // Samples the layer-computing replica processes per step.
  int replica_samples() const {
    return strategy == tandem::v1::STRATEGY_HETERO_DP ? accelerator_batch_share : batch_size;
  }
  int micro_batches() const { return replica_samples() / micro_batch_size; }
};

// The decisions of `plan` (which must have `num_layers` layers).
// INVALID_ARGUMENT naming the field when they do not fit together.
absl::StatusOr<Decisions> DecisionsFromPlan(const tandem::v1::Plan& plan, int num_layers);

// Writes the decisions of `schedule` into `plan` (layers get index and
// placements; names and predictions are left to the caller).
void WriteDecisionsToPlan(const Decisions& schedule, tandem::v1::Plan* plan);

}  // namespace tandem::schedule

#endif  // TANDEM_SCHEDULE_DECISIONS_H_
