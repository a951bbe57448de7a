// Layout kernels of multi-head attention, each forward next to its backward,
// launched on a caller's stream. C = NH * HS (heads times head size). CPU
// references: cpu::SplitHeads, MergeHeadGradients, HeadsToRows, RowsToHeads. The
// GEMMs of attention run on cuBLAS (blas.h) and its softmax in softmax.h. Pure
// copies, so results are bitwise the CPU's. Only in CUDA builds. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_ATTENTION_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_ATTENTION_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// qkv [B, T, 3C] -> q, k, v each [B, NH, T, HS]:
//   q[b, h, t, d] = qkv[b, t, h*HS + d], k from column C + ..., v from 2C + ...
cudaError_t SplitHeads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                       int64_t NH, int64_t HS, cudaStream_t stream);
// Its backward: dq, dk, dv [B, NH, T, HS] -> dqkv [B, T, 3C].
cudaError_t MergeHeadGradients(float* dqkv, const float* dq, const float* dk, const float* dv,
                               int64_t B, int64_t T, int64_t NH, int64_t HS, cudaStream_t stream);

// [B, NH, T, HS] -> [B, T, C] (the heads' outputs side by side), and back (its
// backward).
cudaError_t HeadsToRows(float* out, const float* inp, int64_t B, int64_t T, int64_t NH, int64_t HS,
                        cudaStream_t stream);
cudaError_t RowsToHeads(float* out, const float* inp, int64_t B, int64_t T, int64_t NH, int64_t HS,
                        cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_ATTENTION_H_
