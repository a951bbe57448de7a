#include "runtime/cpu/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "runtime/core/bf16.h"
#include "runtime/core/cpu_features.h"
#include "runtime/core/fp16.h"
#include "runtime/core/isa_dispatch.h"
#include "runtime/core/random.h"

namespace tandem::cpu {
namespace {

// This thread's share of [0, n) in a parallel region: contiguous, and cut at
// multiples of `align` elements so neighbours do not share cache lines.
std::pair<int64_t, int64_t> ThreadShare(int64_t n, int64_t align) {
  const int threads = omp_get_num_threads(), t = omp_get_thread_num();
  int64_t chunk = (n + threads - 1) / threads;
  chunk = (chunk + align - 1) / align * align;
  const int64_t begin = std::min<int64_t>(n, t * chunk);
  return {begin, std::min<int64_t>(n, begin + chunk)};
}

// Bodies over [begin, end) for CallForIsa.

void ColumnSumColumns(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate,
                      int64_t begin, int64_t end) {
  if (!accumulate) {
    for (int64_t j = begin; j < end; ++j) db[j] = 0.0f;
  }
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = dy + i * cols;
#pragma omp simd
    for (int64_t j = begin; j < end; ++j) db[j] += row[j];
  }
}

void AddRange(const float* a, const float* b, float* out, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
}

void AccumulateRange(const float* a, float* out, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] += a[i];
}

void ToBf16Range(const float* x, uint16_t* out, int64_t begin, int64_t end) {
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) out[i] = FloatToBf16(x[i]);
}

}  // namespace

void ColumnSum(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate) {
  internal::ColumnSumForIsa(AutoVectorizedIsa(), dy, rows, cols, db, accumulate);
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  internal::AddForIsa(AutoVectorizedIsa(), a, b, out, n);
}

void CopyOrAccumulate(const float* a, float* out, int64_t n, bool accumulate) {
  internal::CopyOrAccumulateForIsa(AutoVectorizedIsa(), a, out, n, accumulate);
}

void ToBf16(const float* x, uint16_t* out, int64_t n) {
  internal::ToBf16ForIsa(AutoVectorizedIsa(), x, out, n);
}

void FromBf16(const uint16_t* x, float* out, int64_t n) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 32);
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out[i] = Bf16ToFloat(x[i]);
  }
}

void ColumnSumBf16(const uint16_t* dy, int64_t rows, int64_t cols, float* db, bool accumulate) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(cols, 1);
    if (!accumulate) {
      for (int64_t j = begin; j < end; ++j) db[j] = 0.0f;
    }
    for (int64_t i = 0; i < rows && begin < end; ++i) {
      const uint16_t* row = dy + i * cols;
#pragma omp simd
      for (int64_t j = begin; j < end; ++j) db[j] += Bf16ToFloat(row[j]);
    }
  }
}

void AccumulateBf16(const uint16_t* x, float* out, int64_t n) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 32);
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out[i] += Bf16ToFloat(x[i]);
  }
}

void ToF16(const float* x, uint16_t* out, int64_t n) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 32);
    for (int64_t i = begin; i < end; ++i) out[i] = FloatToHalf(x[i]);
  }
}

void FromF16(const uint16_t* x, float* out, int64_t n) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 32);
    for (int64_t i = begin; i < end; ++i) out[i] = HalfToFloat(x[i]);
  }
}

namespace internal {

void ColumnSumForIsa(CpuIsa isa, const float* dy, int64_t rows, int64_t cols, float* db,
                     bool accumulate) {
  // Columns are split across threads so each db[j] has one writer and the sum
  // order is fixed (deterministic for a given thread count).
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(cols, 1);
    if (begin < end) CallForIsa<ColumnSumColumns>(isa, dy, rows, cols, db, accumulate, begin, end);
  }
}

void AddForIsa(CpuIsa isa, const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 16);
    if (begin < end) CallForIsa<AddRange>(isa, a, b, out, begin, end);
  }
}

void CopyOrAccumulateForIsa(CpuIsa isa, const float* a, float* out, int64_t n, bool accumulate) {
  if (!accumulate) {
    if (a != out) std::memcpy(out, a, n * sizeof(float));
    return;
  }
#pragma omp parallel
  {
    const auto [begin, end] = ThreadShare(n, 16);
    if (begin < end) CallForIsa<AccumulateRange>(isa, a, out, begin, end);
  }
}

void ToBf16ForIsa(CpuIsa isa, const float* x, uint16_t* out, int64_t n) {
#pragma omp parallel
  {
    // 32 bf16 elements: whole cache lines of `out` per thread.
    const auto [begin, end] = ThreadShare(n, 32);
    if (begin < end) CallForIsa<ToBf16Range>(isa, x, out, begin, end);
  }
}

}  // namespace internal

namespace {

template <typename Apply>
void ForEachKept(int64_t n, float p, uint64_t seed, uint64_t stream, uint64_t offset, Apply apply) {
  // Blocks of 4 global indices share one Philox call; threads take whole blocks.
  const int64_t first = static_cast<int64_t>(offset / 4);
  const int64_t last = static_cast<int64_t>((offset + n + 3) / 4);
#pragma omp parallel for schedule(static)
  for (int64_t block = first; block < last; ++block) {
    const auto r = Philox4x32(seed, stream, static_cast<uint64_t>(block));
    for (int j = 0; j < 4; ++j) {
      const int64_t i = block * 4 + j - static_cast<int64_t>(offset);
      if (i < 0) continue;
      if (i >= n) break;
      const float u = static_cast<float>(r[j] >> 8) * (1.0f / 16777216.0f);
      apply(i, u >= p);
    }
  }
}

}  // namespace

void DropoutForward(const float* x, float* y, int64_t n, float p, uint64_t seed, uint64_t stream,
                    uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
  ForEachKept(n, p, seed, stream, offset,
              [&](int64_t i, bool keep) { y[i] = keep ? x[i] * scale : 0.0f; });
}

void DropoutBackward(const float* dy, float* dx, int64_t n, float p, uint64_t seed, uint64_t stream,
                     uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
  ForEachKept(n, p, seed, stream, offset,
              [&](int64_t i, bool keep) { dx[i] = keep ? dy[i] * scale : 0.0f; });
}

void SplitHeads(const float* qkv, float* q, float* k, float* v, int64_t B, int64_t T, int64_t H,
                int64_t hs) {
  const int64_t C = H * hs;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const float* row = qkv + (b * T + t) * 3 * C + h * hs;
        const int64_t o = ((b * H + h) * T + t) * hs;
        std::memcpy(q + o, row, hs * sizeof(float));
        std::memcpy(k + o, row + C, hs * sizeof(float));
        std::memcpy(v + o, row + 2 * C, hs * sizeof(float));
      }
    }
  }
}

void MergeHeadGradients(const float* dq, const float* dk, const float* dv, float* dqkv, int64_t B,
                        int64_t T, int64_t H, int64_t hs) {
  const int64_t C = H * hs;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      float* row = dqkv + (b * T + t) * 3 * C;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t o = ((b * H + h) * T + t) * hs;
        std::memcpy(row + h * hs, dq + o, hs * sizeof(float));
        std::memcpy(row + C + h * hs, dk + o, hs * sizeof(float));
        std::memcpy(row + 2 * C + h * hs, dv + o, hs * sizeof(float));
      }
    }
  }
}

void HeadsToRows(const float* in, float* out, int64_t B, int64_t T, int64_t H, int64_t hs) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(out + (b * T + t) * H * hs + h * hs, in + ((b * H + h) * T + t) * hs,
                    hs * sizeof(float));
      }
    }
  }
}

void RowsToHeads(const float* in, float* out, int64_t B, int64_t T, int64_t H, int64_t hs) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(out + ((b * H + h) * T + t) * hs, in + (b * T + t) * H * hs + h * hs,
                    hs * sizeof(float));
      }
    }
  }
}

void CausalMask(float* scores, int64_t BH, int64_t T) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < BH; ++bh) {
    for (int64_t i = 0; i < T; ++i) {
      float* row = scores + (bh * T + i) * T;
      for (int64_t j = i + 1; j < T; ++j) row[j] = neg_inf;
    }
  }
}

}  // namespace tandem::cpu
