// Which vector instructions this CPU runs, decided once at run time, so one
// binary uses AVX-512 where it exists and AVX2 elsewhere. TANDEM_CPU_ISA=avx2 (or
// =scalar) in the environment forces a lower level, for testing the fallbacks.
// Thread-safe.
#ifndef TANDEM_RUNTIME_CORE_CPU_FEATURES_H_
#define TANDEM_RUNTIME_CORE_CPU_FEATURES_H_

namespace tandem {

enum class CpuIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level available and allowed by TANDEM_CPU_ISA.
CpuIsa ActiveCpuIsa();
const char* CpuIsaName(CpuIsa isa);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_CPU_FEATURES_H_
