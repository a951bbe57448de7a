#include "runtime/cuda/kernels/device_util.h"
#include "runtime/cuda/kernels/layernorm.h"

namespace tandem::cuda {
namespace {

// One block per row.
__global__ void LayerNormForwardKernel(float* out, float* mean, float* var, const float* inp,
                                       const float* weight, const float* bias, int64_t C,
                                       float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sum += x[c];
  const float m = BlockSum(sum, shared) / static_cast<float>(C);
  float sq = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = x[c] - m;
    sq += d * d;
  }
  const float v = BlockSum(sq, shared) / static_cast<float>(C);
  const float rstd = 1.0f / sqrtf(v + eps);
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    y[c] = weight[c] * ((x[c] - m) * rstd) + bias[c];
  }
  if (threadIdx.x == 0) {
    mean[row] = m;
    var[row] = v;
  }
}

__global__ void LayerNormInputGradKernel(float* dinp, const float* dout, const float* inp,
                                         const float* weight, const float* mean, const float* var,
                                         int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  const float m = mean[row], rstd = 1.0f / sqrtf(var[row] + eps);
  float sum_g = 0.0f, sum_gn = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = dy[c] * weight[c];
    sum_g += g;
    sum_gn += g * ((x[c] - m) * rstd);
  }
  const float mean_g = BlockSum(sum_g, shared) / static_cast<float>(C);
  const float mean_gn = BlockSum(sum_gn, shared) / static_cast<float>(C);
  // Each thread rewrites only the elements it read, so dinp may alias dout.
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float n = (x[c] - m) * rstd;
    const float g = dy[c] * weight[c];
    dinp[row * C + c] = rstd * (g - mean_g - n * mean_gn);
  }
}

__global__ void LayerNormParamGradKernel(float* dweight, float* dbias, const float* dout,
                                         const float* inp, const float* mean, const float* var,
                                         int64_t BT, int64_t C, float eps, bool accumulate) {
  float* outs[2] = {dweight, dbias};
  ColumnReduce<2>(
      BT, C,
      [&](int64_t r, int64_t c, float* v) {
        const float dy = dout[r * C + c];
        const float n = (inp[r * C + c] - mean[r]) * (1.0f / sqrtf(var[r] + eps));
        v[0] = dy * n;
        v[1] = dy;
      },
      outs, accumulate);
}

}  // namespace

cudaError_t LayerNormForward(float* out, float* mean, float* var, const float* inp,
                             const float* weight, const float* bias, int64_t BT, int64_t C,
                             float eps, cudaStream_t stream) {
  if (BT == 0) return cudaSuccess;
  LayerNormForwardKernel<<<static_cast<unsigned>(BT), RowBlockSize(C < 256 ? C : 256), 0, stream>>>(
      out, mean, var, inp, weight, bias, C, eps);
  return cudaGetLastError();
}

cudaError_t LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                              const float* inp, const float* weight, const float* mean,
                              const float* var, int64_t BT, int64_t C, float eps,
                              bool accumulate_params, cudaStream_t stream) {
  if (BT == 0) return cudaSuccess;
  LayerNormParamGradKernel<<<ColumnReduceGrid(C), ColumnReduceBlock(), 0, stream>>>(
      dweight, dbias, dout, inp, mean, var, BT, C, eps, accumulate_params);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || dinp == nullptr) return err;
  LayerNormInputGradKernel<<<static_cast<unsigned>(BT), RowBlockSize(C < 256 ? C : 256), 0,
                             stream>>>(dinp, dout, inp, weight, mean, var, C, eps);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
