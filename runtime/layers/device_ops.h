// The operations several layers share that have a kernel on every device: GEMM,
// bias gradient, residual adds and copies, dropout and attention's layout
// permutes. Each runs where ctx.device says: the CPU kernels (cpu/) for kCpu and
// kEmulated, the CUDA kernels (cuda/) on ctx.cuda's stream for kCuda, with
// failures recorded in ctx.cuda (see cuda/context.h). Layers whose CPU path is a
// oneDNN primitive (activations, norms, convolution, pooling, softmax) branch on
// the device themselves. Thread-safe as the kernels are.
#ifndef TANDEM_RUNTIME_LAYERS_DEVICE_OPS_H_
#define TANDEM_RUNTIME_LAYERS_DEVICE_OPS_H_

#include <cstdint>

#include "runtime/cpu/matmul.h"
#include "runtime/layers/layer.h"

namespace tandem::device_ops {

// cpu::Matmul's contract, on either device (cuBLAS on CUDA).
void Matmul(const LayerContext& ctx, const cpu::MatmulShape& shape, const float* a, const float* b,
            float* c, const float* bias = nullptr);
// out[i] = x[i] rounded to bfloat16 (cpu::ToBf16's rounding on every device).
void ToBf16(const LayerContext& ctx, const float* x, uint16_t* out, int64_t n);
// out[i] = x[i] widened from bfloat16 (exact), on every device.
void FromBf16(const LayerContext& ctx, const uint16_t* x, float* out, int64_t n);
// cpu::MatmulBf16's contract, on either device (cuBLAS's bf16 tensor-core GEMM
// with fp32 accumulation on CUDA).
void MatmulBf16(const LayerContext& ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                const uint16_t* b, float* c, const float* bias = nullptr);
// out[i] = x[i] rounded to `half` (kBF16 or kF16: ToBf16, or cpu::ToF16's
// rounding on every device).
void ToHalf(const LayerContext& ctx, DType half, const float* x, uint16_t* out, int64_t n);
// MatmulBf16, or the same from fp16 operands (cpu::MatmulF16; cuBLAS's fp16
// tensor-core GEMM with fp32 accumulation on CUDA), as `half` says.
void MatmulHalf(const LayerContext& ctx, DType half, const cpu::MatmulShape& shape,
                const uint16_t* a, const uint16_t* b, float* c, const float* bias = nullptr);
// MatmulBf16 writing C in bfloat16 (cpu::MatmulBf16ToBf16's contract; on
// CUDA the fp32 product goes through the context's scratch and is rounded
// there). No accumulate; on CUDA a dense C.
void MatmulBf16ToBf16(const LayerContext& ctx, const cpu::MatmulShape& shape, const uint16_t* a,
                      const uint16_t* b, uint16_t* c, const float* bias = nullptr);
// ColumnSum of a bfloat16 dy, summed in fp32.
void ColumnSumBf16(const LayerContext& ctx, const uint16_t* dy, int64_t rows, int64_t cols,
                   float* db, bool accumulate);
// out[i] += a[i] widened from bfloat16.
void AccumulateBf16(const LayerContext& ctx, const uint16_t* a, float* out, int64_t n);
// A bf16 tensor widened into `tmp` (which then holds t.elements() floats),
// or an fp32 tensor's own data.
float* WidenedIfBf16(const LayerContext& ctx, const Tensor& t, float* tmp);
// A bf16 `out` rounded from its fp32 form `f32`; nothing for an fp32 `out`.
void RoundedIfBf16(const LayerContext& ctx, const float* f32, const Tensor& out);
// db[j] (+)= sum_i dy[i, j], dy [rows, cols].
void ColumnSum(const LayerContext& ctx, const float* dy, int64_t rows, int64_t cols, float* db,
               bool accumulate);
// out = a + b.
void Add(const LayerContext& ctx, const float* a, const float* b, float* out, int64_t n);
// out (+)= a.
void CopyOrAccumulate(const LayerContext& ctx, const float* a, float* out, int64_t n,
                      bool accumulate);
// Inverted dropout with the counter-based mask of (ctx.seed, ctx.rng_stream);
// the same mask on every device.
void DropoutForward(const LayerContext& ctx, const float* x, float* y, int64_t n, float p);
void DropoutBackward(const LayerContext& ctx, const float* dy, float* dx, int64_t n, float p);
// Attention layouts, as cpu::SplitHeads and friends.
void SplitHeads(const LayerContext& ctx, const float* qkv, float* q, float* k, float* v, int64_t B,
                int64_t T, int64_t H, int64_t hs);
void MergeHeadGradients(const LayerContext& ctx, const float* dq, const float* dk, const float* dv,
                        float* dqkv, int64_t B, int64_t T, int64_t H, int64_t hs);
void HeadsToRows(const LayerContext& ctx, const float* in, float* out, int64_t B, int64_t T,
                 int64_t H, int64_t hs);
void RowsToHeads(const LayerContext& ctx, const float* in, float* out, int64_t B, int64_t T,
                 int64_t H, int64_t hs);

}  // namespace tandem::device_ops

#endif  // TANDEM_RUNTIME_LAYERS_DEVICE_OPS_H_
