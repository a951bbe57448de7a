// The optimizer kernels of kernels.h at a given instruction-set level instead of
// the one the dispatch picks, so tests run every vector path on any CPU that has
// it. The public functions are these at ActiveCpuIsa() (Adam) or
// AutoVectorizedIsa() (SGD, SumOfSquares). Apart from kernels.h because nvcc
// compiles that header for the CUDA optimizer with no other inputs. The caller
// checks CpuSupports(isa). Thread-safe.
#ifndef TANDEM_RUNTIME_OPTIM_KERNELS_INTERNAL_H_
#define TANDEM_RUNTIME_OPTIM_KERNELS_INTERNAL_H_

#include <cstdint>

#include "runtime/core/cpu_features.h"
#include "runtime/optim/kernels.h"

namespace tandem::optim::internal {

void AdamUpdateForIsa(CpuIsa isa, float* p, const float* g, float* m, float* v, int64_t n,
                      const AdamStep& s);
void AdamUpdateBf16ForIsa(CpuIsa isa, float* p, const uint16_t* g, float* m, float* v,
                          uint16_t* copy, int64_t n, const AdamStep& s);
void SgdUpdateForIsa(CpuIsa isa, float* p, const float* g, float* buf, int64_t n, const SgdStep& s);
double SumOfSquaresForIsa(CpuIsa isa, const float* x, int64_t n);

}  // namespace tandem::optim::internal

#endif  // TANDEM_RUNTIME_OPTIM_KERNELS_INTERNAL_H_
