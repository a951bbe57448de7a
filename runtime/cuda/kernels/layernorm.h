// LayerNorm over the last dimension, forward next to backward, on rows of C
// floats (BT = B*T rows), launched on a caller's stream. CPU reference: the
// LayerNorm layer (oneDNN layer_normalization). Only in CUDA builds. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_LAYERNORM_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_LAYERNORM_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

// Forward, per row r:
//   mean_r = sum_c x / C,  var_r = sum_c (x - mean_r)^2 / C   (biased; two passes)
//   y = (x - mean_r) / sqrt(var_r + eps) * weight + bias
// Saves mean [BT] and var [BT]: the same values the CPU layer (oneDNN) saves, so
// a `saved` buffer means the same on both devices.
cudaError_t LayerNormForward(float* out, float* mean, float* var, const float* inp,
                             const float* weight, const float* bias, int64_t BT, int64_t C,
                             float eps, cudaStream_t stream);

// Backward, with rstd = 1/sqrt(var + eps), n = (x - mean) * rstd, g = dout * weight:
//   dinp   = rstd * (g - mean_c(g) - n * mean_c(g * n))        (when dinp != null)
//   dweight (+)= sum_r dout * n,  dbias (+)= sum_r dout         (fixed-order sums)
// dinp may alias dout (the parameter sums are taken first).
cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* var, int64_t BT, int64_t C, float eps,
                              bool accumulate_params, cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_LAYERNORM_H_
