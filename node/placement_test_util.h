// Jobs, nodes and training runs shared by the placement and prediction tests:
// small GPT and MLP specs on the emulated accelerator, a host with fixed
// figures, and a helper that trains a spec through a runner factory and keeps
// its per-step losses and times. Test-only.
#ifndef TANDEM_NODE_PLACEMENT_TEST_UTIL_H_
#define TANDEM_NODE_PLACEMENT_TEST_UTIL_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "node/placement.h"
#include "tandem/v1/job.pb.h"

namespace tandem::node::placement_testing {

// Fixed host figures, so plans do not depend on this machine's speed.
NodeOffer TestNode();

tandem::v1::JobSpec Spec(const std::string& yaml);

// Models whose state is mostly parameters (small batches, short contexts), so
// that a quarter of it leaves the planner real choices beyond the executor's
// transient buffers; on the emulated accelerator with `capacity` bytes.
tandem::v1::JobSpec Gpt(tandem::v1::Strategy strategy, int64_t capacity, int steps = 4);
tandem::v1::JobSpec Mlp(tandem::v1::Strategy strategy, int64_t capacity, int steps = 4);

struct TrainRun {
  absl::Status status;
  std::vector<double> losses;
  // Wall time of each step, in seconds (log_interval_steps must be 1 for
  // one entry per step).
  std::vector<double> step_seconds;
  double eval_loss = 0;
  tandem::v1::JobMetrics metrics;
  tandem::v1::Plan plan;
};

// Trains `spec` with runners from `factory` (null: the CPU engine).
TrainRun Train(const tandem::v1::JobSpec& spec, RunnerFactory factory);

// Weights, gradients and two Adam moments: the model state in bytes.
int64_t ModelStateBytes(const tandem::v1::JobSpec& spec);

}  // namespace tandem::node::placement_testing

#endif  // TANDEM_NODE_PLACEMENT_TEST_UTIL_H_
