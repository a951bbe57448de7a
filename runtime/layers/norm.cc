#include "runtime/layers/norm.h"

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"
#include "runtime/layers/device_ops.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_ops.h"
#include "runtime/cuda/kernels/batchnorm.h"
#include "runtime/cuda/kernels/layernorm.h"
#endif

namespace tandem {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using flags = dnnl::normalization_flags;

const flags kScaleShift = flags::use_scale | flags::use_shift;

}  // namespace

// ---------------------------------------------------------------------------
// BatchNorm2d

struct BatchNorm2d::Primitives {
  memory::desc data, channel;
  dnnl::batch_normalization_forward training, inference;
  dnnl::batch_normalization_backward backward;
};

struct BatchNorm2d::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

BatchNorm2d::BatchNorm2d(float momentum, float epsilon)
    : momentum_(momentum), epsilon_(epsilon), cache_(std::make_unique<Cache>()) {}
BatchNorm2d::~BatchNorm2d() = default;

absl::StatusOr<Shape> BatchNorm2d::InferOutput(const Shape& input) {
  if (input.rank() != 3) return absl::InvalidArgumentError("needs an image input [H, W, C]");
  if (!(momentum_ > 0 && momentum_ < 1))
    return absl::InvalidArgumentError("momentum must be in (0, 1)");
  if (!(epsilon_ > 0)) return absl::InvalidArgumentError("epsilon must be > 0");
  channels_ = input[2];
  return input;
}

std::vector<ParamSpec> BatchNorm2d::Params() const {
  return {{"weight", Shape({channels_})}, {"bias", Shape({channels_})}};
}

void BatchNorm2d::Initialize(float* params, float* buffers, uint64_t, uint64_t) const {
  for (int64_t c = 0; c < channels_; ++c) {
    params[c] = 1.0f;
    params[channels_ + c] = 0.0f;
    buffers[c] = 0.0f;              // running mean
    buffers[channels_ + c] = 1.0f;  // running variance
  }
}

LayerCost BatchNorm2d::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  return LayerCost{8 * n, 12 * n, 4 * 3 * n, 4 * 5 * n};
}

int64_t BatchNorm2d::WorkspaceBytes(int64_t batch) const {
  // Scale/shift gradients when accumulating, and dx when the caller wants none.
  return 2 * cpu::AlignWorkspace(channels_ * 4) +
         cpu::AlignWorkspace(batch * input_shape().elements() * 4);
}

const BatchNorm2d::Primitives& BatchNorm2d::Get(int64_t batch) const {
  return cache_->primitives.Get(batch, [&] {
    const Shape& in = input_shape();
    Primitives p;
    p.data = cpu::PlainF32({batch, in[2], in[0], in[1]}, tag::nhwc);
    p.channel = cpu::PlainF32({in[2]}, tag::a);
    dnnl::batch_normalization_forward::primitive_desc training(
        dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_training, p.data, epsilon_,
                                                kScaleShift),
        cpu::UserScratchpad(), cpu::CpuEngine());
    p.training = dnnl::batch_normalization_forward(training);
    p.inference =
        dnnl::batch_normalization_forward(dnnl::batch_normalization_forward::primitive_desc(
            dnnl::batch_normalization_forward::desc(dnnl::prop_kind::forward_inference, p.data,
                                                    epsilon_,
                                                    kScaleShift | flags::use_global_stats),
            cpu::UserScratchpad(), cpu::CpuEngine()));
    p.backward =
        dnnl::batch_normalization_backward(dnnl::batch_normalization_backward::primitive_desc(
            dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, p.data, p.data,
                                                     epsilon_, kScaleShift),
            cpu::UserScratchpad(), cpu::CpuEngine(), training));
    return p;
  });
}

void BatchNorm2d::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                          void* saved) const {
  float* mean = static_cast<float*>(saved);
  float* variance = mean + channels_;
  float* running_mean = ctx.buffers;
  float* running_var = ctx.buffers + channels_;
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    const cuda::BatchNormGeometry g{x.elements() / channels_, channels_, epsilon_};
    const float* scale = ctx.params;
    const float* shift = ctx.params + channels_;
    if (!ctx.training) {
      ctx.cuda->Check(cuda::BatchNormForwardInference(ctx.cuda, g, x.f32(), y.f32(), scale, shift,
                                                      running_mean, running_var));
      return;
    }
    // cuDNN saves the inverse standard deviation where the CPU saves the variance;
    // BatchNormFinishForward turns it into the variance and updates the running
    // statistics with the CPU's formula below.
    if (!ctx.cuda->Check(cuda::BatchNormForwardTraining(ctx.cuda, g, x.f32(), y.f32(), scale, shift,
                                                        mean, variance))) {
      return;
    }
    const double n = static_cast<double>(g.rows);
    const float unbias = n > 1 ? static_cast<float>(n / (n - 1)) : 1.0f;
    ctx.cuda->Check(cuda::BatchNormFinishForward(
                        variance, mean, running_mean, running_var, channels_, epsilon_,
                        ctx.recompute ? 0.0f : Momentum(ctx), unbias, ctx.cuda->stream),
                    "BatchNormFinishForward");
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, cpu::Wrap(p.data, x.data)},
      {DNNL_ARG_DST, cpu::Wrap(p.data, y.data)},
      {DNNL_ARG_SCALE, cpu::Wrap(p.channel, ctx.params)},
      {DNNL_ARG_SHIFT, cpu::Wrap(p.channel, ctx.params + channels_)}};
  if (!ctx.training) {
    args.emplace(DNNL_ARG_MEAN, cpu::Wrap(p.channel, running_mean));
    args.emplace(DNNL_ARG_VARIANCE, cpu::Wrap(p.channel, running_var));
    cpu::Execute(p.inference, args);
    return;
  }
  args.emplace(DNNL_ARG_MEAN, cpu::Wrap(p.channel, mean));
  args.emplace(DNNL_ARG_VARIANCE, cpu::Wrap(p.channel, variance));
  cpu::Execute(p.training, args);
  // PyTorch's running statistics: the variance is the unbiased estimate.
  if (ctx.recompute) return;  // The first run already updated the running statistics.
  const float momentum = Momentum(ctx);
  const double n = static_cast<double>(x.elements() / channels_);
  const float unbias = n > 1 ? static_cast<float>(n / (n - 1)) : 1.0f;
  for (int64_t c = 0; c < channels_; ++c) {
    running_mean[c] = (1 - momentum) * running_mean[c] + momentum * mean[c];
    running_var[c] = (1 - momentum) * running_var[c] + momentum * variance[c] * unbias;
  }
}

void BatchNorm2d::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&,
                           const void* saved, const Tensor& dy, const Tensor& dx) const {
  const float* mean = static_cast<const float*>(saved);
  char* ws = static_cast<char*>(ctx.workspace);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // Workspace: cuDNN's inverse standard deviation, then dx when the caller
    // wants none (cuDNN always writes one); within the CPU's layout.
    const cuda::BatchNormGeometry g{x.elements() / channels_, channels_, epsilon_};
    float* inv_std = reinterpret_cast<float*>(ws);
    float* diff_src = dx.data != nullptr
                          ? dx.f32()
                          : reinterpret_cast<float*>(ws + 2 * cpu::AlignWorkspace(channels_ * 4));
    if (ctx.cuda->Check(
            cuda::BatchNormInvStd(inv_std, mean + channels_, channels_, epsilon_, ctx.cuda->stream),
            "BatchNormInvStd")) {
      ctx.cuda->Check(cuda::BatchNormBackward(ctx.cuda, g, x.f32(), dy.f32(), ctx.params, mean,
                                              inv_std, diff_src, ctx.grads, ctx.grads + channels_,
                                              ctx.accumulate_grads));
    }
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  float* diff_scale = ctx.accumulate_grads ? reinterpret_cast<float*>(ws) : ctx.grads;
  float* diff_shift = ctx.accumulate_grads
                          ? reinterpret_cast<float*>(ws + cpu::AlignWorkspace(channels_ * 4))
                          : ctx.grads + channels_;
  void* diff_src = dx.data != nullptr ? dx.data : ws + 2 * cpu::AlignWorkspace(channels_ * 4);
  cpu::Execute(p.backward, {{DNNL_ARG_SRC, cpu::Wrap(p.data, x.data)},
                            {DNNL_ARG_MEAN, cpu::Wrap(p.channel, mean)},
                            {DNNL_ARG_VARIANCE, cpu::Wrap(p.channel, mean + channels_)},
                            {DNNL_ARG_DIFF_DST, cpu::Wrap(p.data, dy.data)},
                            {DNNL_ARG_SCALE, cpu::Wrap(p.channel, ctx.params)},
                            {DNNL_ARG_SHIFT, cpu::Wrap(p.channel, ctx.params + channels_)},
                            {DNNL_ARG_DIFF_SRC, cpu::Wrap(p.data, diff_src)},
                            {DNNL_ARG_DIFF_SCALE, cpu::Wrap(p.channel, diff_scale)},
                            {DNNL_ARG_DIFF_SHIFT, cpu::Wrap(p.channel, diff_shift)}});
  if (ctx.accumulate_grads) {
    cpu::CopyOrAccumulate(diff_scale, ctx.grads, channels_, true);
    cpu::CopyOrAccumulate(diff_shift, ctx.grads + channels_, channels_, true);
  }
}

// ---------------------------------------------------------------------------
// LayerNorm

struct LayerNorm::Primitives {
  memory::desc data, stat, channel;
  dnnl::layer_normalization_forward forward;
  dnnl::layer_normalization_backward backward;
};

struct LayerNorm::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

LayerNorm::LayerNorm(float epsilon) : epsilon_(epsilon), cache_(std::make_unique<Cache>()) {}
LayerNorm::~LayerNorm() = default;

absl::StatusOr<Shape> LayerNorm::InferOutput(const Shape& input) {
  if (input.rank() < 1 || input.dim(-1) <= 0) {
    return absl::InvalidArgumentError("needs a non-empty last dimension");
  }
  if (!(epsilon_ > 0)) return absl::InvalidArgumentError("epsilon must be > 0");
  width_ = input.dim(-1);
  return input;
}

std::vector<ParamSpec> LayerNorm::Params() const {
  return {{"weight", Shape({width_})}, {"bias", Shape({width_})}};
}

void LayerNorm::Initialize(float* params, float*, uint64_t, uint64_t) const {
  for (int64_t c = 0; c < width_; ++c) {
    params[c] = 1.0f;
    params[width_ + c] = 0.0f;
  }
}

LayerCost LayerNorm::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  return LayerCost{8 * n, 14 * n, 4 * 2 * n, 4 * 4 * n};
}

int64_t LayerNorm::WorkspaceBytes(int64_t batch) const {
  return 2 * cpu::AlignWorkspace(width_ * 4) +
         cpu::AlignWorkspace(batch * input_shape().elements() * 4);
}

const LayerNorm::Primitives& LayerNorm::Get(int64_t batch) const {
  return cache_->primitives.Get(batch, [&] {
    Primitives p;
    const int64_t rows = Rows(batch);
    // In bf16 (io_dtype): bf16 data in and out; the statistics, the scale and
    // shift and their gradients stay fp32, as does oneDNN's arithmetic.
    p.data = io_dtype() == DType::kBF16
                 ? memory::desc({rows, width_}, memory::data_type::bf16, tag::ab)
                 : cpu::PlainF32({rows, width_}, tag::ab);
    p.stat = cpu::PlainF32({rows}, tag::a);
    p.channel = cpu::PlainF32({width_}, tag::a);
    dnnl::layer_normalization_forward::primitive_desc fwd(
        dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, p.data, p.stat,
                                                epsilon_, kScaleShift),
        cpu::UserScratchpad(), cpu::CpuEngine());
    p.forward = dnnl::layer_normalization_forward(fwd);
    p.backward =
        dnnl::layer_normalization_backward(dnnl::layer_normalization_backward::primitive_desc(
            dnnl::layer_normalization_backward::desc(dnnl::prop_kind::backward, p.data, p.data,
                                                     p.stat, epsilon_, kScaleShift),
            cpu::UserScratchpad(), cpu::CpuEngine(), fwd));
    return p;
  });
}

void LayerNorm::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                        void* saved) const {
  float* mean = static_cast<float*>(saved);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // In bf16 the fp32 kernel runs between a widening and a rounding, in the
    // context's scratch.
    const int64_t rows = Rows(x.batch()), n = x.elements();
    float* tmp =
        io_dtype() == DType::kBF16 ? static_cast<float*>(ctx.cuda->Scratch(2 * n * 4)) : nullptr;
    const float* in = device_ops::WidenedIfBf16(ctx, x, tmp);
    float* out = tmp != nullptr ? tmp + n : y.f32();
    ctx.cuda->Check(
        cuda::LayerNormForward(out, mean, mean + rows, in, ctx.params, ctx.params + width_, rows,
                               width_, epsilon_, ctx.cuda->stream),
        "LayerNormForward");
    device_ops::RoundedIfBf16(ctx, out, y);
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  cpu::Execute(p.forward, {{DNNL_ARG_SRC, cpu::Wrap(p.data, x.data)},
                           {DNNL_ARG_DST, cpu::Wrap(p.data, y.data)},
                           {DNNL_ARG_SCALE, cpu::Wrap(p.channel, ctx.params)},
                           {DNNL_ARG_SHIFT, cpu::Wrap(p.channel, ctx.params + width_)},
                           {DNNL_ARG_MEAN, cpu::Wrap(p.stat, mean)},
                           {DNNL_ARG_VARIANCE, cpu::Wrap(p.stat, mean + Rows(x.batch()))}});
}

void LayerNorm::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void* saved,
                         const Tensor& dy, const Tensor& dx) const {
  const float* mean = static_cast<const float*>(saved);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // No workspace: the kernels skip dx when the caller wants none and add into
    // the parameter gradients directly.
    const int64_t rows = Rows(x.batch()), n = x.elements();
    float* tmp =
        io_dtype() == DType::kBF16 ? static_cast<float*>(ctx.cuda->Scratch(3 * n * 4)) : nullptr;
    const float* in = device_ops::WidenedIfBf16(ctx, x, tmp);
    const float* grad = device_ops::WidenedIfBf16(ctx, dy, tmp != nullptr ? tmp + n : nullptr);
    float* out = tmp != nullptr && dx.data != nullptr ? tmp + 2 * n : dx.f32();
    ctx.cuda->Check(cuda::LayerNormBackward(out, ctx.grads, ctx.grads + width_, grad, in,
                                            ctx.params, mean, mean + rows, rows, width_, epsilon_,
                                            ctx.accumulate_grads, ctx.cuda->stream),
                    "LayerNormBackward");
    if (dx.data != nullptr) device_ops::RoundedIfBf16(ctx, out, dx);
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  char* ws = static_cast<char*>(ctx.workspace);
  float* diff_scale = ctx.accumulate_grads ? reinterpret_cast<float*>(ws) : ctx.grads;
  float* diff_shift = ctx.accumulate_grads
                          ? reinterpret_cast<float*>(ws + cpu::AlignWorkspace(width_ * 4))
                          : ctx.grads + width_;
  void* diff_src = dx.data != nullptr ? dx.data : ws + 2 * cpu::AlignWorkspace(width_ * 4);
  cpu::Execute(p.backward, {{DNNL_ARG_SRC, cpu::Wrap(p.data, x.data)},
                            {DNNL_ARG_MEAN, cpu::Wrap(p.stat, mean)},
                            {DNNL_ARG_VARIANCE, cpu::Wrap(p.stat, mean + Rows(x.batch()))},
                            {DNNL_ARG_DIFF_DST, cpu::Wrap(p.data, dy.data)},
                            {DNNL_ARG_SCALE, cpu::Wrap(p.channel, ctx.params)},
                            {DNNL_ARG_SHIFT, cpu::Wrap(p.channel, ctx.params + width_)},
                            {DNNL_ARG_DIFF_SRC, cpu::Wrap(p.data, diff_src)},
                            {DNNL_ARG_DIFF_SCALE, cpu::Wrap(p.channel, diff_scale)},
                            {DNNL_ARG_DIFF_SHIFT, cpu::Wrap(p.channel, diff_shift)}});
  if (ctx.accumulate_grads) {
    cpu::CopyOrAccumulate(diff_scale, ctx.grads, width_, true);
    cpu::CopyOrAccumulate(diff_shift, ctx.grads + width_, width_, true);
  }
}

}  // namespace tandem
