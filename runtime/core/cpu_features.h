// Which vector instructions this CPU runs, decided once at run time, so one
// binary uses AVX-512 where it exists and AVX2 elsewhere. Two levels are chosen:
// ActiveCpuIsa() for the hand-written intrinsics kernels, which
// TANDEM_CPU_ISA=avx2 (or =scalar) in the environment lowers, and
// AutoVectorizedIsa() for the compiler-vectorised ones (isa_dispatch.h). Tests
// run every level through the kernels' ForIsa entry points instead, skipping
// those the CPU lacks (CpuSupports). Thread-safe.
#ifndef TANDEM_RUNTIME_CORE_CPU_FEATURES_H_
#define TANDEM_RUNTIME_CORE_CPU_FEATURES_H_

// Function multiversioning: GCC emits AVX-512, AVX2 and baseline clones of a
// function and picks one at load time. Sanitizer builds use the baseline only:
// the clones' ifunc resolvers run before the sanitizer runtime starts.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TANDEM_TARGET_CLONES
#else
#define TANDEM_TARGET_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace tandem {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level available and allowed by TANDEM_CPU_ISA: the level of the
// hand-written kernels (Adam).
CpuIsa ActiveCpuIsa();

// The level of the compiler-vectorised kernels (isa_dispatch.h). It is the choice
// GCC's target_clones("avx512f", "avx2", "default") resolver makes: AVX-512F
// alone selects kAvx512 and AVX2 alone kAvx2, and TANDEM_CPU_ISA does not apply.
CpuIsa AutoVectorizedIsa();

// Whether this CPU runs code built for `isa` (AVX2 with FMA; AVX-512 F, BW, VL
// and DQ), whatever TANDEM_CPU_ISA says. Tests that force a level skip the ones
// it lacks.
bool CpuSupports(CpuIsa isa);

const char* CpuIsaName(CpuIsa isa);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_CPU_FEATURES_H_
