// The CPU Adam step on N parameters (default 100M), in bytes per second, against
// the STREAM triad bandwidth measured in the same process. Adam moves 28 bytes per
// parameter (reads p, g, m, v; writes p, m, v); triad 12 (reads b, c; writes a),
// both counted without write-allocate traffic, as STREAM counts. Prints JSON;
// run.py adds torch.optim.Adam measured in the same run.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "runtime/core/cpu_features.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/core/allocator.h"
#include "runtime/core/clock.h"
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

template <typename F>
double MedianSeconds(int repeats, F f) {
  std::vector<double> t;
  f();  // Warm-up: page faults and caches.
  for (int i = 0; i < repeats; ++i) {
    const double start = WallSeconds();
    f();
    t.push_back(WallSeconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

float* Alloc(int64_t n) {
  float* p = static_cast<float*>(std::aligned_alloc(64, n * 4));
  // First touch in parallel, as the kernels will run, so pages spread like them.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = 0.0f;
  return p;
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
    std::printf("{\"kernel\": \"triad\", \"elements\": %ld, \"seconds\": %.5f, \"bytes_per_second\": %.4g}\n",
                static_cast<long>(n), t, 12.0 * n / t);
    std::free(a);
    std::free(b);
    std::free(c);
  }
  float *p = Alloc(n), *g = Alloc(n), *m = Alloc(n), *v = Alloc(n);
  FillUniform(p, n, -1, 1, 1, 3);
  FillUniform(g, n, -1, 1, 1, 4);
  int64_t t_step = 0;
  const double t = MedianSeconds(repeats, [&] {
    optim::AdamUpdate(p, g, m, v, n, optim::AdamStep{.lr = 1e-3f, .t = ++t_step});
  });
  std::printf("{\"kernel\": \"adam\", \"impl\": \"tandem-%s\", \"parameters\": %ld, \"seconds\": %.5f, "
              "\"bytes_per_second\": %.4g}\n",
              optim::AdamImplementation(), static_cast<long>(n), t, 28.0 * n / t);
  std::fflush(stdout);
  return 0;
}
