// Activation and dropout CUDA kernels, forward next to backward, on flat fp32
// tensors of N = B*T*C elements, launched on a caller's stream. CPU references:
// the Activation layer (oneDNN eltwise) and cpu::Dropout* (cpu/kernels.h). Each
// returns the launch error. Only in CUDA builds. Thread-safe (no state).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_ACTIVATION_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_ACTIVATION_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// GELU, tanh approximation (GPT-2; PyTorch's approximate='tanh'):
//   u = sqrt(2/pi) (x + 0.044715 x^3),  y = x/2 (1 + tanh u)
//   dy/dx = (1 + tanh u)/2 + x/2 (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The backward reads the forward's input. dinp may alias dout.
cudaError_t GeluForward(float* out, const float* inp, int64_t N, cudaStream_t stream);
cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                         cudaStream_t stream);

// ReLU: y = max(x, 0); the backward reads the forward's OUTPUT (dx = dy where
// y > 0, else 0), as oneDNN's relu_use_dst_for_bwd, so x need not be kept.
// dinp may alias dout.
cudaError_t ReluForward(float* out, const float* inp, int64_t N, cudaStream_t stream);
cudaError_t ReluBackward(float* dinp, const float* out, const float* dout, int64_t N,
                         cudaStream_t stream);

// Inverted dropout with the counter-based mask of core/random.h: element i is
// kept iff u_i >= p, u_i = (Philox4x32-10(key=seed, counter=(stream, i/4))[i%4] >> 8)
// / 2^24, and kept elements are scaled by 1/(1-p) (computed in fp32 as the CPU
// does). The mask is bitwise the CPU's; the backward regenerates it.
// `offset` is the global index of element 0 (see cpu::DropoutForward).
cudaError_t DropoutForward(float* out, const float* inp, int64_t N, float p, uint64_t seed,
                           uint64_t stream_id, cudaStream_t stream, uint64_t offset = 0);
cudaError_t DropoutBackward(float* dinp, const float* dout, int64_t N, float p, uint64_t seed,
                            uint64_t stream_id, cudaStream_t stream, uint64_t offset = 0);

// For tests: the uniforms u_i of (seed, stream_id) for i < N, as the CPU's UniformAt.
cudaError_t PhiloxUniforms(float* out, int64_t N, uint64_t seed, uint64_t stream_id,
                           cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_ACTIVATION_H_
