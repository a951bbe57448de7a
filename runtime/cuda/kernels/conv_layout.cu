#include "runtime/cuda/kernels/conv_layout.h"
#include "runtime/cuda/kernels/device_util.h"

namespace tandem::cuda {
namespace {

// i runs over OIHW; returns the same element's OHWI offset.
__device__ __forceinline__ int64_t OhwiOffset(int64_t i, int64_t I, int64_t KH, int64_t KW) {
  const int64_t kw = i % KW, kh = (i / KW) % KH, in = (i / (KW * KH)) % I, o = i / (KW * KH * I);
  return ((o * KH + kh) * KW + kw) * I + in;
}

__global__ void OihwToOhwiKernel(float* out, const float* inp, int64_t n, int64_t I, int64_t KH,
                                 int64_t KW) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[OhwiOffset(i, I, KH, KW)] = inp[i];
}

__global__ void OhwiToOihwKernel(float* out, const float* inp, int64_t n, int64_t I, int64_t KH,
                                 int64_t KW, bool accumulate) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float v = inp[OhwiOffset(i, I, KH, KW)];
    out[i] = accumulate ? out[i] + v : v;
  }
}

}  // namespace

cudaError_t OihwToOhwi(float* out, const float* inp, int64_t O, int64_t I, int64_t KH, int64_t KW,
                       cudaStream_t stream) {
  const int64_t n = O * I * KH * KW;
  OihwToOhwiKernel<<<GridSize(n), kBlockSize, 0, stream>>>(out, inp, n, I, KH, KW);
  return cudaGetLastError();
}

cudaError_t OhwiToOihw(float* out, const float* inp, int64_t O, int64_t I, int64_t KH, int64_t KW,
                       bool accumulate, cudaStream_t stream) {
  const int64_t n = O * I * KH * KW;
  OhwiToOihwKernel<<<GridSize(n), kBlockSize, 0, stream>>>(out, inp, n, I, KH, KW, accumulate);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
