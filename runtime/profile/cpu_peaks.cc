#include "runtime/profile/cpu_peaks.h"

#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/allocator.h"
#include "runtime/core/clock.h"
#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/onednn.h"
#include "spec/precision.h"

namespace tandem::profile {
namespace {

__attribute__((target_clones("avx512f", "avx2", "default"))) void Triad(float* a, const float* b,
                                                                        const float* c, float s,
                                                                        int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// First touch in parallel, as the kernels will run, so pages spread like them.
void ParallelFill(float* p, int64_t n, float value) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

template <typename F>
double BestSeconds(int repeats, F f) {
  f();  // Warm-up: page faults, caches, JIT.
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(1, repeats); ++i) {
    const double start = WallSeconds();
    f();
    best = std::min(best, WallSeconds() - start);
  }
  return best;
}

}  // namespace

absl::StatusOr<double> MeasureTriadBytesPerSecond(const TriadOptions& options) {
  const int64_t n = options.elements;
  if (n <= 0) return absl::InvalidArgumentError("triad: elements must be > 0");
  HostAllocator allocator;
  TANDEM_ASSIGN_OR_RETURN(Buffer a,
                          Buffer::Allocate(&allocator, n * 4, MemoryCategory::kWorkspace));
  TANDEM_ASSIGN_OR_RETURN(Buffer b,
                          Buffer::Allocate(&allocator, n * 4, MemoryCategory::kWorkspace));
  TANDEM_ASSIGN_OR_RETURN(Buffer c,
                          Buffer::Allocate(&allocator, n * 4, MemoryCategory::kWorkspace));
  ParallelFill(a.f32(), n, 0.0f);
  ParallelFill(b.f32(), n, 1.0f);
  ParallelFill(c.f32(), n, 2.0f);
  const double seconds =
      BestSeconds(options.repeats, [&] { Triad(a.f32(), b.f32(), c.f32(), 0.5f, n); });
  return 12.0 * static_cast<double>(n) / seconds;
}

namespace {

// 2 n^3 FLOPs over the best of `repeats` calls of multiply(a, b, c, scratch)
// on n x n fp32 operands a and b (uniform in [-1, 1)), an fp32 product c and
// `scratch_bytes` of scratch.
template <typename Multiply>
absl::StatusOr<double> SquareGemmRate(const GemmOptions& options, int64_t scratch_bytes,
                                      Multiply multiply) {
  const int64_t n = options.size;
  if (n <= 0) return absl::InvalidArgumentError("gemm: size must be > 0");
  HostAllocator allocator;
  Buffer buffers[4];
  const int64_t bytes[4] = {n * n * 4, n * n * 4, n * n * 4, std::max<int64_t>(scratch_bytes, 1)};
  for (int i = 0; i < 4; ++i) {
    TANDEM_ASSIGN_OR_RETURN(buffers[i],
                            Buffer::Allocate(&allocator, bytes[i], MemoryCategory::kWorkspace));
  }
  FillUniform(buffers[0].f32(), n * n, -1.0f, 1.0f, 1, 1);
  FillUniform(buffers[1].f32(), n * n, -1.0f, 1.0f, 1, 2);
  cpu::MatmulShape shape;
  shape.m = shape.n = shape.k = n;
  const double seconds = BestSeconds(options.repeats, [&] {
    multiply(shape, buffers[0].f32(), buffers[1].f32(), buffers[2].f32(), buffers[3].data());
  });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / seconds;
}

}  // namespace

absl::StatusOr<double> MeasureGemmFlopsPerSecond(const GemmOptions& options) {
  return SquareGemmRate(options, 0,
                        [](const cpu::MatmulShape& shape, const float* a, const float* b, float* c,
                           void*) { cpu::Matmul(shape, a, b, c); });
}

absl::StatusOr<double> MeasureBf16GemmFlopsPerSecond(const GemmOptions& options) {
  const std::string isa = cpu::OneDnnIsa();
  if (!Bf16ProductsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("oneDNN runs ", isa, " here, which has no bf16 products"));
  }
  const int64_t n = options.size;
  // As the layers run it: both fp32 operands rounded to bf16, then multiplied.
  return SquareGemmRate(
      options, 2 * n * n * 2,
      [n](const cpu::MatmulShape& shape, const float* a, const float* b, float* c, void* scratch) {
        uint16_t* a16 = static_cast<uint16_t*>(scratch);
        uint16_t* b16 = a16 + n * n;
        cpu::ToBf16(a, a16, n * n);
        cpu::ToBf16(b, b16, n * n);
        cpu::MatmulBf16(shape, a16, b16, c);
      });
}

absl::StatusOr<double> MeasureNativeBf16GemmFlopsPerSecond(const GemmOptions& options) {
  if (!NativeBf16Isa(cpu::OneDnnIsa())) return 0.0;
  return MeasureBf16GemmFlopsPerSecond(options);
}

}  // namespace tandem::profile
