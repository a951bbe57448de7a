#include "runtime/core/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace tandem {
namespace {

CpuIsa DetectIsa() {
  CpuIsa best = CpuIsa::kScalar;
  if (CpuSupports(CpuIsa::kAvx2)) best = CpuIsa::kAvx2;
  if (CpuSupports(CpuIsa::kAvx512)) best = CpuIsa::kAvx512;
  if (const char* forced = std::getenv("TANDEM_CPU_ISA")) {
    CpuIsa cap = best;
    if (std::strcmp(forced, "scalar") == 0) cap = CpuIsa::kScalar;
    if (std::strcmp(forced, "avx2") == 0) cap = CpuIsa::kAvx2;
    if (static_cast<int>(cap) < static_cast<int>(best)) best = cap;
  }
  return best;
}

CpuIsa DetectAutoVectorizedIsa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return CpuIsa::kAvx512;
  if (__builtin_cpu_supports("avx2")) return CpuIsa::kAvx2;
  return CpuIsa::kScalar;
}

}  // namespace

CpuIsa ActiveCpuIsa() {
  static const CpuIsa isa = DetectIsa();
  return isa;
}

CpuIsa AutoVectorizedIsa() {
  static const CpuIsa isa = DetectAutoVectorizedIsa();
  return isa;
}

bool CpuSupports(CpuIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case CpuIsa::kScalar:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
}

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar:
      return "scalar";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace tandem
