#include "runtime/optim/kernels.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "runtime/core/cpu_features.h"
#include "runtime/core/isa_dispatch.h"
#include "runtime/optim/kernels_internal.h"

namespace tandem::optim {
namespace {

// Splits [0, n) into one contiguous, 64-byte-aligned chunk per thread and runs
// body(begin, end) on each.
template <typename Body>
void ParallelChunks(int64_t n, Body body) {
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t chunk = (n + threads - 1) / threads;
    chunk = (chunk + 15) / 16 * 16;
    const int64_t begin = std::min(n, t * chunk), end = std::min(n, begin + chunk);
    if (begin < end) body(begin, end);
  }
}

inline void AdamScalar(float* p, const float* g, float* m, float* v, int64_t begin, int64_t end,
                       const AdamConstants& c) {
  for (int64_t i = begin; i < end; ++i) {
    const float grad = g[i] * c.grad_scale + c.l2 * p[i];
    const float pi = p[i] * c.decay;
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * grad;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * grad * grad;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - c.step_size * mi / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
  }
}

__attribute__((target("avx2,fma"))) void AdamAvx2(float* p, const float* g, float* m, float* v,
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
    const __m256 grad = _mm256_fmadd_ps(_mm256_loadu_ps(g + i), scale, _mm256_mul_ps(l2, pi));
    const __m256 mi = _mm256_fmadd_ps(beta1, _mm256_loadu_ps(m + i), _mm256_mul_ps(omb1, grad));
    const __m256 vi = _mm256_fmadd_ps(beta2, _mm256_loadu_ps(v + i),
                                      _mm256_mul_ps(omb2, _mm256_mul_ps(grad, grad)));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vi), inv_bc2, eps);
    _mm256_storeu_ps(p + i,
                     _mm256_fnmadd_ps(step, _mm256_div_ps(mi, denom), _mm256_mul_ps(pi, decay)));
  }
  AdamScalar(p, g, m, v, i, end, c);
}

__attribute__((target("avx512f"))) void AdamAvx512(float* p, const float* g, float* m, float* v,
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
    const __m512 grad = _mm512_fmadd_ps(_mm512_loadu_ps(g + i), scale, _mm512_mul_ps(l2, pi));
    const __m512 mi = _mm512_fmadd_ps(beta1, _mm512_loadu_ps(m + i), _mm512_mul_ps(omb1, grad));
    const __m512 vi = _mm512_fmadd_ps(beta2, _mm512_loadu_ps(v + i),
                                      _mm512_mul_ps(omb2, _mm512_mul_ps(grad, grad)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vi), inv_bc2, eps);
    _mm512_storeu_ps(p + i,
                     _mm512_fnmadd_ps(step, _mm512_div_ps(mi, denom), _mm512_mul_ps(pi, decay)));
  }
  AdamScalar(p, g, m, v, i, end, c);
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
  const AdamConstants c = MakeAdamConstants(s);
  ParallelChunks(n, [&](int64_t begin, int64_t end) {
    if (isa == CpuIsa::kAvx512) {
      AdamAvx512(p, g, m, v, begin, end, c);
    } else if (isa == CpuIsa::kAvx2) {
      AdamAvx2(p, g, m, v, begin, end, c);
    } else {
      AdamScalar(p, g, m, v, begin, end, c);
    }
  });
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
