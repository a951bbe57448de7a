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

// Under a 16-bit compute type, forward's 16-bit copy of x [rows, in], kept for
// backward's dW product; none when x comes in bf16 (io_dtype) and comes back.
int64_t Linear::SavedBytes(int64_t batch) const {
  return IsHalf(compute_dtype()) && io_dtype() != DType::kBF16
             ? cpu::AlignWorkspace(2 * Rows(batch) * in_)
             : 0;
}

// 16-bit copies (bf16 or fp16) of W [out, in] and dy [rows, out].
int64_t Linear::WorkspaceBytes(int64_t batch) const {
  if (!IsHalf(compute_dtype())) return 0;
  return cpu::AlignWorkspace(2 * options_.out_features * in_) +
         cpu::AlignWorkspace(2 * Rows(batch) * options_.out_features);
}

namespace {

// An operand in fp32, and its 16-bit copy when the layer computes in bf16 or
// fp16 (null otherwise).
struct Operand {
  const float* f32;
  uint16_t* bf16;
};

// The 16-bit copies of x [rows, in] (in `saved`), W [out, in] and dy
// [rows, out] (in the workspace); all null in fp32.
struct Bf16Copies {
  uint16_t *x = nullptr, *w = nullptr, *dy = nullptr;
};

Bf16Copies CarveBf16(const void* saved, void* workspace, bool bf16, int64_t out, int64_t in,
                     int64_t rows) {
  Bf16Copies b;
  if (!bf16) return b;
  b.x = static_cast<uint16_t*>(const_cast<void*>(saved));
  Carver c(workspace);
  b.w = static_cast<uint16_t*>(c.TakeBytes(2 * out * in));
  b.dy = static_cast<uint16_t*>(c.TakeBytes(2 * rows * out));
  return b;
}

// Rounds `op` into its 16-bit copy, if it has one (and is not 16-bit already).
void Round(const LayerContext& ctx, DType half, const Operand& op, int64_t n) {
  if (op.bf16 != nullptr && op.f32 != nullptr) device_ops::ToHalf(ctx, half, op.f32, op.bf16, n);
}

// c (+)= a b in `half` when the operands have 16-bit copies (rounded already),
// else in fp32. A bf16 `c` (a tensor of io_dtype kBF16) is written rounded.
void Multiply(const LayerContext& ctx, DType half, const cpu::MatmulShape& s, const Operand& a,
              const Operand& b, const Tensor& c, const float* bias = nullptr) {
  if (c.dtype == DType::kBF16) {
    device_ops::MatmulBf16ToBf16(ctx, s, a.bf16, b.bf16, static_cast<uint16_t*>(c.data), bias);
  } else if (a.bf16 != nullptr) {
    device_ops::MatmulHalf(ctx, half, s, a.bf16, b.bf16, c.f32(), bias);
  } else {
    device_ops::Matmul(ctx, s, a.f32, b.f32, c.f32(), bias);
  }
}

// An activation operand: a bf16 tensor as it is, else its fp32 data and the
// 16-bit copy `copy` to round it into (null in fp32).
Operand ActivationOperand(const Tensor& t, uint16_t* copy) {
  if (t.dtype == DType::kBF16) return {nullptr, static_cast<uint16_t*>(t.data)};
  return {t.f32(), copy};
}

}  // namespace

void Linear::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void* saved) const {
  const int64_t rows = Rows(x.batch()), out = options_.out_features;
  const Bf16Copies b = CarveBf16(saved, ctx.workspace, IsHalf(compute_dtype()), out, in_, rows);
  const Operand xs = ActivationOperand(x, b.x), w{ctx.params, b.w};
  Round(ctx, compute_dtype(), xs, rows * in_);
  Round(ctx, compute_dtype(), w, out * in_);
  cpu::MatmulShape s;
  s.m = rows;
  s.n = out;
  s.k = in_;
  s.trans_b = true;  // W is [out, in]: op(B) = W^T.
  s.bias = options_.bias;
  Multiply(ctx, compute_dtype(), s, xs, w, y, options_.bias ? ctx.params + out * in_ : nullptr);
}

void Linear::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void* saved,
                      const Tensor& dy, const Tensor& dx) const {
  const int64_t rows = Rows(x.batch()), out = options_.out_features;
  const Bf16Copies b = CarveBf16(saved, ctx.workspace, IsHalf(compute_dtype()), out, in_, rows);
  const Operand dys = ActivationOperand(dy, b.dy), w{ctx.params, b.w},
                xs = ActivationOperand(x, b.x);
  Round(ctx, compute_dtype(), dys, rows * out);
  if (dx.data != nullptr) {
    Round(ctx, compute_dtype(), w, out * in_);
    cpu::MatmulShape s;  // dX[rows, in] = dY[rows, out] W[out, in]
    s.m = rows;
    s.n = in_;
    s.k = out;
    Multiply(ctx, compute_dtype(), s, dys, w, dx);
  }
  // x's 16-bit copy is forward's, in `saved`.
  cpu::MatmulShape s;  // dW[out, in] (+)= dY^T[out, rows] X[rows, in]
  s.m = out;
  s.n = in_;
  s.k = rows;
  s.trans_a = true;
  s.accumulate = ctx.accumulate_grads;
  Multiply(ctx, compute_dtype(), s, dys, xs, Tensor::F32(ctx.grads, Shape({out, in_})));
  if (!options_.bias) return;
  if (dy.dtype == DType::kBF16) {
    device_ops::ColumnSumBf16(ctx, static_cast<const uint16_t*>(dy.data), rows, out,
                              ctx.grads + out * in_, ctx.accumulate_grads);
  } else {
    device_ops::ColumnSum(ctx, dy.f32(), rows, out, ctx.grads + out * in_, ctx.accumulate_grads);
  }
}

}  // namespace tandem
