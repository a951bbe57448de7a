// The CPU training engine: every layer's forward, backward and update on the
// host, through oneDNN and the fused optimizer kernels. All memory comes from
// one host allocator, so a budget set on it is enforced (a step that does not
// fit fails with RESOURCE_EXHAUSTED and the accounting). Activation buffers are
// allocated once for the largest batch and reused. Not thread-safe.
#ifndef TANDEM_RUNTIME_EXEC_CPU_RUNNER_H_
#define TANDEM_RUNTIME_EXEC_CPU_RUNNER_H_

#include <memory>
#include <vector>

#include "runtime/exec/step_runner.h"

namespace tandem {

// Weights and batch-norm buffers that live elsewhere (another runner's, a
// parameter server's), which a runner reads and writes in place of its own.
struct SharedWeights {
  float* params = nullptr;
  float* buffers = nullptr;
};

class CpuRunner final : public StepRunner {
 public:
  // `model` must outlive the runner. Initial parameters from `init_seed`.
  // `max_batch` bounds every batch the runner will see. With `shared`, the
  // runner computes on those weights (which must outlive it) instead of
  // initialising its own, and has no optimizer state of its own: it is a
  // worker whose updates someone else applies (update_rules.h).
  static absl::StatusOr<std::unique_ptr<CpuRunner>> Create(
      const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t max_batch,
      uint64_t init_seed, Allocator* allocator, const SharedWeights* shared = nullptr);

  // Weights of its own (from `init_seed`) but no optimizer state: forward and
  // backward only (ComputeGradients), for a caller that applies the updates
  // itself (a data-parallel rank, runtime/dist/). TrainStep is refused.
  static absl::StatusOr<std::unique_ptr<CpuRunner>> CreateGradientEngine(const Model& model,
                                                                         int64_t max_batch,
                                                                         uint64_t init_seed,
                                                                         Allocator* allocator);

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  // Forward and backward only: the batch's gradient (of the mean loss) into
  // grads(), the weights untouched except for batch-norm running statistics.
  // grad_norm is filled when the optimizer clips or the loss is scaled; under
  // loss scaling `skipped` says the scaled gradients overflowed.
  absl::StatusOr<StepResult> ComputeGradients(const Batch& batch, const StepOptions& options);
  // Forward only, in training mode (batch statistics, dropout): what moves the
  // batch-norm running statistics, by options.running_stats_momentum when set.
  absl::Status TrainingForward(const Batch& batch, const StepOptions& options);
  float* grads() const { return state_.grads(); }
  float* params() const { return params_; }
  float* buffers() const { return buffers_; }
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override;
  absl::Status SyncStateToHost() override { return absl::OkStatus(); }
  HostStateView host_state() override;
  absl::Status StateChangedOnHost() override { return absl::OkStatus(); }
  int64_t peak_host_bytes() const override { return allocator_->stats().peak_total_bytes; }

  // The loss layer's input (logits) of the latest forward, for tests.
  const float* logits() const { return outputs_[model_.num_layers() - 2].f32(); }
  ModelState& state() { return state_; }

 private:
  CpuRunner(const Model& model, Allocator* allocator) : model_(model), allocator_(allocator) {}
  // Output, saved-tensor, gradient and workspace buffers for `max_batch`.
  absl::Status AllocateActivations(int64_t max_batch);
  // Runs forward over the chain; returns the per-sample losses.
  const float* Forward(const Batch& batch, bool training, const StepOptions& options);
  LayerContext Context(int l, bool training, const StepOptions& options, const int32_t* targets);

  const Model& model_;
  Allocator* const allocator_;
  ModelState state_;
  // state_'s weights, or the shared ones.
  float* params_ = nullptr;
  float* buffers_ = nullptr;
  std::unique_ptr<Optimizer> optimizer_;
  // False for a gradient engine: someone else updates the weights.
  bool updates_ = true;
  // What the latest ComputeGradients found every gradient is to be multiplied
  // by (clipping, and the loss scale undone); 0 when it overflowed.
  float gradient_scale_ = 1.0f;
  int64_t max_batch_ = 0;
  // Per layer: its output and its saved tensors, sized for max_batch_.
  std::vector<Buffer> outputs_, saved_;
  // Gradients flowing between layers (two, used alternately) and the scratch.
  Buffer grad_a_, grad_b_, workspace_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_CPU_RUNNER_H_
