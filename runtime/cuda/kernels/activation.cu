#include "runtime/cuda/kernels/activation.h"
#include "runtime/cuda/kernels/device_util.h"

namespace tandem::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__global__ void GeluForwardKernel(float* out, const float* inp, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = 0.5f * x * (1.0f + tanhf(u));
  }
}

__global__ void GeluBackwardKernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float t = tanhf(u);
    const float du_dx = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du_dx);
  }
}

__global__ void ReluForwardKernel(float* out, const float* inp, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

__global__ void ReluBackwardKernel(float* dinp, const float* out, const float* dout, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

// Philox4x32-10, exactly as core/random.cc: counter (lo, hi) = (index/4, stream),
// key = seed.
__device__ __forceinline__ uint4 Philox4x32(uint64_t key, uint64_t counter_hi,
                                            uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ float ToUnit(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// One thread per block of four elements, which share a Philox call.
// Global indices offset..offset+n-1 in blocks of four that share a Philox call;
// apply(i, u) gets the local index i.
template <typename Apply>
__device__ __forceinline__ void ForEachUniform(int64_t n, uint64_t seed, uint64_t stream_id,
                                               uint64_t offset, Apply apply) {
  const int64_t first = static_cast<int64_t>(offset / 4);
  const int64_t blocks = static_cast<int64_t>((offset + n + 3) / 4) - first;
  TANDEM_GRID_STRIDE_LOOP(b, blocks) {
    const int64_t block = first + b;
    const uint4 r = Philox4x32(seed, stream_id, static_cast<uint64_t>(block));
    const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = block * 4 + j - static_cast<int64_t>(offset);
      if (i >= 0 && i < n) apply(i, ToUnit(words[j]));
    }
  }
}

__global__ void DropoutKernel(float* out, const float* inp, int64_t n, float p, float scale,
                              uint64_t seed, uint64_t stream_id, uint64_t offset) {
  // __fmul_rn: the product is rounded once, as on the CPU (no contraction).
  ForEachUniform(n, seed, stream_id, offset,
                 [&](int64_t i, float u) { out[i] = u >= p ? __fmul_rn(inp[i], scale) : 0.0f; });
}

__global__ void UniformKernel(float* out, int64_t n, uint64_t seed, uint64_t stream_id) {
  ForEachUniform(n, seed, stream_id, 0, [&](int64_t i, float u) { out[i] = u; });
}

}  // namespace

cudaError_t GeluForward(float* out, const float* inp, int64_t N, cudaStream_t stream) {
  GeluForwardKernel<<<GridSize(N), kBlockSize, 0, stream>>>(out, inp, N);
  return cudaGetLastError();
}

cudaError_t GeluBackward(float* dinp, const float* inp, const float* dout, int64_t N,
                         cudaStream_t stream) {
  GeluBackwardKernel<<<GridSize(N), kBlockSize, 0, stream>>>(dinp, inp, dout, N);
  return cudaGetLastError();
}

cudaError_t ReluForward(float* out, const float* inp, int64_t N, cudaStream_t stream) {
  ReluForwardKernel<<<GridSize(N), kBlockSize, 0, stream>>>(out, inp, N);
  return cudaGetLastError();
}

cudaError_t ReluBackward(float* dinp, const float* out, const float* dout, int64_t N,
                         cudaStream_t stream) {
  ReluBackwardKernel<<<GridSize(N), kBlockSize, 0, stream>>>(dinp, out, dout, N);
  return cudaGetLastError();
}

cudaError_t DropoutForward(float* out, const float* inp, int64_t N, float p, uint64_t seed,
                           uint64_t stream_id, cudaStream_t stream, uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
  DropoutKernel<<<GridSize((N + 3) / 4 + 1), kBlockSize, 0, stream>>>(out, inp, N, p, scale, seed,
                                                                      stream_id, offset);
  return cudaGetLastError();
}

cudaError_t DropoutBackward(float* dinp, const float* dout, int64_t N, float p, uint64_t seed,
                            uint64_t stream_id, cudaStream_t stream, uint64_t offset) {
  // dx = dy * mask / (1 - p): the forward applied to dy.
  return DropoutForward(dinp, dout, N, p, seed, stream_id, stream, offset);
}

cudaError_t PhiloxUniforms(float* out, int64_t N, uint64_t seed, uint64_t stream_id,
                           cudaStream_t stream) {
  UniformKernel<<<GridSize((N + 3) / 4), kBlockSize, 0, stream>>>(out, N, seed, stream_id);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
