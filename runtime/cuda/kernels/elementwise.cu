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
__device__ __forceinline__ uint16_t RoundToBf16(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet = (bits | 0x00400000u) >> 16;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

// FloatToHalf's arithmetic (runtime/core/fp16.h), so that both devices give
// the same bits, NaNs included: round to nearest even, infinity from 65520 up.
__device__ __forceinline__ uint16_t RoundToHalf(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;
  if (magnitude < 0x38800000u) {
    const uint32_t sum = __float_as_uint(__fadd_rn(__uint_as_float(magnitude), 0.5f));
    return sign | static_cast<uint16_t>(sum - 0x3f000000u);
  }
  const uint32_t odd = (magnitude >> 13) & 1u;
  return sign | static_cast<uint16_t>((magnitude - (112u << 23) + 0xfffu + odd) >> 13);
}

// HalfToFloat's arithmetic: exact for every value, and a NaN keeps its
// payload as on the CPU (__half2float makes every NaN the canonical one).
__device__ __forceinline__ float WidenHalf(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
  return __uint_as_float(
      sign | __float_as_uint(__fmul_rn(static_cast<float>(mantissa), 5.9604644775390625e-8f)));
}

__global__ void FromF16Kernel(const uint16_t* x, float* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = WidenHalf(x[i]);
}

// The 16-bit roundings as types, for the kernels below.
struct Bf16Rounding {
  __device__ uint16_t operator()(float x) const { return RoundToBf16(x); }
};
struct HalfRounding {
  __device__ uint16_t operator()(float x) const { return RoundToHalf(x); }
};

template <typename Round>
__global__ void RoundKernel(const float* x, uint16_t* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = Round()(x[i]);
}

// Four values per thread: 16-byte loads, 8-byte stores.
template <typename Round>
__global__ void RoundKernel4(const float4* x, ushort4* out, int64_t n4) {
  const Round round;
  TANDEM_GRID_STRIDE_LOOP(i, n4) {
    const float4 v = x[i];
    out[i] = make_ushort4(round(v.x), round(v.y), round(v.z), round(v.w));
  }
}

// x rounded into out: four values per thread where both are aligned for it,
// one per thread for the rest.
template <typename Round>
cudaError_t LaunchRounding(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      RoundKernel4<Round><<<GridSize(n4), kBlockSize, 0, stream>>>(
          reinterpret_cast<const float4*>(x), reinterpret_cast<ushort4*>(out), n4);
    }
    done = 4 * n4;
  }
  if (done < n) {
    RoundKernel<Round>
        <<<GridSize(n - done), kBlockSize, 0, stream>>>(x + done, out + done, n - done);
  }
  return cudaGetLastError();
}

__global__ void FromBf16Kernel(const uint16_t* x, float* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

__global__ void AddKernel(float* out, const float* a, const float* b, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = a[i] + b[i];
}

__global__ void AccumulateKernel(float* dinp, const float* dout, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) dinp[i] += dout[i];
}

// One row per block (grid-stride over rows), the columns across its threads:
// one division per row rather than per element.
__global__ void BroadcastBiasKernel(float* out, const float* bias, int64_t batch, int64_t rows,
                                    int64_t cols, int64_t ld, int64_t batch_stride,
                                    bool accumulate) {
  for (int64_t row = blockIdx.x; row < batch * rows; row += gridDim.x) {
    float* o = out + (row / rows) * batch_stride + (row % rows) * ld;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      o[c] = accumulate ? o[c] + bias[c] : bias[c];
    }
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
  return LaunchRounding<Bf16Rounding>(x, out, n, stream);
}

cudaError_t FromBf16(const uint16_t* x, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FromBf16Kernel<<<GridSize(n), kBlockSize, 0, stream>>>(x, out, n);
  return cudaGetLastError();
}

cudaError_t ToF16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  return LaunchRounding<HalfRounding>(x, out, n, stream);
}

cudaError_t FromF16(const uint16_t* x, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  FromF16Kernel<<<GridSize(n), kBlockSize, 0, stream>>>(x, out, n);
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
  if (batch * rows == 0 || cols == 0) return cudaSuccess;
  BroadcastBiasKernel<<<GridSize(batch * rows, 1), RowBlockSize(cols < 256 ? cols : 256), 0,
                        stream>>>(out, bias, batch, rows, cols, ld, batch_stride, accumulate);
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
