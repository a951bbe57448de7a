// What the host's cores and memory can do, measured in this process on the
// current OpenMP team: the STREAM triad bandwidth and the fp32 GEMM rate of
// oneDNN's matmul (the same primitive every layer's GEMM uses). The planner
// compares layers' achieved rates against these. Thread-safe (each call uses
// its own buffers), but concurrent calls measure each other.
#ifndef TANDEM_RUNTIME_PROFILE_CPU_PEAKS_H_
#define TANDEM_RUNTIME_PROFILE_CPU_PEAKS_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace tandem::profile {

struct TriadOptions {
  // Elements of each of the three fp32 arrays; the default (3 x 64 MiB) is well
  // beyond any last-level cache, as STREAM asks.
  int64_t elements = int64_t{16} << 20;
  // Timed runs after one warm-up; the best is reported, as STREAM does.
  int repeats = 5;
};

// a[i] = b[i] + s * c[i] in bytes per second, counting 12 bytes per element
// (two reads, one write; no write-allocate traffic, as STREAM counts).
absl::StatusOr<double> MeasureTriadBytesPerSecond(const TriadOptions& options = {});

struct GemmOptions {
  // Square m = n = k.
  int64_t size = 1024;
  // Timed runs after one warm-up; the best is reported.
  int repeats = 5;
};

// 2 * m * n * k / seconds of oneDNN's fp32 matmul, in FLOP/s.
absl::StatusOr<double> MeasureGemmFlopsPerSecond(const GemmOptions& options = {});
// The same for the bf16 products of a mixed-precision job as its layers run
// them: both fp32 operands rounded to bf16 (cpu::ToBf16), then multiplied
// with fp32 accumulation and output (cpu::MatmulBf16), in FLOP/s. On a CPU
// without native bf16 oneDNN emulates it (avx512_core) and this measures the
// emulation; FAILED_PRECONDITION where it has no bf16 products (avx2).
absl::StatusOr<double> MeasureBf16GemmFlopsPerSecond(const GemmOptions& options = {});
// MeasureBf16GemmFlopsPerSecond where oneDNN computes bf16 natively (AMX or
// AVX512-BF16, spec/precision.h NativeBf16Isa), else 0: no bf16 rate.
absl::StatusOr<double> MeasureNativeBf16GemmFlopsPerSecond(const GemmOptions& options = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CPU_PEAKS_H_
