// Which vector instructions this CPU runs, decided once at run time, so one
// binary uses AVX-512 where it exists and AVX2 elsewhere. TANDEM_CPU_ISA=avx2 (or
// =scalar) in the environment forces a lower level, for testing the fallbacks.
// Thread-safe.
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

// The best level available and allowed by TANDEM_CPU_ISA.
CpuIsa ActiveCpuIsa();
const char* CpuIsaName(CpuIsa isa);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_CPU_FEATURES_H_
