// Token plus position embedding (GPT-2), forward next to backward, launched on a
// caller's stream. CPU reference: the Embedding layer. Only in CUDA builds.
// Thread-safe (no state).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_EMBEDDING_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_EMBEDDING_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// out[b, t, :] = wte[inp[b, t], :] + wpe[t, :];  inp i32 [B, T] in [0, V), out [B, T, C].
cudaError_t EmbeddingForward(float* out, const int32_t* inp, const float* wte, const float* wpe,
                             int64_t B, int64_t T, int64_t C, cudaStream_t stream);

// Backward: dwte[v, :] (+)= sum over (b, t) with inp[b, t] = v of dout[b, t, :], and
// dwpe[t, :] (+)= sum_b dout[b, t, :]; rows of dwpe at t >= T (max_positions > T)
// are zeroed (or left) like the CPU's. Deterministic without atomics: positions
// are stably sorted by token (CUB radix sort), then each token's rows are summed
// in position order, which is the CPU's order, so the result is bitwise the
// CPU's. `scratch` (device memory) must hold EmbeddingBackwardScratchBytes.
cudaError_t EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                              int64_t B, int64_t T, int64_t C, int64_t V, int64_t max_positions,
                              bool accumulate, void* scratch, size_t scratch_bytes,
                              cudaStream_t stream);
// The scratch EmbeddingBackward needs (asks CUB, so it needs a device).
cudaError_t EmbeddingBackwardScratchBytes(int64_t B, int64_t T, int64_t V, size_t* bytes);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_EMBEDDING_H_
