#include "runtime/layers/device_ops.h"

#include "runtime/cpu/kernels.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/blas.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/kernels/activation.h"
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/elementwise.h"
#endif

namespace tandem::device_ops {

// On CUDA: run `call` (a cudaError_t launch named `what`, or an absl::Status
// with what omitted), record a failure in ctx.cuda, and return.
#ifdef TANDEM_HAVE_CUDA
#define TANDEM_ON_CUDA(ctx, ...)           \
  if ((ctx).device == DeviceKind::kCuda) { \
    (ctx).cuda->Check(__VA_ARGS__);        \
    return;                                \
  }
#else
#define TANDEM_ON_CUDA(ctx, ...)
#endif

void Matmul(const LayerContext& ctx, const cpu::MatmulShape& shape, const float* a, const float* b,
            float* c, const float* bias) {
  TANDEM_ON_CUDA(ctx, cuda::Matmul(ctx.cuda, shape, a, b, c, bias));
  cpu::Matmul(shape, a, b, c, bias);
}

void ToBf16(const LayerContext& ctx, const float* x, uint16_t* out, int64_t n) {
  TANDEM_ON_CUDA(ctx, cuda::ToBf16(x, out, n, ctx.cuda->stream), "ToBf16");
  cpu::ToBf16(x, out, n);
}

void FromBf16(const LayerContext& ctx, const uint16_t* x, float* out, int64_t n) {
  TANDEM_ON_CUDA(ctx, cuda::FromBf16(x, out, n, ctx.cuda->stream), "FromBf16");
  cpu::FromBf16(x, out, n);
}

void MatmulBf16(const LayerContext& ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                const uint16_t* b, float* c, const float* bias) {
  TANDEM_ON_CUDA(ctx, cuda::MatmulBf16(ctx.cuda, shape, a, b, c, bias));
  cpu::MatmulBf16(shape, a, b, c, bias);
}

void ToHalf(const LayerContext& ctx, DType half, const float* x, uint16_t* out, int64_t n) {
  if (half == DType::kBF16) {
    ToBf16(ctx, x, out, n);
    return;
  }
  TANDEM_ON_CUDA(ctx, cuda::ToF16(x, out, n, ctx.cuda->stream), "ToF16");
  cpu::ToF16(x, out, n);
}

void MatmulHalf(const LayerContext& ctx, DType half, const cpu::MatmulShape& shape,
                const uint16_t* a, const uint16_t* b, float* c, const float* bias) {
  if (half == DType::kBF16) {
    MatmulBf16(ctx, shape, a, b, c, bias);
    return;
  }
  TANDEM_ON_CUDA(ctx, cuda::MatmulF16(ctx.cuda, shape, a, b, c, bias));
  cpu::MatmulF16(shape, a, b, c, bias);
}

#ifdef TANDEM_HAVE_CUDA
namespace {

// `floats` floats of the context's scratch: a bf16 operand widened, or a
// product before its rounding.
float* Scratch(const LayerContext& ctx, int64_t floats) {
  return static_cast<float*>(ctx.cuda->Scratch(floats * 4));
}

}  // namespace
#endif

void MatmulBf16ToBf16(const LayerContext& ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                      const uint16_t* b, uint16_t* c, const float* bias) {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    const int64_t n = shape.batch * shape.m * shape.n;
    float* tmp = Scratch(ctx, n);
    if (ctx.cuda->Check(cuda::MatmulBf16(ctx.cuda, shape, a, b, tmp, bias))) {
      ctx.cuda->Check(cuda::ToBf16(tmp, c, n, ctx.cuda->stream), "ToBf16");
    }
    return;
  }
#endif
  cpu::MatmulBf16ToBf16(shape, a, b, c, bias);
}

void ColumnSumBf16(const LayerContext& ctx, const uint16_t* dy, int64_t rows, int64_t cols,
                   float* db, bool accumulate) {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    float* tmp = Scratch(ctx, rows * cols);
    if (ctx.cuda->Check(cuda::FromBf16(dy, tmp, rows * cols, ctx.cuda->stream), "FromBf16")) {
      ctx.cuda->Check(cuda::ColumnSum(db, tmp, rows, cols, accumulate, ctx.cuda->stream),
                      "ColumnSum");
    }
    return;
  }
#endif
  cpu::ColumnSumBf16(dy, rows, cols, db, accumulate);
}

void AccumulateBf16(const LayerContext& ctx, const uint16_t* a, float* out, int64_t n) {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    float* tmp = Scratch(ctx, n);
    if (ctx.cuda->Check(cuda::FromBf16(a, tmp, n, ctx.cuda->stream), "FromBf16")) {
      ctx.cuda->Check(cuda::CopyOrAccumulate(out, tmp, n, true, ctx.cuda->stream),
                      "CopyOrAccumulate");
    }
    return;
  }
#endif
  cpu::AccumulateBf16(a, out, n);
}

float* WidenedIfBf16(const LayerContext& ctx, const Tensor& t, float* tmp) {
  if (t.dtype != DType::kBF16) return t.f32();
  FromBf16(ctx, static_cast<const uint16_t*>(t.data), tmp, t.elements());
  return tmp;
}

void RoundedIfBf16(const LayerContext& ctx, const float* f32, const Tensor& out) {
  if (out.dtype == DType::kBF16) {
    ToBf16(ctx, f32, static_cast<uint16_t*>(out.data), out.elements());
  }
}

void ColumnSum(const LayerContext& ctx, const float* dy, int64_t rows, int64_t cols, float* db,
               bool accumulate) {
  TANDEM_ON_CUDA(ctx, cuda::ColumnSum(db, dy, rows, cols, accumulate, ctx.cuda->stream),
                 "ColumnSum");
  cpu::ColumnSum(dy, rows, cols, db, accumulate);
}

void Add(const LayerContext& ctx, const float* a, const float* b, float* out, int64_t n) {
  TANDEM_ON_CUDA(ctx, cuda::AddForward(out, a, b, n, ctx.cuda->stream), "AddForward");
  cpu::Add(a, b, out, n);
}

void CopyOrAccumulate(const LayerContext& ctx, const float* a, float* out, int64_t n,
                      bool accumulate) {
  TANDEM_ON_CUDA(ctx, cuda::CopyOrAccumulate(out, a, n, accumulate, ctx.cuda->stream),
                 "CopyOrAccumulate");
  cpu::CopyOrAccumulate(a, out, n, accumulate);
}

// The mask's element offset: this call's first sample within the whole batch.
uint64_t DropoutOffset(const LayerContext& ctx) { return ctx.sample_offset * ctx.sample_elements; }

void DropoutForward(const LayerContext& ctx, const float* x, float* y, int64_t n, float p) {
  const uint64_t offset = DropoutOffset(ctx);
  TANDEM_ON_CUDA(
      ctx, cuda::DropoutForward(y, x, n, p, ctx.seed, ctx.rng_stream, ctx.cuda->stream, offset),
      "DropoutForward");
  cpu::DropoutForward(x, y, n, p, ctx.seed, ctx.rng_stream, offset);
}

void DropoutBackward(const LayerContext& ctx, const float* dy, float* dx, int64_t n, float p) {
  const uint64_t offset = DropoutOffset(ctx);
  TANDEM_ON_CUDA(
      ctx, cuda::DropoutBackward(dx, dy, n, p, ctx.seed, ctx.rng_stream, ctx.cuda->stream, offset),
      "DropoutBackward");
  cpu::DropoutBackward(dy, dx, n, p, ctx.seed, ctx.rng_stream, offset);
}

void SplitHeads(const LayerContext& ctx, const float* qkv, float* q, float* k, float* v, int64_t B,
                int64_t T, int64_t H, int64_t hs) {
  TANDEM_ON_CUDA(ctx, cuda::SplitHeads(q, k, v, qkv, B, T, H, hs, ctx.cuda->stream), "SplitHeads");
  cpu::SplitHeads(qkv, q, k, v, B, T, H, hs);
}

void MergeHeadGradients(const LayerContext& ctx, const float* dq, const float* dk, const float* dv,
                        float* dqkv, int64_t B, int64_t T, int64_t H, int64_t hs) {
  TANDEM_ON_CUDA(ctx, cuda::MergeHeadGradients(dqkv, dq, dk, dv, B, T, H, hs, ctx.cuda->stream),
                 "MergeHeadGradients");
  cpu::MergeHeadGradients(dq, dk, dv, dqkv, B, T, H, hs);
}

void HeadsToRows(const LayerContext& ctx, const float* in, float* out, int64_t B, int64_t T,
                 int64_t H, int64_t hs) {
  TANDEM_ON_CUDA(ctx, cuda::HeadsToRows(out, in, B, T, H, hs, ctx.cuda->stream), "HeadsToRows");
  cpu::HeadsToRows(in, out, B, T, H, hs);
}

void RowsToHeads(const LayerContext& ctx, const float* in, float* out, int64_t B, int64_t T,
                 int64_t H, int64_t hs) {
  TANDEM_ON_CUDA(ctx, cuda::RowsToHeads(out, in, B, T, H, hs, ctx.cuda->stream), "RowsToHeads");
  cpu::RowsToHeads(in, out, B, T, H, hs);
}

}  // namespace tandem::device_ops
