#include "runtime/cuda/kernels/batchnorm.h"
#include "runtime/cuda/kernels/device_util.h"

namespace tandem::cuda {
namespace {

__global__ void FinishForwardKernel(float* inv_std_to_var, const float* mean, float* running_mean,
                                    float* running_var, int64_t C, float eps, float momentum,
                                    float unbias) {
  TANDEM_GRID_STRIDE_LOOP(c, C) {
    const float s = inv_std_to_var[c];
    const float var = fmaxf(1.0f / (s * s) - eps, 0.0f);
    inv_std_to_var[c] = var;
    // Rounded like the CPU's loop: products, then the sum (no contraction).
    running_mean[c] =
        __fadd_rn(__fmul_rn(1.0f - momentum, running_mean[c]), __fmul_rn(momentum, mean[c]));
    running_var[c] = __fadd_rn(__fmul_rn(1.0f - momentum, running_var[c]),
                               __fmul_rn(__fmul_rn(momentum, var), unbias));
  }
}

__global__ void InvStdKernel(float* inv_std, const float* var, int64_t C, float eps) {
  TANDEM_GRID_STRIDE_LOOP(c, C) inv_std[c] = 1.0f / sqrtf(var[c] + eps);
}

}  // namespace

cudaError_t BatchNormFinishForward(float* inv_std_to_var, const float* mean, float* running_mean,
                                   float* running_var, int64_t C, float eps, float momentum,
                                   float unbias, cudaStream_t stream) {
  FinishForwardKernel<<<GridSize(C), kBlockSize, 0, stream>>>(
      inv_std_to_var, mean, running_mean, running_var, C, eps, momentum, unbias);
  return cudaGetLastError();
}

cudaError_t BatchNormInvStd(float* inv_std, const float* var, int64_t C, float eps,
                            cudaStream_t stream) {
  InvStdKernel<<<GridSize(C), kBlockSize, 0, stream>>>(inv_std, var, C, eps);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
