#include "runtime/layers/linear.h"

#include "absl/strings/str_cat.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/matmul.h"
#include "runtime/layers/carver.h"
#include "runtime/layers/device_ops.h"

namespace tandem {

absl::StatusOr<Shape> Linear::InferOutput(const Shape& input) {
  if (options_.out_features <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("out_features must be > 0, got ", options_.out_features));
  }
  if (input.rank() < 1 || input.dim(-1) <= 0) {
    return absl::InvalidArgumentError("needs an input with a non-empty last dimension");
  }
  in_ = input.dim(-1);
  std::vector<int64_t> out = input.dims();
  out.back() = options_.out_features;
  return Shape(out);
}

std::vector<ParamSpec> Linear::Params() const {
  std::vector<ParamSpec> params = {{"weight", Shape({options_.out_features, in_})}};
  if (options_.bias) params.push_back({"bias", Shape({options_.out_features})});
  return params;
}

void Linear::Initialize(float* params, float*, uint64_t seed, uint64_t stream) const {
  const int64_t nw = options_.out_features * in_;
  InitWeightAndBias(options_.init, in_, params, nw, params + nw,
                    options_.bias ? options_.out_features : 0, seed, stream);
}

LayerCost Linear::Cost(int64_t batch) const {
  const double rows = static_cast<double>(Rows(batch));
  const double in = static_cast<double>(in_), out = static_cast<double>(options_.out_features);
  LayerCost cost;
  cost.forward_flops = 2 * rows * in * out + (options_.bias ? rows * out : 0);
  // dX = dY W and dW = dY^T X, plus the bias reduction.
  cost.backward_flops = 4 * rows * in * out + (options_.bias ? rows * out : 0);
  cost.forward_bytes = 4 * (rows * in + in * out + rows * out);
  cost.backward_bytes = 4 * (2 * rows * out + 2 * rows * in + 2 * in * out);
  return cost;
}

// bf16 copies of x [rows, in], W [out, in] and dy [rows, out].
int64_t Linear::WorkspaceBytes(int64_t batch) const {
  if (compute_dtype() != DType::kBF16) return 0;
  const int64_t rows = Rows(batch), out = options_.out_features;
  return cpu::AlignWorkspace(2 * rows * in_) + cpu::AlignWorkspace(2 * out * in_) +
         cpu::AlignWorkspace(2 * rows * out);
}

namespace {

struct Bf16Copies {
  uint16_t *x, *w, *dy;
};

Bf16Copies CarveBf16(void* workspace, int64_t rows, int64_t in, int64_t out) {
  Carver c(workspace);
  Bf16Copies b;
  b.x = static_cast<uint16_t*>(c.TakeBytes(2 * rows * in));
  b.w = static_cast<uint16_t*>(c.TakeBytes(2 * out * in));
  b.dy = static_cast<uint16_t*>(c.TakeBytes(2 * rows * out));
  return b;
}

}  // namespace

void Linear::ForwardBf16(const LayerContext& ctx, const Tensor& x, const Tensor& y) const {
  const int64_t rows = Rows(x.batch()), out = options_.out_features;
  const Bf16Copies b = CarveBf16(ctx.workspace, rows, in_, out);
  device_ops::ToBf16(ctx, x.f32(), b.x, rows * in_);
  device_ops::ToBf16(ctx, ctx.params, b.w, out * in_);
  cpu::MatmulShape s;
  s.m = rows;
  s.n = out;
  s.k = in_;
  s.trans_b = true;
  s.bias = options_.bias;
  device_ops::MatmulBf16(ctx, s, b.x, b.w, y.f32(),
                         options_.bias ? ctx.params + out * in_ : nullptr);
}

void Linear::BackwardBf16(const LayerContext& ctx, const Tensor& x, const Tensor& dy,
                          const Tensor& dx) const {
  const int64_t rows = Rows(x.batch()), out = options_.out_features;
  const Bf16Copies b = CarveBf16(ctx.workspace, rows, in_, out);
  device_ops::ToBf16(ctx, dy.f32(), b.dy, rows * out);
  if (dx.data != nullptr) {
    device_ops::ToBf16(ctx, ctx.params, b.w, out * in_);
    cpu::MatmulShape s;  // dX[rows, in] = dY[rows, out] W[out, in]
    s.m = rows;
    s.n = in_;
    s.k = out;
    device_ops::MatmulBf16(ctx, s, b.dy, b.w, dx.f32());
  }
  device_ops::ToBf16(ctx, x.f32(), b.x, rows * in_);
  cpu::MatmulShape s;  // dW[out, in] (+)= dY^T[out, rows] X[rows, in]
  s.m = out;
  s.n = in_;
  s.k = rows;
  s.trans_a = true;
  s.accumulate = ctx.accumulate_grads;
  device_ops::MatmulBf16(ctx, s, b.dy, b.x, ctx.grads);
  if (options_.bias) {
    device_ops::ColumnSum(ctx, dy.f32(), rows, out, ctx.grads + out * in_, ctx.accumulate_grads);
  }
}

void Linear::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
  if (compute_dtype() == DType::kBF16) return ForwardBf16(ctx, x, y);
  cpu::MatmulShape s;
  s.m = Rows(x.batch());
  s.n = options_.out_features;
  s.k = in_;
  s.trans_b = true;  // W is [out, in]: op(B) = W^T.
  s.bias = options_.bias;
  device_ops::Matmul(ctx, s, x.f32(), ctx.params, y.f32(),
                     options_.bias ? ctx.params + s.n * s.k : nullptr);
}

void Linear::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void*,
                      const Tensor& dy, const Tensor& dx) const {
  if (compute_dtype() == DType::kBF16) return BackwardBf16(ctx, x, dy, dx);
  const int64_t rows = Rows(x.batch()), out = options_.out_features;
  if (dx.data != nullptr) {
    cpu::MatmulShape s;  // dX[rows, in] = dY[rows, out] W[out, in]
    s.m = rows;
    s.n = in_;
    s.k = out;
    device_ops::Matmul(ctx, s, dy.f32(), ctx.params, dx.f32());
  }
  cpu::MatmulShape s;  // dW[out, in] (+)= dY^T[out, rows] X[rows, in]
  s.m = out;
  s.n = in_;
  s.k = rows;
  s.trans_a = true;
  s.accumulate = ctx.accumulate_grads;
  device_ops::Matmul(ctx, s, dy.f32(), x.f32(), ctx.grads);
  if (options_.bias) {
    device_ops::ColumnSum(ctx, dy.f32(), rows, out, ctx.grads + out * in_, ctx.accumulate_grads);
  }
}

}  // namespace tandem
