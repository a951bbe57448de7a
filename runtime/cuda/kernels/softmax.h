// Softmax kernels, forward next to backward, launched on a caller's stream: the
// causal softmax of attention scores, and log-softmax with cross-entropy for the
// loss. CPU references: the Attention layer (CausalMask + oneDNN softmax) and the
// CrossEntropy layer (oneDNN logsoftmax). Only in CUDA builds. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_SOFTMAX_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_SOFTMAX_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Causal softmax in place over scores [BH, T, T] (BH = B * n_head), already
// scaled by 1/sqrt(hs): row i of each matrix becomes
//   att[i, j] = exp(s[i, j] - max_{k<=i} s[i, k]) / sum_{k<=i} exp(...)  for j <= i,
//   att[i, j] = 0                                                          for j > i,
// which is the CPU's mask (-inf above the diagonal) followed by softmax.
cudaError_t CausalSoftmaxForward(float* att, int64_t BH, int64_t T, cudaStream_t stream);
// Backward in place: datt[i, j] <- att[i, j] * (datt[i, j] - sum_k att[i, k] datt[i, k]).
// Positions above the diagonal get 0 (att is 0 there).
cudaError_t CausalSoftmaxBackward(float* datt, const float* att, int64_t BH, int64_t T,
                                  cudaStream_t stream);

// logp[r, v] = x[r, v] - max_v x[r, :] - log sum_v exp(x[r, v] - max), rows of V.
cudaError_t LogSoftmaxForward(float* logp, const float* logits, int64_t rows, int64_t V,
                              cudaStream_t stream);

// Cross-entropy from log-probabilities [B, P, V] and targets [B, P] (ids in
// [0, V)): losses[b] = -(1/P) sum_t logp[b, t, targets[b, t]], summed in double
// in position order, as the CPU does.
cudaError_t CrossEntropyForward(float* losses, const float* logp, const int32_t* targets, int64_t B,
                                int64_t P, int64_t V, cudaStream_t stream);
// dlogits[b, t, v] = (exp(logp[b, t, v]) - [v == target]) * dlosses[b] / P.
cudaError_t CrossEntropyBackward(float* dlogits, const float* logp, const int32_t* targets,
                                 const float* dlosses, int64_t B, int64_t P, int64_t V,
                                 cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_SOFTMAX_H_
