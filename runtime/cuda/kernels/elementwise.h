// Elementwise CUDA kernels on fp32 buffers, launched on a caller's stream. Shapes
// are flat element counts `n`. Only declared in CUDA builds (TANDEM_HAVE_CUDA).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_

#include <cstdint>

#include <cuda_runtime.h>

namespace tandem::cuda {

// out[i] = value, for i < n.
cudaError_t FillF32(float* out, float value, int64_t n, cudaStream_t stream);
// x[i] *= scale, for i < n.
cudaError_t ScaleF32(float* x, float scale, int64_t n, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_
