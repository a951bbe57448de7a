#include "runtime/cuda/kernels/device_util.h"
#include "runtime/cuda/kernels/elementwise.h"

namespace tandem::cuda {
namespace {

__global__ void FillKernel(float* out, float value, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = value;
}

__global__ void ScaleKernel(float* x, float scale, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) x[i] *= scale;
}

// FloatToBf16's arithmetic: round to nearest even, a NaN kept a quiet NaN.
__global__ void ToBf16Kernel(const float* x, uint16_t* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const uint32_t bits = __float_as_uint(x[i]);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t quiet = (bits | 0x00400000u) >> 16;
    out[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
  }
}

__global__ void AddKernel(float* out, const float* a, const float* b, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}

__global__ void AccumulateKernel(float* dinp, const float* dout, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) dinp[i] += dout[i];
}

__global__ void BroadcastBiasKernel(float* out, const float* bias, int64_t batch, int64_t rows,
                                    int64_t cols, int64_t ld, int64_t batch_stride,
                                    bool accumulate) {
  TANDEM_GRID_STRIDE_LOOP(i, batch * rows * cols) {
    const int64_t c = i % cols, r = (i / cols) % rows, b = i / (cols * rows);
    float* o = out + b * batch_stride + r * ld + c;
    *o = accumulate ? *o + bias[c] : bias[c];
  }
}

__global__ void ColumnSumKernel(float* dbias, const float* dout, int64_t rows, int64_t cols,
                                bool accumulate) {
  float* outs[1] = {dbias};
  ColumnReduce<1>(
      rows, cols, [&](int64_t r, int64_t c, float* v) { v[0] = dout[r * cols + c]; }, outs,
      accumulate);
}

}  // namespace

cudaError_t FillF32(float* out, float value, int64_t n, cudaStream_t stream) {
  FillKernel<<<GridSize(n), kBlockSize, 0, stream>>>(out, value, n);
  return cudaGetLastError();
}

cudaError_t ScaleF32(float* x, float scale, int64_t n, cudaStream_t stream) {
  ScaleKernel<<<GridSize(n), kBlockSize, 0, stream>>>(x, scale, n);
  return cudaGetLastError();
}

cudaError_t ToBf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ToBf16Kernel<<<GridSize(n), kBlockSize, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

cudaError_t AddForward(float* out, const float* a, const float* b, int64_t N, cudaStream_t stream) {
  AddKernel<<<GridSize(N), kBlockSize, 0, stream>>>(out, a, b, N);
  return cudaGetLastError();
}

cudaError_t CopyOrAccumulate(float* dinp, const float* dout, int64_t N, bool accumulate,
                             cudaStream_t stream) {
  if (!accumulate) {
    if (dinp == dout || N == 0) return cudaSuccess;
    return cudaMemcpyAsync(dinp, dout, N * sizeof(float), cudaMemcpyDeviceToDevice, stream);
  }
  AccumulateKernel<<<GridSize(N), kBlockSize, 0, stream>>>(dinp, dout, N);
  return cudaGetLastError();
}

cudaError_t BroadcastBias(float* out, const float* bias, int64_t batch, int64_t rows, int64_t cols,
                          int64_t ld, int64_t batch_stride, bool accumulate, cudaStream_t stream) {
  BroadcastBiasKernel<<<GridSize(batch * rows * cols), kBlockSize, 0, stream>>>(
      out, bias, batch, rows, cols, ld, batch_stride, accumulate);
  return cudaGetLastError();
}

cudaError_t ColumnSum(float* dbias, const float* dout, int64_t rows, int64_t cols, bool accumulate,
                      cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  ColumnSumKernel<<<ColumnReduceGrid(cols), ColumnReduceBlock(), 0, stream>>>(dbias, dout, rows,
                                                                              cols, accumulate);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
