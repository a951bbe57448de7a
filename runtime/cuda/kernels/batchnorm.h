// The statistics side of BatchNorm2d on CUDA, around cuDNN's batch norm
// (cudnn_ops.h), launched on a caller's stream. cuDNN saves the batch mean and
// the inverse standard deviation 1/sqrt(var + eps); the CPU layer (oneDNN) saves
// the mean and the biased variance, and updates the running statistics as
// PyTorch does. These kernels convert between the two, so a BatchNorm2d `saved`
// buffer holds [mean, variance] on every device, and update the running
// statistics with the CPU's formula. Only in CUDA builds. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_BATCHNORM_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_BATCHNORM_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// After cuDNN's training forward over N = B*H*W values per channel, per c < C:
//   var = 1/inv_std^2 - eps                       (written over inv_std, in place)
//   running_mean = (1 - momentum) running_mean + momentum mean
//   running_var  = (1 - momentum) running_var  + momentum var * unbias,
// unbias = N/(N-1) (1 when N = 1), PyTorch's unbiased running variance.
cudaError_t BatchNormFinishForward(float* inv_std_to_var, const float* mean, float* running_mean,
                                   float* running_var, int64_t C, float eps, float momentum,
                                   float unbias, cudaStream_t stream);
// For the backward: inv_std = 1/sqrt(var + eps), C channels.
cudaError_t BatchNormInvStd(float* inv_std, const float* var, int64_t C, float eps,
                            cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_BATCHNORM_H_
