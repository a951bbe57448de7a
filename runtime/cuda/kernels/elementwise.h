// Elementwise and reduction CUDA kernels on fp32 buffers (and the fp32 -> bf16
// rounding), launched on a
// caller's stream: fills, the residual add and its backward, bias broadcast and
// the bias gradient (column sum). Each returns the launch error (the kernel's own
// faults surface at the next synchronisation). CPU references: cpu/kernels.h.
// Only in CUDA builds (TANDEM_HAVE_CUDA). Thread-safe (no state).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// out[i] = value, for i < n.
cudaError_t FillF32(float* out, float value, int64_t n, cudaStream_t stream);
// x[i] *= scale, for i < n.
cudaError_t ScaleF32(float* x, float scale, int64_t n, cudaStream_t stream);

// out[i] = x[i] in bfloat16 (bit patterns), rounded exactly as the CPU's
// FloatToBf16 (runtime/core/bf16.h): the operands of the bf16 products (blas.h).
cudaError_t ToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
// out[i] = x[i] widened from bfloat16 (exact).
cudaError_t FromBf16(const uint16_t* x, float* out, int64_t n, cudaStream_t stream);
// out[i] = x[i] in IEEE fp16, rounded exactly as the CPU's FloatToHalf
// (runtime/core/fp16.h), NaNs included: the operands of the fp16 products.
cudaError_t ToF16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream);
// out[i] = x[i] widened from fp16 (exact).
cudaError_t FromF16(const uint16_t* x, float* out, int64_t n, cudaStream_t stream);

// Residual add, forward: out = a + b (N = B*T*C elements; any may alias).
cudaError_t AddForward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream);
// Residual add, backward for one input: dinp (+)= dout (a copy when !accumulate;
// nothing to do when dinp == dout and !accumulate).
cudaError_t CopyOrAccumulate(float* dinp, const float* dout, int64_t N, bool accumulate,
                             cudaStream_t stream);

// Bias, forward: out[b][r][c] (+)= bias[c] for r < rows, c < cols, over `batch`
// matrices of row stride ld and batch stride batch_stride (elements). Without
// accumulate the rows are overwritten with the bias.
cudaError_t BroadcastBias(float* out, const float* bias, int64_t batch, int64_t rows, int64_t cols,
                          int64_t ld, int64_t batch_stride, bool accumulate, cudaStream_t stream);
// Bias, backward: dbias[c] (+)= sum_r dout[r][c], dout [rows, cols]. The sum
// order is fixed (32 strided partial sums added in a tree), so the result is the
// same on every run, though not bitwise the CPU's.
cudaError_t ColumnSum(float* dbias, const float* dout, int64_t rows, int64_t cols, bool accumulate,
                      cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_ELEMENTWISE_H_
