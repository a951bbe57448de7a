#include <cub/device/device_radix_sort.cuh>

#include "runtime/cuda/kernels/device_util.h"
#include "runtime/cuda/kernels/embedding.h"

namespace tandem::cuda {
namespace {

constexpr size_t kScratchAlign = 256;

size_t AlignScratch(size_t bytes) {
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

int EndBit(int64_t V) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) < V) ++bits;
  return bits;
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* inp, const float* wte,
                                       const float* wpe, int64_t B, int64_t T, int64_t C) {
  TANDEM_GRID_STRIDE_LOOP(i, B * T * C) {
    const int64_t c = i % C, bt = i / C, t = bt % T;
    out[i] = wte[static_cast<int64_t>(inp[bt]) * C + c] + wpe[t * C + c];
  }
}

__global__ void IotaKernel(uint32_t* out, int64_t n) {
  TANDEM_GRID_STRIDE_LOOP(i, n) out[i] = static_cast<uint32_t>(i);
}

// Block x: one sorted position; only the first of each token's run works, summing
// the run in position order. Block y: a range of channels.
__global__ void TokenGradKernel(float* dwte, const float* dout, const uint32_t* ids,
                                const uint32_t* positions, int64_t N, int64_t C) {
  const int64_t i = blockIdx.x;
  if (i > 0 && ids[i] == ids[i - 1]) return;
  const int64_t c = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int64_t v = ids[i];
  float acc = dwte[v * C + c];
  for (int64_t j = i; j < N && ids[j] == v; ++j) acc += dout[positions[j] * int64_t{C} + c];
  dwte[v * C + c] = acc;
}

__global__ void PositionGradKernel(float* dwpe, const float* dout, int64_t B, int64_t T,
                                   int64_t C) {
  TANDEM_GRID_STRIDE_LOOP(i, T * C) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] = acc;
  }
}

struct Scratch {
  uint32_t* positions_in;
  uint32_t* ids_sorted;
  uint32_t* positions_sorted;
  void* cub_temp;
  size_t cub_bytes;
};

size_t ArraysBytes(int64_t n) { return 3 * AlignScratch(n * sizeof(uint32_t)); }

}  // namespace

cudaError_t EmbeddingForward(float* out, const int32_t* inp, const float* wte, const float* wpe,
                             int64_t B, int64_t T, int64_t C, cudaStream_t stream) {
  EmbeddingForwardKernel<<<GridSize(B * T * C), kBlockSize, 0, stream>>>(out, inp, wte, wpe, B, T,
                                                                         C);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackwardScratchBytes(int64_t B, int64_t T, int64_t V, size_t* bytes) {
  const int64_t n = B * T;
  if (n > INT32_MAX) return cudaErrorInvalidValue;
  size_t cub_bytes = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs(
      nullptr, cub_bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
      static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), static_cast<int>(n),
      0, EndBit(V));
  *bytes = ArraysBytes(n) + AlignScratch(cub_bytes);
  return err;
}

cudaError_t EmbeddingBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                              int64_t B, int64_t T, int64_t C, int64_t V, int64_t max_positions,
                              bool accumulate, void* scratch, size_t scratch_bytes,
                              cudaStream_t stream) {
  const int64_t n = B * T;
  if (n > INT32_MAX || C > int64_t{65535} * kBlockSize) return cudaErrorInvalidValue;
  cudaError_t err;
  if (!accumulate) {
    err = cudaMemsetAsync(dwte, 0, V * C * sizeof(float), stream);
    if (err == cudaSuccess)
      err = cudaMemsetAsync(dwpe, 0, max_positions * C * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  if (n == 0) return cudaSuccess;
  char* p = static_cast<char*>(scratch);
  Scratch s;
  s.positions_in = reinterpret_cast<uint32_t*>(p);
  s.ids_sorted = reinterpret_cast<uint32_t*>(p + AlignScratch(n * sizeof(uint32_t)));
  s.positions_sorted = reinterpret_cast<uint32_t*>(p + 2 * AlignScratch(n * sizeof(uint32_t)));
  s.cub_temp = p + ArraysBytes(n);
  if (scratch_bytes < ArraysBytes(n)) return cudaErrorInvalidValue;
  s.cub_bytes = scratch_bytes - ArraysBytes(n);

  IotaKernel<<<GridSize(n), kBlockSize, 0, stream>>>(s.positions_in, n);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  // Token ids are non-negative, so their bits sort as unsigned; the radix sort is
  // stable, so each token's positions stay in increasing order.
  err = cub::DeviceRadixSort::SortPairs(
      s.cub_temp, s.cub_bytes, reinterpret_cast<const uint32_t*>(inp), s.ids_sorted, s.positions_in,
      s.positions_sorted, static_cast<int>(n), 0, EndBit(V), stream);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(n),
                  static_cast<unsigned>((C + kBlockSize - 1) / kBlockSize));
  TokenGradKernel<<<grid, kBlockSize, 0, stream>>>(dwte, dout, s.ids_sorted, s.positions_sorted, n,
                                                   C);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  PositionGradKernel<<<GridSize(T * C), kBlockSize, 0, stream>>>(dwpe, dout, B, T, C);
  return cudaGetLastError();
}

}  // namespace tandem::cuda
