#include "runtime/exec/cpu_runner.h"

#include <cmath>

#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/core/random.h"
#include "runtime/optim/kernels.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<CpuRunner>> CpuRunner::Create(
    const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t max_batch,
    uint64_t init_seed, Allocator* allocator, const SharedWeights* shared) {
  std::unique_ptr<CpuRunner> r(new CpuRunner(model, allocator));
  TANDEM_ASSIGN_OR_RETURN(r->state_, ModelState::Allocate(model, allocator));
  if (shared != nullptr) {
    r->params_ = shared->params;
    r->buffers_ = shared->buffers;
    r->optimizer_ = Optimizer::Stateless(optimizer);
  } else {
    r->params_ = r->state_.params();
    r->buffers_ = r->state_.buffers();
    model.Initialize(r->params_, r->buffers_, init_seed);
    TANDEM_ASSIGN_OR_RETURN(r->optimizer_,
                            Optimizer::Create(optimizer, model.parameter_elements(), allocator));
  }
  TANDEM_RETURN_IF_ERROR(r->AllocateActivations(max_batch));
  return r;
}

absl::Status CpuRunner::AllocateActivations(int64_t max_batch) {
  max_batch_ = max_batch;
  int64_t max_grad = model_.data().sample_shape.elements() * 4 * max_batch;
  for (int l = 0; l < model_.num_layers(); ++l) {
    const Layer& layer = model_.layer(l);
    TANDEM_ASSIGN_OR_RETURN(Buffer out, Buffer::Allocate(allocator_, layer.OutputBytes(max_batch),
                                                         MemoryCategory::kActivations));
    TANDEM_ASSIGN_OR_RETURN(Buffer saved, Buffer::Allocate(allocator_, layer.SavedBytes(max_batch),
                                                           MemoryCategory::kActivations));
    outputs_.push_back(std::move(out));
    saved_.push_back(std::move(saved));
    max_grad = std::max(max_grad, layer.OutputBytes(max_batch));
  }
  TANDEM_ASSIGN_OR_RETURN(grad_a_,
                          Buffer::Allocate(allocator_, max_grad, MemoryCategory::kActivations));
  TANDEM_ASSIGN_OR_RETURN(grad_b_,
                          Buffer::Allocate(allocator_, max_grad, MemoryCategory::kActivations));
  TANDEM_ASSIGN_OR_RETURN(workspace_,
                          Buffer::Allocate(allocator_, model_.MaxWorkspaceBytes(max_batch),
                                           MemoryCategory::kWorkspace));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CpuRunner>> CpuRunner::CreateGradientEngine(const Model& model,
                                                                           int64_t max_batch,
                                                                           uint64_t init_seed,
                                                                           Allocator* allocator) {
  // A stateless SGD stands in for the optimizer nobody will run.
  std::unique_ptr<CpuRunner> r(new CpuRunner(model, allocator));
  TANDEM_ASSIGN_OR_RETURN(r->state_, ModelState::Allocate(model, allocator));
  r->params_ = r->state_.params();
  r->buffers_ = r->state_.buffers();
  model.Initialize(r->params_, r->buffers_, init_seed);
  r->optimizer_ = Optimizer::Stateless(tandem::v1::OptimizerSpec());
  r->updates_ = false;
  TANDEM_RETURN_IF_ERROR(r->AllocateActivations(max_batch));
  return r;
}

LayerContext CpuRunner::Context(int l, bool training, const StepOptions& options,
                                const int32_t* targets) {
  LayerContext ctx;
  ctx.params = params_ + model_.param_offset(l);
  ctx.grads = state_.layer_grads(model_, l);
  ctx.buffers = model_.buffer_elements() == 0 ? nullptr : buffers_ + model_.buffer_offset(l);
  ctx.training = training;
  ctx.running_stats_momentum = options.running_stats_momentum;
  ctx.seed = options.seed;
  ctx.sample_offset = static_cast<uint64_t>(options.sample_offset);
  // Dropout differs per step and per layer; resuming at the same step gives the
  // same masks.
  ctx.rng_stream = MixStream(0xd209, static_cast<uint64_t>(options.step), static_cast<uint64_t>(l));
  ctx.workspace = workspace_.data();
  ctx.targets = targets;
  return ctx;
}

const float* CpuRunner::Forward(const Batch& batch, bool training, const StepOptions& options) {
  const int64_t B = batch.size;
  Tensor x(const_cast<float*>(batch.inputs.data()), batch.input_dtype,
           model_.data().sample_shape.WithBatch(B));
  for (int l = 0; l < model_.num_layers(); ++l) {
    const Layer& layer = model_.layer(l);
    const Tensor y = Tensor::F32(outputs_[l].f32(), layer.output_shape().WithBatch(B));
    const double start = timing_sink_ ? WallSeconds() : 0;
    layer.Forward(Context(l, training, options, batch.targets.data()), x, y, saved_[l].data());
    if (timing_sink_) timing_sink_->Record(l, Phase::kForward, WallSeconds() - start);
    x = y;
  }
  return outputs_.back().f32();
}

absl::StatusOr<StepResult> CpuRunner::TrainStep(const Batch& batch, const StepOptions& options) {
  if (!updates_) {
    return absl::FailedPreconditionError("a gradient engine computes gradients; it does not train");
  }
  TANDEM_ASSIGN_OR_RETURN(StepResult result, ComputeGradients(batch, options));
  if (result.skipped) return result;
  const float scale = gradient_scale_;
  const double start = timing_sink_ ? WallSeconds() : 0;
  optimizer_->Step(params_, state_.grads(), options.learning_rate, scale);
  if (timing_sink_) timing_sink_->Record(-1, Phase::kUpdate, WallSeconds() - start);
  return result;
}

absl::StatusOr<StepResult> CpuRunner::ComputeGradients(const Batch& batch,
                                                       const StepOptions& options) {
  if (batch.size > max_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  const int64_t B = batch.size;
  const int L = model_.num_layers();
  const float* losses = Forward(batch, true, options);
  StepResult result;
  result.samples = B;
  double sum = 0;
  for (int64_t b = 0; b < B; ++b) sum += losses[b];
  result.loss = sum / static_cast<double>(B);

  // d(mean loss)/d(per-sample loss) = 1/B (B of the global batch for a share).
  const int64_t divisor = options.global_batch > 0 ? options.global_batch : B;
  float* dy = grad_a_.f32();
  float* dx = grad_b_.f32();
  const float seed =
      (options.loss_scale > 0 ? options.loss_scale : 1.0f) / static_cast<float>(divisor);
  for (int64_t b = 0; b < B; ++b) dy[b] = seed;
  for (int l = L - 1; l >= 0; --l) {
    const Layer& layer = model_.layer(l);
    const Tensor x = l == 0 ? Tensor(const_cast<float*>(batch.inputs.data()), batch.input_dtype,
                                     model_.data().sample_shape.WithBatch(B))
                            : Tensor::F32(outputs_[l - 1].f32(), layer.input_shape().WithBatch(B));
    const Tensor y = Tensor::F32(outputs_[l].f32(), layer.output_shape().WithBatch(B));
    // The first layer's input needs no gradient.
    const Tensor dxt = l == 0 ? Tensor() : Tensor::F32(dx, layer.input_shape().WithBatch(B));
    const double start = timing_sink_ ? WallSeconds() : 0;
    layer.Backward(Context(l, true, options, batch.targets.data()), x, y, saved_[l].data(),
                   Tensor::F32(dy, layer.output_shape().WithBatch(B)), dxt);
    if (timing_sink_) timing_sink_->Record(l, Phase::kBackward, WallSeconds() - start);
    if (options.on_layer_gradients) options.on_layer_gradients(l);
    std::swap(dy, dx);
  }

  gradient_scale_ = 1.0f;
  if (optimizer_->spec().max_grad_norm() > 0 || options.loss_scale > 0) {
    gradient_scale_ = Optimizer::GradientScale(
        optim::SumOfSquares(state_.grads(), model_.parameter_elements()), options.loss_scale,
        optimizer_->spec().max_grad_norm(), &result.grad_norm);
    result.skipped = gradient_scale_ == 0;
  }
  return result;
}

absl::Status CpuRunner::TrainingForward(const Batch& batch, const StepOptions& options) {
  if (batch.size > max_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  Forward(batch, true, options);
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> CpuRunner::EvalBatch(const Batch& batch) {
  if (batch.size > max_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  StepOptions options;
  const float* losses = Forward(batch, false, options);
  EvalResult r;
  r.samples = batch.size;
  for (int64_t b = 0; b < batch.size; ++b) r.loss_sum += losses[b];
  const CrossEntropy& loss = model_.loss();
  r.positions = batch.size * loss.positions();
  r.correct = CountCorrect(logits(), batch.targets.data(), r.positions, loss.classes());
  return r;
}

HostStateView CpuRunner::host_state() {
  HostStateView v;
  v.params = params_;
  v.buffers = buffers_;
  // A worker on shared weights has no moments of its own.
  if (optimizer_->elements() > 0) {
    for (int i = 0; i < optimizer_->state_count(); ++i) v.moments.push_back(optimizer_->state(i));
  }
  v.optimizer = optimizer_.get();
  return v;
}

}  // namespace tandem
