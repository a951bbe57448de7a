#include "runtime/optim/kernels.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "runtime/core/bf16.h"
#include "runtime/core/cpu_features.h"
#include "runtime/core/isa_dispatch.h"
#include "runtime/optim/kernels_internal.h"

namespace tandem::optim {
namespace {

// Splits [0, n) into one contiguous chunk per thread, a multiple of 32
// elements (whole 64-byte lines of fp32 and of bf16 buffers alike, so no two
// threads write one line), and runs body(begin, end) on each.
template <typename Body>
void ParallelChunks(int64_t n, Body body) {
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t chunk = (n + threads - 1) / threads;
    chunk = (chunk + 31) / 32 * 32;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

// Adam's gradient and the updated weights' working copy: fp32 gradients and no
// copy (Fp32Io), or bf16 gradients widened on load and the weights rounded to
// bf16 on store (Bf16Io), so one loop body serves both.
struct Fp32Io {
  const float* g;
  float Grad(int64_t i) const { return g[i]; }
  void Copy(int64_t, float) const {}
};
struct Bf16Io {
  const uint16_t* g;
  uint16_t* copy;
  float Grad(int64_t i) const { return Bf16ToFloat(g[i]); }
  void Copy(int64_t i, float x) const { copy[i] = FloatToBf16(x); }
};

template <typename Io>
inline void AdamScalar(float* p, const Io& io, float* m, float* v, int64_t begin, int64_t end,
                       const AdamConstants& c) {
  for (int64_t i = begin; i < end; ++i) {
    const float grad = io.Grad(i) * c.grad_scale + c.l2 * p[i];
    const float pi = p[i] * c.decay;
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * grad;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    io.Copy(i, p[i]);
  }
}

// Eight gradients: fp32, or bf16 widened (the bf16 bits are a float's high half).
__attribute__((target("avx2,fma"))) inline __m256 GradAvx2(const Fp32Io& io, int64_t i) {
  return _mm256_loadu_ps(io.g + i);
}
__attribute__((target("avx2,fma"))) inline __m256 GradAvx2(const Bf16Io& io, int64_t i) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(io.g + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2,fma"))) inline void CopyAvx2(const Fp32Io&, int64_t, __m256) {}
// Round to nearest even: add 0x7fff plus the kept part's lowest bit, keep the
// high half; NaNs stay NaNs (quieted) instead of rounding into infinity.
__attribute__((target("avx2,fma"))) inline void CopyAvx2(const Bf16Io& io, int64_t i, __m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000));
  r = _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  r = _mm256_srli_epi32(r, 16);
  // Eight 32-bit lanes of 16-bit values to eight uint16s: pack within each
  // 128-bit half, then bring the two halves' low quads together.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(io.copy + i), _mm256_castsi256_si128(packed));
}

template <typename Io>
__attribute__((target("avx2,fma"))) void AdamAvx2(float* p, const Io& io, float* m, float* v,
                                                  int64_t begin, int64_t end,
                                                  const AdamConstants& c) {
  const __m256 beta1 = _mm256_set1_ps(c.beta1), omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2), omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps), step = _mm256_set1_ps(c.step_size);
  const __m256 inv_bc2 = _mm256_set1_ps(c.inv_sqrt_bc2), decay = _mm256_set1_ps(c.decay);
  const __m256 l2 = _mm256_set1_ps(c.l2), scale = _mm256_set1_ps(c.grad_scale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 pi = _mm256_loadu_ps(p + i);
    const __m256 grad = _mm256_fmadd_ps(GradAvx2(io, i), scale, _mm256_mul_ps(l2, pi));
    const __m256 mi = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, grad));
    const __m256 vi = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(v + i),
                                      _mm256_mul_ps(omb2, _mm256_mul_ps(grad, grad)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_bc2, eps);
    const __m256 updated =
        _mm256_fnmadd_ps(step, _mm256_div_ps(mi, denom), _mm256_mul_ps(pi, decay));
    _mm256_storeu_ps(p + i, updated);
    CopyAvx2(io, i, updated);
  }
  AdamScalar(p, io, m, v, i, end, c);
}

// GCC 12 warns that the headers' self-initialised _mm*_undefined_* values
// (which the AVX-512 intrinsics below pass as "no merge source") "may be used
// uninitialized" once these are inlined into a template: a false positive of
// the headers, not of this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) inline __m512 GradAvx512(const Fp32Io& io, int64_t i) {
  return _mm512_loadu_ps(io.g + i);
}
__attribute__((target("avx512f"))) inline __m512 GradAvx512(const Bf16Io& io, int64_t i) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(io.g + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"))) inline void CopyAvx512(const Fp32Io&, int64_t, __m512) {}
// As CopyAvx2; VPMOVDW narrows the sixteen lanes.
__attribute__((target("avx512f"))) inline void CopyAvx512(const Bf16Io& io, int64_t i, __m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  r = _mm512_mask_or_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), bits,
                           _mm512_set1_epi32(0x00400000));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(io.copy + i),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}

template <typename Io>
__attribute__((target("avx512f"))) void AdamAvx512(float* p, const Io& io, float* m, float* v,
                                                   int64_t begin, int64_t end,
                                                   const AdamConstants& c) {
  const __m512 beta1 = _mm512_set1_ps(c.beta1), omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2), omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps), step = _mm512_set1_ps(c.step_size);
  const __m512 inv_bc2 = _mm512_set1_ps(c.inv_sqrt_bc2), decay = _mm512_set1_ps(c.decay);
  const __m512 l2 = _mm512_set1_ps(c.l2), scale = _mm512_set1_ps(c.grad_scale);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 pi = _mm512_loadu_ps(p + i);
    const __m512 grad = _mm512_fmadd_ps(GradAvx512(io, i), scale, _mm512_mul_ps(l2, pi));
    const __m512 mi = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, grad));
    const __m512 vi = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + i),
                                      _mm512_mul_ps(omb2, _mm512_mul_ps(grad, grad)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_bc2, eps);
    const __m512 updated =
        _mm512_fnmadd_ps(step, _mm512_div_ps(mi, denom), _mm512_mul_ps(pi, decay));
    _mm512_storeu_ps(p + i, updated);
    CopyAvx512(io, i, updated);
  }
  AdamScalar(p, io, m, v, i, end, c);
}
#pragma GCC diagnostic pop

// One Adam step over [0, n) on `isa`, in per-thread chunks.
template <typename Io>
void AdamChunks(CpuIsa isa, float* p, const Io& io, float* m, float* v, int64_t n,
                const AdamStep& s) {
  const AdamConstants c = MakeAdamConstants(s);
  ParallelChunks(n, [&](int64_t begin, int64_t end) {
    if (isa == CpuIsa::kAvx512) {
      AdamAvx512(p, io, m, v, begin, end, c);
    } else if (isa == CpuIsa::kAvx2) {
      AdamAvx2(p, io, m, v, begin, end, c);
    } else {
      AdamScalar(p, io, m, v, begin, end, c);
    }
  });
}

// SGD on [begin, end), for CallForIsa.
void SgdChunk(float* p, const float* g, float* buf, int64_t begin, int64_t end, const SgdStep& s) {
  const float lr = s.lr, mom = s.momentum, wd = s.weight_decay, scale = s.grad_scale;
  const bool first = s.first_step, nesterov = s.nesterov;
  if (mom == 0.0f) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) p[i] -= lr * (g[i] * scale + wd * p[i]);
    return;
  }
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    const float grad = g[i] * scale + wd * p[i];
    const float b = first ? grad : mom * buf[i] + grad;
    buf[i] = b;
    p[i] -= lr * (nesterov ? grad + mom * b : b);
  }
}

// sum x[i]^2 over [begin, end) in fp32, for CallForIsa.
float SquaresBlock(const float* x, int64_t begin, int64_t end) {
  float partial = 0;
#pragma omp simd reduction(+ : partial)
  for (int64_t i = begin; i < end; ++i) partial += x[i] * x[i];
  return partial;
}

}  // namespace

AdamConstants MakeAdamConstants(const AdamStep& s) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(s.beta1), static_cast<double>(s.t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(s.beta2), static_cast<double>(s.t));
  AdamConstants c;
  c.beta1 = s.beta1;
  c.one_minus_beta1 = 1.0f - s.beta1;
  c.beta2 = s.beta2;
  c.one_minus_beta2 = 1.0f - s.beta2;
  c.eps = s.eps;
  c.step_size = static_cast<float>(s.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = s.decoupled ? 1.0f - s.lr * s.weight_decay : 1.0f;
  c.l2 = s.decoupled ? 0.0f : s.weight_decay;
  c.grad_scale = s.grad_scale;
  return c;
}

void AdamUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamStep& s) {
  internal::AdamUpdateForIsa(ActiveCpuIsa(), p, g, m, v, n, s);
}

void AdamUpdateBf16(float* p, const uint16_t* g, float* m, float* v, uint16_t* copy, int64_t n,
                    const AdamStep& s) {
  internal::AdamUpdateBf16ForIsa(ActiveCpuIsa(), p, g, m, v, copy, n, s);
}

const char* AdamImplementation() { return CpuIsaName(ActiveCpuIsa()); }

void SgdUpdate(float* p, const float* g, float* buf, int64_t n, const SgdStep& s) {
  internal::SgdUpdateForIsa(AutoVectorizedIsa(), p, g, buf, n, s);
}

double SumOfSquares(const float* x, int64_t n) {
  return internal::SumOfSquaresForIsa(AutoVectorizedIsa(), x, n);
}

namespace internal {

void AdamUpdateForIsa(CpuIsa isa, float* p, const float* g, float* m, float* v, int64_t n,
                      const AdamStep& s) {
  AdamChunks(isa, p, Fp32Io{g}, m, v, n, s);
}

void AdamUpdateBf16ForIsa(CpuIsa isa, float* p, const uint16_t* g, float* m, float* v,
                          uint16_t* copy, int64_t n, const AdamStep& s) {
  AdamChunks(isa, p, Bf16Io{g, copy}, m, v, n, s);
}

void SgdUpdateForIsa(CpuIsa isa, float* p, const float* g, float* buf, int64_t n,
                     const SgdStep& s) {
  ParallelChunks(
      n, [&](int64_t begin, int64_t end) { CallForIsa<SgdChunk>(isa, p, g, buf, begin, end, s); });
}

double SumOfSquaresForIsa(CpuIsa isa, const float* x, int64_t n) {
  double total = 0;
#pragma omp parallel reduction(+ : total)
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t chunk = (n + threads - 1) / threads;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    // fp32 partial sums over blocks of 4096, accumulated in double.
    for (int64_t b = begin; b < end; b += 4096) {
      total += CallForIsa<SquaresBlock>(isa, x, b, std::min(end, b + 4096));
    }
  }
  return total;
}

}  // namespace internal

}  // namespace tandem::optim
