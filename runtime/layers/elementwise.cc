#include "runtime/layers/elementwise.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"
#include "runtime/layers/device_ops.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/kernels/activation.h"
#endif

namespace tandem {

struct Activation::Primitives {
  dnnl::memory::desc md;
  dnnl::eltwise_forward forward;
  dnnl::eltwise_backward backward;
};

struct Activation::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

Activation::Activation(ActivationKind activation)
    : activation_(activation), cache_(std::make_unique<Cache>()) {}

Activation::~Activation() = default;

const char* Activation::kind() const {
  return activation_ == ActivationKind::kRelu ? "relu" : "gelu";
}

LayerCost Activation::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  LayerCost cost;
  cost.forward_flops = activation_ == ActivationKind::kRelu ? n : 15 * n;
  cost.backward_flops = activation_ == ActivationKind::kRelu ? n : 20 * n;
  cost.forward_bytes = 8 * n;
  cost.backward_bytes = 12 * n;
  return cost;
}

const Activation::Primitives& Activation::Get(int64_t elements) const {
  const bool bf16 = io_dtype() == DType::kBF16;
  return cache_->primitives.Get(elements, [&] {
    // ReLU's backward reads its output (y), GELU's its input (x).
    const auto alg = activation_ == ActivationKind::kRelu
                         ? dnnl::algorithm::eltwise_relu_use_dst_for_bwd
                         : dnnl::algorithm::eltwise_gelu_tanh;
    Primitives p;
    // In bf16 (io_dtype): bf16 in and out, fp32 math inside oneDNN.
    p.md = bf16 ? dnnl::memory::desc({elements}, dnnl::memory::data_type::bf16,
                                     dnnl::memory::format_tag::a)
                : cpu::PlainF32({elements}, dnnl::memory::format_tag::a);
    dnnl::eltwise_forward::primitive_desc fwd(
        dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, p.md, 0.0f, 0.0f),
        cpu::UserScratchpad(), cpu::CpuEngine());
    dnnl::eltwise_backward::primitive_desc bwd(
        dnnl::eltwise_backward::desc(alg, p.md, p.md, 0.0f, 0.0f), cpu::UserScratchpad(),
        cpu::CpuEngine(), fwd);
    p.forward = dnnl::eltwise_forward(fwd);
    p.backward = dnnl::eltwise_backward(bwd);
    return p;
  });
}

void Activation::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // In bf16 (io_dtype) the fp32 kernels run between a widening and a
    // rounding, in the context's scratch.
    const int64_t n = x.elements();
    float* tmp =
        io_dtype() == DType::kBF16 ? static_cast<float*>(ctx.cuda->Scratch(2 * n * 4)) : nullptr;
    const float* in = device_ops::WidenedIfBf16(ctx, x, tmp);
    float* out = tmp != nullptr ? tmp + n : y.f32();
    cudaStream_t stream = ctx.cuda->stream;
    if (activation_ == ActivationKind::kRelu) {
      ctx.cuda->Check(cuda::ReluForward(out, in, n, stream), "ReluForward");
    } else {
      ctx.cuda->Check(cuda::GeluForward(out, in, n, stream), "GeluForward");
    }
    device_ops::RoundedIfBf16(ctx, out, y);
    return;
  }
#endif
  const Primitives& p = Get(x.elements());
  cpu::Execute(p.forward,
               {{DNNL_ARG_SRC, cpu::Wrap(p.md, x.data)}, {DNNL_ARG_DST, cpu::Wrap(p.md, y.data)}});
}

void Activation::Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void*,
                          const Tensor& dy, const Tensor& dx) const {
  if (dx.data == nullptr) return;
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    const int64_t n = dy.elements();
    float* tmp =
        io_dtype() == DType::kBF16 ? static_cast<float*>(ctx.cuda->Scratch(2 * n * 4)) : nullptr;
    // ReLU reads its output, GELU its input; the gradient is computed in place
    // of dy's fp32 copy in bf16 (each element reads its own).
    const Tensor& kept = activation_ == ActivationKind::kRelu ? y : x;
    const float* in = device_ops::WidenedIfBf16(ctx, kept, tmp);
    const float* grad = device_ops::WidenedIfBf16(ctx, dy, tmp != nullptr ? tmp + n : nullptr);
    float* out = tmp != nullptr ? tmp + n : dx.f32();
    cudaStream_t stream = ctx.cuda->stream;
    if (activation_ == ActivationKind::kRelu) {
      ctx.cuda->Check(cuda::ReluBackward(out, in, grad, n, stream), "ReluBackward");
    } else {
      ctx.cuda->Check(cuda::GeluBackward(out, in, grad, n, stream), "GeluBackward");
    }
    device_ops::RoundedIfBf16(ctx, out, dx);
    return;
  }
#endif
  // Sized from dy: ReLU's callers may pass no x, since it needs only y.
  const Primitives& p = Get(dy.elements());
  const int which = activation_ == ActivationKind::kRelu ? DNNL_ARG_DST : DNNL_ARG_SRC;
  const void* kept = activation_ == ActivationKind::kRelu ? y.data : x.data;
  cpu::Execute(p.backward, {{which, cpu::Wrap(p.md, kept)},
                            {DNNL_ARG_DIFF_DST, cpu::Wrap(p.md, dy.data)},
                            {DNNL_ARG_DIFF_SRC, cpu::Wrap(p.md, dx.data)}});
}

absl::StatusOr<Shape> Dropout::InferOutput(const Shape& input) {
  if (!(p_ >= 0.0f && p_ < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("probability must be in [0, 1), got ", p_));
  }
  return input;
}

LayerCost Dropout::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  return LayerCost{2 * n, n, 8 * n, 8 * n};
}

void Dropout::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
  if (!ctx.training || p_ == 0.0f) {
    device_ops::CopyOrAccumulate(ctx, x.f32(), y.f32(), x.elements(), false);
    return;
  }
  LayerContext c = ctx;
  c.sample_elements = static_cast<uint64_t>(input_shape().elements());
  device_ops::DropoutForward(c, x.f32(), y.f32(), x.elements(), p_);
}

void Dropout::Backward(const LayerContext& ctx, const Tensor&, const Tensor&, const void*,
                       const Tensor& dy, const Tensor& dx) const {
  if (dx.data == nullptr) return;
  if (!ctx.training || p_ == 0.0f) {
    device_ops::CopyOrAccumulate(ctx, dy.f32(), dx.f32(), dy.elements(), false);
    return;
  }
  LayerContext c = ctx;
  c.sample_elements = static_cast<uint64_t>(input_shape().elements());
  device_ops::DropoutBackward(c, dy.f32(), dx.f32(), dy.elements(), p_);
}

absl::StatusOr<Shape> Flatten::InferOutput(const Shape& input) { return Shape({input.elements()}); }

LayerCost Flatten::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  return LayerCost{0, 0, 8 * n, 8 * n};
}

void Flatten::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
  device_ops::CopyOrAccumulate(ctx, x.f32(), y.f32(), x.elements(), false);
}

void Flatten::Backward(const LayerContext& ctx, const Tensor&, const Tensor&, const void*,
                       const Tensor& dy, const Tensor& dx) const {
  if (dx.data != nullptr) {
    device_ops::CopyOrAccumulate(ctx, dy.f32(), dx.f32(), dy.elements(), false);
  }
}

}  // namespace tandem
