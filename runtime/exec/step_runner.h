// The seam between the training loop and whatever runs a step: the CPU engine
// (cpu_runner.h) or the hybrid plan executor. A runner owns the model state
// wherever the plan puts it, and keeps a host copy current on request for
// checkpoints. Runners are driven by one thread (the trainer's).
#ifndef TANDEM_RUNTIME_EXEC_STEP_RUNNER_H_
#define TANDEM_RUNTIME_EXEC_STEP_RUNNER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/core/allocator.h"
#include "runtime/data/loader.h"
#include "runtime/device/timing_sink.h"
#include "runtime/model/model.h"
#include "runtime/optim/optimizer.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/schedule.pb.h"

namespace tandem {

struct StepOptions {
  // Optimizer step index, from 0 (seeds dropout; picks the learning rate).
  int64_t step = 0;
  float learning_rate = 1e-3f;
  uint64_t seed = 0;
  // > 0: batch-norm running statistics move by this much instead of by the
  // layer's momentum (LayerContext::running_stats_momentum).
  float running_stats_momentum = 0;
  // A data-parallel rank's share of a global batch: the index of the share's
  // first sample in the global batch (so dropout masks match the whole batch's)
  // and the global batch's size. With global_batch > 0 the gradient is of
  // (sum of the share's losses) / global_batch, so the shares' gradients add up
  // to the whole batch's; StepResult.loss stays the share's mean. Runners other
  // than the CPU engine ignore both.
  int64_t sample_offset = 0;
  int64_t global_batch = 0;
  // When set, the CPU engine calls it with each layer's index (the last layer
  // first) as soon as that layer's gradients are final, so that a data-parallel
  // rank starts reducing them while the rest of backward runs.
  std::function<void(int)> on_layer_gradients;
  // Dynamic loss scaling (fp16 models; the trainer's LossScaler keeps the
  // scale): > 0 multiplies the loss's gradient by it, so that small gradients
  // survive fp16's range; the runner then takes the global norm of the scaled
  // gradients, skips the update when it is not finite (an fp16 overflow) and
  // otherwise steps with the gradients divided by it. 0: off.
  float loss_scale = 0;
};

struct StepResult {
  // Mean loss over the batch, in nats per sample.
  double loss = 0;
  // Global gradient L2 norm before clipping (of the unscaled gradients under
  // loss scaling); 0 when neither clips nor scales (not computed).
  double grad_norm = 0;
  // Loss scaling only: the scaled gradients overflowed, and the update was
  // skipped (the weights, the optimizer state and its step count unchanged).
  bool skipped = false;
  int64_t samples = 0;
};

struct EvalResult {
  // Sum over samples of each sample's mean loss.
  double loss_sum = 0;
  // Positions predicted correctly (argmax), and positions evaluated.
  int64_t correct = 0;
  int64_t positions = 0;
  int64_t samples = 0;
};

// The host copy of the training state, laid out as the model describes.
struct HostStateView {
  float* params = nullptr;
  float* buffers = nullptr;
  // Optimizer moments (state_count of them), each parameter_elements long.
  std::vector<float*> moments;
  Optimizer* optimizer = nullptr;
};

// Where a run starts: the trainer's position after loading its checkpoint
// (all zero for a fresh start).
struct StartPoint {
  int64_t step = 0;
  int64_t samples = 0;
  int64_t epoch = 0;
  int64_t epoch_offset = 0;
  int64_t optimizer_step = 0;
};

// A ZeRO-partitioned data-parallel rank's own pieces of the optimizer state:
// what its partition of a checkpoint holds (docs/distributed.md).
struct StatePartition {
  int rank = 0;
  int ranks = 1;
  // How the state is cut into pieces (the buckets and the ranks): a partition
  // loads only into a runner that cuts it the same way.
  std::string layout;
  // Each moment's pieces, `elements` floats each, in the runner's memory.
  std::vector<float*> moments;
  int64_t elements = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;

  // Called once by the trainer after it loaded (or did not load) a
  // checkpoint: a runner whose state is shared with others (a data-parallel
  // rank) makes every rank start where rank 0 does, with rank 0's state, and
  // returns true when `point` changed. The others: false.
  virtual absl::StatusOr<bool> SynchronizeStart(StartPoint* point) { return false; }

  // Forward, backward and the optimizer update on one batch.
  virtual absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) = 0;
  // Forward only, in evaluation mode.
  virtual absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) = 0;

  // Makes host_state() current (copies device-resident state back).
  virtual absl::Status SyncStateToHost() = 0;
  virtual HostStateView host_state() = 0;
  // After host_state() was overwritten (a checkpoint load), pushes it to wherever
  // the state lives.
  virtual absl::Status StateChangedOnHost() = 0;

  // Peak bytes allocated per device since the runner started.
  virtual int64_t peak_host_bytes() const = 0;
  virtual int64_t peak_accelerator_bytes() const { return 0; }
  // The plan the runner executes (empty for the plain CPU engine).
  virtual tandem::v1::Plan plan() const { return tandem::v1::Plan(); }
  // The step program it runs (schedule/schedule.h as a message, what the job
  // record keeps); empty for runners without one (the CPU engine).
  virtual tandem::v1::Schedule program() const { return tandem::v1::Schedule(); }
  // Conditions a user should know that do not stop training (host memory that
  // could not be page-locked, so copies run at pageable speed); one line each.
  virtual std::vector<std::string> warnings() const { return {}; }
  // What a runner of an update rule other than synchronous did (update_rules.h);
  // empty for the others.
  virtual tandem::v1::UpdateStats update_stats() const { return tandem::v1::UpdateStats(); }
  // Pipeline runners: each stage's latest step (pipeline_runner.h); empty for
  // the others.
  virtual std::vector<tandem::v1::PipelineStageStats> pipeline_stats() const { return {}; }
  // Data-parallel ranks (runtime/dist): their collectives, as the job record
  // keeps them; ranks() == 0 for the others.
  virtual tandem::v1::DistributedStats distributed_stats() const {
    return tandem::v1::DistributedStats();
  }
  // The measured timeline of the latest step, when the runner records one.
  virtual tandem::v1::Timeline last_timeline() const { return tandem::v1::Timeline(); }

  // ZeRO-partitioned ranks: their own pieces of the optimizer state, which
  // they checkpoint instead of the whole. SyncStateToHost makes them current
  // (never gathering the rest: host_state() then has no moments), and
  // StateChangedOnHost pushes them back after a load. SynchronizeStart leaves
  // each rank's pieces as they are. nullopt for the runners that hold the
  // whole state.
  virtual std::optional<StatePartition> state_partition() { return std::nullopt; }
  // Runners with a partition: every rank's `mine` (the same length on each),
  // concatenated in rank order, through one collective.
  virtual absl::StatusOr<std::vector<double>> GatherFromRanks(const std::vector<double>& mine) {
    return mine;
  }

  // Virtual so that a runner wrapping another can pass the sink on.
  virtual void set_timing_sink(LayerTimingSink* sink) { timing_sink_ = sink; }

 protected:
  LayerTimingSink* timing_sink_ = nullptr;
};

// Argmax of each position's logits against its target. logits: rows x classes.
int64_t CountCorrect(const float* logits, const int32_t* targets, int64_t rows, int64_t classes);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_STEP_RUNNER_H_
