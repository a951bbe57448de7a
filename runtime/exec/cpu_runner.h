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

class CpuRunner final : public StepRunner {
 public:
  // `model` must outlive the runner. Initial parameters from `init_seed`.
  // `max_batch` bounds every batch the runner will see.
  static absl::StatusOr<std::unique_ptr<CpuRunner>> Create(
      const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t max_batch,
      uint64_t init_seed, Allocator* allocator);

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
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
  // Runs forward over the chain; returns the per-sample losses.
  const float* Forward(const Batch& batch, bool training, const StepOptions& options);
  LayerContext Context(int l, bool training, const StepOptions& options, const int32_t* targets);

  const Model& model_;
  Allocator* const allocator_;
  ModelState state_;
  std::unique_ptr<Optimizer> optimizer_;
  int64_t max_batch_ = 0;
  // Per layer: its output and its saved tensors, sized for max_batch_.
  std::vector<Buffer> outputs_, saved_;
  // Gradients flowing between layers (two, used alternately) and the scratch.
  Buffer grad_a_, grad_b_, workspace_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_CPU_RUNNER_H_
