#include "runtime/layers/loss.h"

#include <cmath>

#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/kernels/softmax.h"
#endif

namespace tandem {

struct CrossEntropy::Primitives {
  dnnl::memory::desc md;
  dnnl::logsoftmax_forward forward;
};

struct CrossEntropy::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

CrossEntropy::CrossEntropy() : cache_(std::make_unique<Cache>()) {}
CrossEntropy::~CrossEntropy() = default;

absl::StatusOr<Shape> CrossEntropy::InferOutput(const Shape& input) {
  if (input.rank() < 1 || input.dim(-1) < 2) {
    return absl::InvalidArgumentError("needs logits with at least 2 classes in the last dimension");
  }
  classes_ = input.dim(-1);
  positions_ = input.elements() / classes_;
  return Shape({1});
}

LayerCost CrossEntropy::Cost(int64_t batch) const {
  const double n = static_cast<double>(batch * input_shape().elements());
  return LayerCost{5 * n, 4 * n, 4 * 2 * n, 4 * 3 * n};
}

const CrossEntropy::Primitives& CrossEntropy::Get(int64_t batch) const {
  return cache_->primitives.Get(batch, [&] {
    Primitives p;
    p.md = cpu::PlainF32({batch * positions_, classes_}, dnnl::memory::format_tag::ab);
    p.forward = dnnl::logsoftmax_forward(dnnl::logsoftmax_forward::primitive_desc(
        dnnl::logsoftmax_forward::desc(dnnl::prop_kind::forward_training, p.md, 1),
        cpu::UserScratchpad(), cpu::CpuEngine()));
    return p;
  });
}

void CrossEntropy::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                           void* saved) const {
  const int64_t B = x.batch();
  float* logp = static_cast<float*>(saved);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // Targets are device memory, like every pointer of a CUDA call.
    cudaStream_t stream = ctx.cuda->stream;
    if (ctx.cuda->Check(cuda::LogSoftmaxForward(logp, x.f32(), B * positions_, classes_, stream),
                        "LogSoftmaxForward")) {
      ctx.cuda->Check(
          cuda::CrossEntropyForward(y.f32(), logp, ctx.targets, B, positions_, classes_, stream),
          "CrossEntropyForward");
    }
    return;
  }
#endif
  const Primitives& p = Get(B);
  cpu::Execute(p.forward,
               {{DNNL_ARG_SRC, cpu::Wrap(p.md, x.data)}, {DNNL_ARG_DST, cpu::Wrap(p.md, logp)}});
  const int32_t* targets = ctx.targets;
  float* loss = y.f32();
  const int64_t P = positions_, V = classes_;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    double sum = 0;
    for (int64_t t = 0; t < P; ++t) {
      const int64_t row = b * P + t;
      sum -= logp[row * V + targets[row]];
    }
    loss[b] = static_cast<float>(sum / static_cast<double>(P));
  }
}

void CrossEntropy::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&,
                            const void* saved, const Tensor& dy, const Tensor& dx) const {
  if (dx.data == nullptr) return;
  const int64_t B = x.batch(), P = positions_, V = classes_;
  const float* logp = static_cast<const float*>(saved);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    ctx.cuda->Check(cuda::CrossEntropyBackward(dx.f32(), logp, ctx.targets, dy.f32(), B, P, V,
                                               ctx.cuda->stream),
                    "CrossEntropyBackward");
    return;
  }
#endif
  const int32_t* targets = ctx.targets;
  const float* g = dy.f32();
  float* out = dx.f32();
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < B * P; ++row) {
    const float scale = g[row / P] / static_cast<float>(P);
    const float* lp = logp + row * V;
    float* d = out + row * V;
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = std::exp(lp[v]) * scale;
    d[targets[row]] -= scale;
  }
}

}  // namespace tandem
