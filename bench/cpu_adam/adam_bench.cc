// The CPU Adam step on N parameters (default 100M), in bytes per second, against
// two yardsticks measured in the same process:
//  - the Adam-pattern loop: Adam's own traffic on Adam's arrays (reads p, g, m, v;
//    writes p, m, v) with trivial arithmetic, so it is the memory ceiling for
//    exactly this access pattern. The target is stated against it.
//  - STREAM triad (a = b + s*c), for reference against published numbers.
// Bytes per element: Adam and the pattern loop 28 (7 x 4; every line they write
// was just read, so there is no write-allocate traffic to add); triad 16 (reads
// b, c; writes a; plus the write-allocate read of a), with STREAM's own 12 also
// printed. Then the mixed-precision step (bf16 gradients in, bf16 working copy
// out, fp32 master and state), timed interleaved with the pattern loop again:
// 30 bytes per element, the copy's write-allocate read counted as triad's.
// Prints JSON; run.py adds torch.optim.Adam measured in the same run.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/core/allocator.h"
#include "runtime/core/bf16.h"
#include "runtime/core/clock.h"
#include "runtime/core/cpu_features.h"
#include "runtime/core/random.h"
#include "runtime/optim/kernels.h"

ABSL_FLAG(int64_t, parameters, 100'000'000, "Parameters to update.");
ABSL_FLAG(int, threads, 2, "OpenMP threads.");
ABSL_FLAG(int, repeats, 7, "Timed repetitions; the median is reported.");

namespace tandem {
namespace {

TANDEM_TARGET_CLONES
void Triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// Adam's loads and stores with none of its arithmetic. Every output depends on
// the loaded values, so no load can be dropped; the stores reach memory that
// Adam then reads and main() checksums. Contractions keep the values bounded
// however often it runs, and v stays >= 0 for Adam's sqrt (a NaN would poison
// the checksum). schedule(static) gives each thread one contiguous half
// of [0, n), as AdamUpdate's chunks do.
TANDEM_TARGET_CLONES
void AdamPattern(float* p, const float* g, float* m, float* v, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float pi = p[i], mi = 0.5f * m[i] + g[i];
    m[i] = mi;
    v[i] = 0.5f * v[i] + 0.5f * pi * pi;
    p[i] = 0.5f * pi + 0.25f * mi;
  }
}

double Median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <typename F>
double MedianSeconds(int repeats, F f) {
  std::vector<double> t;
  f();  // Warm-up: page faults and caches.
  for (int i = 0; i < repeats; ++i) {
    const double start = WallSeconds();
    f();
    t.push_back(WallSeconds() - start);
  }
  return Median(t);
}

// Times a and b alternately (swapping which goes first each round), so load
// from other work on the machine falls on both alike and their ratio holds.
template <typename A, typename B>
std::pair<double, double> InterleavedMedianSeconds(int repeats, A a, B b) {
  std::vector<double> ta, tb;
  a();  // Warm-up.
  b();
  for (int i = 0; i < repeats; ++i) {
    for (int k = 0; k < 2; ++k) {
      const bool run_a = (k == 0) == (i % 2 == 0);
      const double start = WallSeconds();
      if (run_a) {
        a();
      } else {
        b();
      }
      (run_a ? ta : tb).push_back(WallSeconds() - start);
    }
  }
  return {Median(ta), Median(tb)};
}

float* Alloc(int64_t n) {
  float* p = static_cast<float*>(std::aligned_alloc(64, n * 4));
  // First touch in parallel, as the kernels will run, so pages spread like them.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = 0.0f;
  return p;
}

double Sum(const float* x, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  const int64_t n = absl::GetFlag(FLAGS_parameters);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  {
    float *a = Alloc(n), *b = Alloc(n), *c = Alloc(n);
    FillUniform(b, n, 0, 1, 1, 1);
    FillUniform(c, n, 0, 1, 1, 2);
    const double t = MedianSeconds(repeats, [&] { Triad(a, b, c, 0.5f, n); });
    std::printf(
        "{\"kernel\": \"triad\", \"elements\": %ld, \"seconds\": %.5f, \"bytes_per_element\": 16, "
        "\"bytes_per_second\": %.4g, \"stream_bytes_per_second\": %.4g, \"checksum\": %.6g}\n",
        static_cast<long>(n), t, 16.0 * n / t, 12.0 * n / t, Sum(a, n));
    std::free(a);
    std::free(b);
    std::free(c);
  }
  float *p = Alloc(n), *g = Alloc(n), *m = Alloc(n), *v = Alloc(n);
  FillUniform(p, n, -1, 1, 1, 3);
  FillUniform(g, n, -1, 1, 1, 4);
  int64_t t_step = 0;
  const auto [t_pattern, t_adam] = InterleavedMedianSeconds(
      repeats, [&] { AdamPattern(p, g, m, v, n); },
      [&] { optim::AdamUpdate(p, g, m, v, n, optim::AdamStep{.lr = 1e-3f, .t = ++t_step}); });
  const double checksum = Sum(p, n) + Sum(m, n) + Sum(v, n);
  std::printf(
      "{\"kernel\": \"adam_pattern\", \"elements\": %ld, \"seconds\": %.5f, "
      "\"bytes_per_element\": 28, \"bytes_per_second\": %.4g, \"checksum\": %.6g}\n",
      static_cast<long>(n), t_pattern, 28.0 * n / t_pattern, checksum);
  std::printf(
      "{\"kernel\": \"adam\", \"impl\": \"tandem-%s\", \"parameters\": %ld, \"seconds\": %.5f, "
      "\"bytes_per_element\": 28, \"bytes_per_second\": %.4g}\n",
      optim::AdamImplementation(), static_cast<long>(n), t_adam, 28.0 * n / t_adam);
  std::fflush(stdout);

  // Mixed precision: bf16 gradients in, the bf16 working copy out, fp32
  // master and state. 28 bytes per element (reads 2 + 4 + 4 + 4, writes
  // 4 + 4 + 4 + 2), 30 with the copy's write-allocate read (its lines were not
  // just read), the convention of triad's 16.
  uint16_t* g16 = static_cast<uint16_t*>(std::aligned_alloc(64, n * 2));
  uint16_t* copy = static_cast<uint16_t*>(std::aligned_alloc(64, n * 2));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    g16[i] = FloatToBf16(g[i]);
    copy[i] = 0;
  }
  const auto [t_pattern2, t_mixed] = InterleavedMedianSeconds(
      repeats, [&] { AdamPattern(p, g, m, v, n); },
      [&] {
        optim::AdamUpdateBf16(p, g16, m, v, copy, n, optim::AdamStep{.lr = 1e-3f, .t = ++t_step});
      });
  double copy_sum = 0;
#pragma omp parallel for reduction(+ : copy_sum) schedule(static)
  for (int64_t i = 0; i < n; ++i) copy_sum += Bf16ToFloat(copy[i]);
  std::printf(
      "{\"kernel\": \"adam_bf16\", \"impl\": \"tandem-%s\", \"parameters\": %ld, "
      "\"seconds\": %.5f, \"bytes_per_element\": 30, \"bytes_per_second\": %.4g, "
      "\"pattern_seconds\": %.5f, \"checksum\": %.6g}\n",
      optim::AdamImplementation(), static_cast<long>(n), t_mixed, 30.0 * n / t_mixed, t_pattern2,
      copy_sum);
  std::free(g16);
  std::free(copy);
  std::fflush(stdout);
  return 0;
}
