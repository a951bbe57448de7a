#include "runtime/cuda/kernels/elementwise.h"

namespace tandem::cuda {
namespace {

constexpr int kBlock = 256;

__global__ void FillKernel(float* out, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

__global__ void ScaleKernel(float* x, float scale, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    x[i] *= scale;
  }
}

int Blocks(int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

cudaError_t FillF32(float* out, float value, int64_t n, cudaStream_t stream) {
  FillKernel<<<Blocks(n), kBlock, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

cudaError_t ScaleF32(float* x, float scale, int64_t n, cudaStream_t stream) {
  ScaleKernel<<<Blocks(n), kBlock, 0, stream>>>(x, scale, n);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
