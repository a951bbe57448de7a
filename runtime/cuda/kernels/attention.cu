#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/device_util.h"

namespace tandem::cuda {
namespace {

// Where element i of a [B, NH, T, HS] tensor sits in [B, T, width] rows
// (width C, or 3C for qkv).
__device__ __forceinline__ int64_t RowOffset(int64_t i, int64_t T, int64_t NH, int64_t HS,
                                             int64_t width) {
  const int64_t d = i % HS, t = (i / HS) % T, h = (i / (HS * T)) % NH, b = i / (HS * T * NH);
  return (b * T + t) * width + h * HS + d;
}

__global__ void SplitHeadsKernel(float* q, float* k, float* v, const float* qkv, int64_t B,
                                 int64_t T, int64_t NH, int64_t HS) {
  const int64_t C = NH * HS;
  TANDEM_GRID_STRIDE_LOOP(i, B * T * C) {
    const int64_t o = RowOffset(i, T, NH, HS, 3 * C);
    q[i] = qkv[o];
    k[i] = qkv[o + C];
    v[i] = qkv[o + 2 * C];
  }
}

__global__ void MergeHeadGradientsKernel(float* dqkv, const float* dq, const float* dk,
                                         const float* dv, int64_t B, int64_t T, int64_t NH,
                                         int64_t HS) {
  const int64_t C = NH * HS;
  TANDEM_GRID_STRIDE_LOOP(i, B * T * C) {
    const int64_t o = RowOffset(i, T, NH, HS, 3 * C);
    dqkv[o] = dq[i];
    dqkv[o + C] = dk[i];
    dqkv[o + 2 * C] = dv[i];
  }
}

__global__ void HeadsToRowsKernel(float* out, const float* inp, int64_t B, int64_t T, int64_t NH,
                                  int64_t HS) {
  TANDEM_GRID_STRIDE_LOOP(i, B * T * NH * HS) out[RowOffset(i, T, NH, HS, NH * HS)] = inp[i];
}

__global__ void RowsToHeadsKernel(float* out, const float* inp, int64_t B, int64_t T, int64_t NH,
                                  int64_t HS) {
  TANDEM_GRID_STRIDE_LOOP(i, B * T * NH * HS) out[i] = inp[RowOffset(i, T, NH, HS, NH * HS)];
}

}  // namespace

cudaError_t SplitHeads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                       int64_t NH, int64_t HS, cudaStream_t stream) {
  SplitHeadsKernel<<<GridSize(B * T * NH * HS), kBlockSize, 0, stream>>>(q, k, v, qkv, B, T, NH,
                                                                         HS);
  return cudaGetLastError();
}

cudaError_t MergeHeadGradients(float* dqkv, const float* dq, const float* dk, const float* dv,
                               int64_t B, int64_t T, int64_t NH, int64_t HS, cudaStream_t stream) {
  MergeHeadGradientsKernel<<<GridSize(B * T * NH * HS), kBlockSize, 0, stream>>>(dqkv, dq, dk, dv,
                                                                                 B, T, NH, HS);
  return cudaGetLastError();
}

cudaError_t HeadsToRows(float* out, const float* inp, int64_t B, int64_t T, int64_t NH, int64_t HS,
                        cudaStream_t stream) {
  HeadsToRowsKernel<<<GridSize(B * T * NH * HS), kBlockSize, 0, stream>>>(out, inp, B, T, NH, HS);
  return cudaGetLastError();
}

cudaError_t RowsToHeads(float* out, const float* inp, int64_t B, int64_t T, int64_t NH, int64_t HS,
                        cudaStream_t stream) {
  RowsToHeadsKernel<<<GridSize(B * T * NH * HS), kBlockSize, 0, stream>>>(out, inp, B, T, NH, HS);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
