#include "runtime/cuda/kernels/device_util.h"
#include "runtime/cuda/kernels/optimizer.h"

namespace tandem::cuda {
namespace {

// The AVX-512 path of optim::AdamUpdate, operation for operation:
//   grad  = fma(g, grad_scale, l2 * p)
//   m     = fma(beta1, m, one_minus_beta1 * grad)
//   v     = fma(beta2, v, one_minus_beta2 * (grad * grad))
//   denom = fma(sqrt(v), inv_sqrt_bc2, eps)
//   p     = fma(-step_size, m / denom, p * decay)
// The explicit intrinsics keep nvcc from contracting the plain products.
__global__ void AdamKernel(float* p, const float* g, float* m, float* v, int64_t n,
                           optim::AdamConstants c) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float pi = p[i];
    const float grad = __fmaf_rn(g[i], c.grad_scale, __fmul_rn(c.l2, pi));
    const float mi = __fmaf_rn(c.beta1, m[i], __fmul_rn(c.one_minus_beta1, grad));
    const float vi = __fmaf_rn(c.beta2, v[i], __fmul_rn(c.one_minus_beta2, __fmul_rn(grad, grad)));
    m[i] = mi;
    v[i] = vi;
    const float denom = __fmaf_rn(__fsqrt_rn(vi), c.inv_sqrt_bc2, c.eps);
    p[i] = __fmaf_rn(-c.step_size, __fdiv_rn(mi, denom), __fmul_rn(pi, c.decay));
  }
}

__global__ void SgdKernel(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                          bool nesterov, float weight_decay, float grad_scale, bool first) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float pi = p[i];
    const float grad = __fadd_rn(__fmul_rn(g[i], grad_scale), __fmul_rn(weight_decay, pi));
    if (momentum == 0.0f) {
      p[i] = __fsub_rn(pi, __fmul_rn(lr, grad));
      continue;
    }
    const float b = first ? grad : __fadd_rn(__fmul_rn(momentum, buf[i]), grad);
    buf[i] = b;
    const float d = nesterov ? __fadd_rn(grad, __fmul_rn(momentum, b)) : b;
    p[i] = __fsub_rn(pi, __fmul_rn(lr, d));
  }
}

__device__ __forceinline__ double WarpSumDouble(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void SumOfSquaresPartialKernel(double* partials, const float* x, int64_t n) {
  __shared__ double warp_sums[kBlockSize / 32];
  double acc = 0;
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const double v = x[i];
    acc += v * v;
  }
  acc = WarpSumDouble(acc);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kBlockSize / 32; ++w) total += warp_sums[w];
    partials[blockIdx.x] = total;
  }
}

__global__ void SumPartialsKernel(double* result, const double* partials, int count) {
  double total = 0;
  for (int i = 0; i < count; ++i) total += partials[i];
  *result = total;
}

}  // namespace

cudaError_t SumOfSquares(double* result, const float* x, int64_t n, double* partials,
                         cudaStream_t stream) {
  SumOfSquaresPartialKernel<<<kSumOfSquaresPartials, kBlockSize, 0, stream>>>(partials, x, n);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  SumPartialsKernel<<<1, 1, 0, stream>>>(result, partials, kSumOfSquaresPartials);
  return cudaGetLastError();
}

cudaError_t AdamUpdate(float* p, const float* g, float* m, float* v, int64_t n,
                       const optim::AdamStep& step, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  AdamKernel<<<GridSize(n), kBlockSize, 0, stream>>>(p, g, m, v, n, optim::MakeAdamConstants(step));
  return cudaGetLastError();
}

cudaError_t SgdUpdate(float* p, const float* g, float* buf, int64_t n, const optim::SgdStep& step,
                      cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SgdKernel<<<GridSize(n), kBlockSize, 0, stream>>>(p, g, buf, n, step.lr, step.momentum,
                                                    step.nesterov, step.weight_decay,
                                                    step.grad_scale, step.first_step);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
