#include "runtime/cuda/kernels/device_util.h"
#include "runtime/cuda/kernels/softmax.h"

namespace tandem::cuda {
namespace {

// One block per row (bh, i); `valid` = i + 1 entries take part.
__global__ void CausalSoftmaxForwardKernel(float* att, int64_t T) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t valid = row % T + 1;
  float* a = att + row * T;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, a[j]);
  m = BlockMax(m, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) sum += expf(a[j] - m);
  const float inv = 1.0f / BlockSum(sum, shared);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    a[j] = j < valid ? expf(a[j] - m) * inv : 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(float* datt, const float* att, int64_t T) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const int64_t valid = row % T + 1;
  float* d = datt + row * T;
  const float* a = att + row * T;
  float dot = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) dot += a[j] * d[j];
  dot = BlockSum(dot, shared);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    d[j] = j < valid ? a[j] * (d[j] - dot) : 0.0f;
  }
}

__global__ void LogSoftmaxKernel(float* logp, const float* logits, int64_t V) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * V;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, x[v]);
  m = BlockMax(m, shared);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) sum += expf(x[v] - m);
  const float log_sum = logf(BlockSum(sum, shared));
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) logp[row * V + v] = x[v] - m - log_sum;
}

__global__ void CrossEntropyForwardKernel(float* losses, const float* logp, const int32_t* targets,
                                          int64_t B, int64_t P, int64_t V) {
  TANDEM_GRID_STRIDE_LOOP(b, B) {
    double sum = 0;
    for (int64_t t = 0; t < P; ++t) {
      const int64_t row = b * P + t;
      sum -= logp[row * V + targets[row]];
    }
    losses[b] = static_cast<float>(sum / static_cast<double>(P));
  }
}

__global__ void CrossEntropyBackwardKernel(float* dlogits, const float* logp,
                                           const int32_t* targets, const float* dlosses, int64_t B,
                                           int64_t P, int64_t V) {
  TANDEM_GRID_STRIDE_LOOP(i, B * P * V) {
    const int64_t row = i / V, v = i % V;
    const float scale = dlosses[row / P] / static_cast<float>(P);
    // Rounded as the CPU: the product first, then the one-hot subtraction.
    const float d = __fmul_rn(expf(logp[i]), scale);
    dlogits[i] = v == targets[row] ? d - scale : d;
  }
}

}  // namespace

cudaError_t CausalSoftmaxForward(float* att, int64_t BH, int64_t T, cudaStream_t stream) {
  if (BH * T == 0) return cudaSuccess;
  CausalSoftmaxForwardKernel<<<static_cast<unsigned>(BH * T), RowBlockSize(T < 256 ? T : 256), 0,
                               stream>>>(att, T);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(float* datt, const float* att, int64_t BH, int64_t T,
                                  cudaStream_t stream) {
  if (BH * T == 0) return cudaSuccess;
  CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(BH * T), RowBlockSize(T < 256 ? T : 256), 0,
                                stream>>>(datt, att, T);
  return cudaGetLastError();
}

cudaError_t LogSoftmaxForward(float* logp, const float* logits, int64_t rows, int64_t V,
                              cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  LogSoftmaxKernel<<<static_cast<unsigned>(rows), RowBlockSize(V < 512 ? V : 512), 0, stream>>>(
      logp, logits, V);
  return cudaGetLastError();
}

cudaError_t CrossEntropyForward(float* losses, const float* logp, const int32_t* targets, int64_t B,
                                int64_t P, int64_t V, cudaStream_t stream) {
  CrossEntropyForwardKernel<<<GridSize(B, 128), 128, 0, stream>>>(losses, logp, targets, B, P, V);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(float* dlogits, const float* logp, const int32_t* targets,
                                 const float* dlosses, int64_t B, int64_t P, int64_t V,
                                 cudaStream_t stream) {
  CrossEntropyBackwardKernel<<<GridSize(B * P * V), kBlockSize, 0, stream>>>(dlogits, logp, targets,
                                                                             dlosses, B, P, V);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
