// Small fused CPU kernels the layers share where oneDNN has no primitive:
// reductions, residual adds, dropout masks, layout permutes. OpenMP-parallel over
// the outer dimension. The sums and adds are vectorised by the compiler for
// AVX-512, AVX2 or the baseline, chosen at run time (AutoVectorizedIsa,
// isa_dispatch.h). Thread-safe (no shared state).
#ifndef TANDEM_RUNTIME_CPU_KERNELS_H_
#define TANDEM_RUNTIME_CPU_KERNELS_H_

#include <cstdint>

#include "runtime/core/cpu_features.h"

namespace tandem::cpu {

// db[j] (+)= sum_i dy[i, j] for dy [rows, cols].
void ColumnSum(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate);

// out[i] = a[i] + b[i].
void Add(const float* a, const float* b, float* out, int64_t n);
// out[i] (+)= a[i].
void CopyOrAccumulate(const float* a, float* out, int64_t n, bool accumulate);
// out[i] = x[i] in bfloat16, rounded as FloatToBf16 (runtime/core/bf16.h): the
// inputs of the bf16 matrix products (matmul.h).
void ToBf16(const float* x, uint16_t* out, int64_t n);
// out[i] = x[i] widened from bfloat16 (exact): a bf16 working copy of weights,
// or a bf16 gradient, read by fp32 code.
void FromBf16(const uint16_t* x, float* out, int64_t n);
// ColumnSum of a bfloat16 dy, widened and summed in fp32 (the same order).
void ColumnSumBf16(const uint16_t* dy, int64_t rows, int64_t cols, float* db, bool accumulate);
// out[i] += x[i] widened from bfloat16.
void AccumulateBf16(const uint16_t* x, float* out, int64_t n);
// out[i] = x[i] in IEEE fp16, rounded as FloatToHalf (runtime/core/fp16.h;
// beyond 65504 it is infinity): the inputs of the fp16 matrix products.
void ToF16(const float* x, uint16_t* out, int64_t n);
// out[i] = x[i] widened from fp16 (exact).
void FromF16(const uint16_t* x, float* out, int64_t n);

// Inverted dropout with a counter-based mask: element i is kept with probability
// 1-p (Philox at (seed, stream, offset + i)) and scaled by 1/(1-p). `offset` is
// the global index of element 0, so a micro-batch or a data-parallel share gets
// the same mask as the whole batch. Backward uses the same mask, regenerated.
void DropoutForward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                    uint64_t offset = 0);
void DropoutBackward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset = 0);

// Attention layouts. qkv [B, T, 3C] -> q, k, v each [B, H, T, hs] (C = H*hs),
// and back (the backward of the split writes dqkv from dq, dk, dv).
void SplitHeads(const float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t H,
                int64_t hs);
void MergeHeadGradients(const float* dq, const float* dk, const float* dv, float* dqkv, int64_t B,
                        int64_t T, int64_t H, int64_t hs);
// [B, H, T, hs] <-> [B, T, H*hs].
void HeadsToRows(const float* in, float* out, int64_t B, int64_t T, int64_t H, int64_t hs);
void RowsToHeads(const float* in, float* out, int64_t B, int64_t T, int64_t H, int64_t hs);
// Sets scores[b, i, j] = -inf for j > i (causal mask), scores [BH, T, T].
void CausalMask(float* scores, int64_t BH, int64_t T);

// ColumnSum, Add, CopyOrAccumulate and ToBf16 at a given level instead of
// AutoVectorizedIsa(), so tests run every vector path on any CPU that has it.
// The caller checks CpuSupports(isa).
namespace internal {
void ColumnSumForIsa(CpuIsa isa, const float* dy, int64_t rows, int64_t cols, float* db,
                     bool accumulate);
void AddForIsa(CpuIsa isa, const float* a, const float* b, float* out, int64_t n);
void CopyOrAccumulateForIsa(CpuIsa isa, const float* a, float* out, int64_t n, bool accumulate);
void ToBf16ForIsa(CpuIsa isa, const float* x, uint16_t* out, int64_t n);
}  // namespace internal

// Sub-buffers carved from one workspace start on this boundary, in bytes.
constexpr int64_t kWorkspaceAlign = 64;
constexpr int64_t AlignWorkspace(int64_t bytes) {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

}  // namespace tandem::cpu

#endif  // TANDEM_RUNTIME_CPU_KERNELS_H_
