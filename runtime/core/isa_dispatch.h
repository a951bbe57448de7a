// Runs a compiler-vectorised kernel body at an instruction-set level picked at
// run time: CallForIsa<Body>(isa, args...) calls Body(args...) inlined into a
// function compiled for AVX-512F, for AVX2 or for the baseline (x86-64, SSE2;
// CpuIsa::kScalar), so the `omp simd` loops in Body vectorise for that level.
// Production passes AutoVectorizedIsa() (cpu_features.h); tests pass each level
// in turn, which is how every vector path of these kernels gets run on one
// machine. The target strings are the ones TANDEM_TARGET_CLONES uses, so a level
// compiles as that macro's clone for it would; unlike the clones' ifunc
// resolvers, nothing here runs before main, so sanitizer builds run every level.
//
// Body is a function whose loops are written out in it: OpenMP lowers a loop
// where it appears, before inlining, so an `omp simd` loop around a call to a
// lambda or functor does not vectorise (GCC 12), and an `omp parallel` in Body
// would outline a baseline-only function. Parallel regions therefore stay in the
// caller, which calls CallForIsa per thread on that thread's share. The caller
// checks that the CPU has `isa` (CpuSupports). Thread-safe (no state).
#ifndef TANDEM_RUNTIME_CORE_ISA_DISPATCH_H_
#define TANDEM_RUNTIME_CORE_ISA_DISPATCH_H_

#include <utility>

#include "runtime/core/cpu_features.h"

namespace tandem {
namespace isa_dispatch_internal {

// `flatten` inlines Body (and what it calls) here, where the level is set.
template <auto Body, typename... Args>
__attribute__((target("avx512f"), flatten)) auto RunAvx512(Args&&... args) {
  return Body(std::forward<Args>(args)...);
}

template <auto Body, typename... Args>
__attribute__((target("avx2"), flatten)) auto RunAvx2(Args&&... args) {
  return Body(std::forward<Args>(args)...);
}

template <auto Body, typename... Args>
__attribute__((flatten)) auto RunBaseline(Args&&... args) {
  return Body(std::forward<Args>(args)...);
}

}  // namespace isa_dispatch_internal

template <auto Body, typename... Args>
auto CallForIsa(CpuIsa isa, Args&&... args) {
  switch (isa) {
    case CpuIsa::kAvx512:
      return isa_dispatch_internal::RunAvx512<Body>(std::forward<Args>(args)...);
    case CpuIsa::kAvx2:
      return isa_dispatch_internal::RunAvx2<Body>(std::forward<Args>(args)...);
    case CpuIsa::kScalar:
      break;
  }
  return isa_dispatch_internal::RunBaseline<Body>(std::forward<Args>(args)...);
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_ISA_DISPATCH_H_
