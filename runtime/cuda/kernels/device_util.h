// Device-side helpers shared by the .cu files of runtime/cuda/kernels: launch
// geometry, warp and block reductions in a fixed order (so results do not change
// from run to run), and the deterministic column reduction the gradient kernels
// use. Include only from .cu files (nvcc).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_DEVICE_UTIL_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_DEVICE_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::cuda {

constexpr int kBlockSize = 256;

// Blocks for a grid-stride loop over n items of `block` threads each: enough to
// fill any current GPU, never zero.
inline int GridSize(int64_t n, int block = kBlockSize) {
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// Threads per block for a row-wise kernel over rows of `width` elements: a
// multiple of 32, at most 1024, about one element per thread for short rows.
inline int RowBlockSize(int64_t width) {
  int threads = 32;
  while (threads < 1024 && threads < width) threads *= 2;
  return threads;
}

#define TANDEM_GRID_STRIDE_LOOP(i, n)                                       \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over the block (blockDim.x a multiple of 32); every thread gets it.
// `shared` holds 32 floats. Synchronises the block.
__device__ __forceinline__ float BlockSum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();  // `shared` may still be read by a previous call.
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return WarpSum(lane < warps ? shared[lane] : 0.0f);
}

__device__ __forceinline__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  return WarpMax(lane < warps ? shared[lane] : -INFINITY);
}

// Deterministic column sums: block (8, 128) covers 8 columns; thread (x, y) sums
// rows y, y + 128, ... of column x in order, then the 128 partial sums are added
// in a fixed tree. `value(row, col)` gives the element(s); kOutputs sums of
// different values are computed in the same pass. Narrow tiles give a
// transformer's 768 columns 96 blocks (a 32-wide tile gave 24, a fifth of an
// H100's SMs); a warp still reads whole 32-byte sectors (4 rows of 8 columns).
constexpr int kColumnTile = 8;
constexpr int kColumnLanes = 128;

template <int kOutputs, typename Value>
__device__ __forceinline__ void ColumnReduce(int64_t rows, int64_t cols, Value value,
                                             float* const* out, bool accumulate) {
  __shared__ float partial[kOutputs][kColumnLanes][kColumnTile + 1];
  const int64_t col = blockIdx.x * int64_t{kColumnTile} + threadIdx.x;
  float acc[kOutputs];
  for (int o = 0; o < kOutputs; ++o) acc[o] = 0.0f;
  if (col < cols) {
    for (int64_t row = threadIdx.y; row < rows; row += kColumnLanes) {
      float v[kOutputs];
      value(row, col, v);
      for (int o = 0; o < kOutputs; ++o) acc[o] += v[o];
    }
  }
  for (int o = 0; o < kOutputs; ++o) partial[o][threadIdx.y][threadIdx.x] = acc[o];
  __syncthreads();
  for (int stride = kColumnLanes / 2; stride > 0; stride >>= 1) {
    if (threadIdx.y < stride) {
      for (int o = 0; o < kOutputs; ++o) {
        partial[o][threadIdx.y][threadIdx.x] += partial[o][threadIdx.y + stride][threadIdx.x];
      }
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < cols) {
    for (int o = 0; o < kOutputs; ++o) {
      if (out[o] == nullptr) continue;
      out[o][col] =
          accumulate ? out[o][col] + partial[o][0][threadIdx.x] : partial[o][0][threadIdx.x];
    }
  }
}

inline dim3 ColumnReduceGrid(int64_t cols) {
  return dim3(static_cast<unsigned>((cols + kColumnTile - 1) / kColumnTile));
}
inline dim3 ColumnReduceBlock() { return dim3(kColumnTile, kColumnLanes); }

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_DEVICE_UTIL_H_
