// Fused optimizer steps on the GPU over a flat range of fp32 parameters, their
// gradients and the optimizer's moments (one pass, each element read and written
// once), launched on a caller's stream. The arithmetic is runtime/optim's, with
// the same constants (optim::MakeAdamConstants) and the same rounding steps as
// its AVX-512/AVX2 Adam (the same fused multiply-adds, IEEE sqrt and division),
// so a layer updated on the GPU matches one updated on the CPU to the last bit
// or close to it. Only in CUDA builds. Thread-safe (no state).
#ifndef TANDEM_RUNTIME_CUDA_KERNELS_OPTIMIZER_H_
#define TANDEM_RUNTIME_CUDA_KERNELS_OPTIMIZER_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/optim/kernels.h"

namespace tandem::cuda {

// Adam / AdamW step t over n elements: see optim::AdamStep for the math.
cudaError_t AdamUpdate(float* p, const float* g, float* m, float* v, int64_t n,
                       const optim::AdamStep& step, cudaStream_t stream);

// SGD with optional momentum (buf unused and may be null when momentum is 0):
// see optim::SgdStep.
cudaError_t SgdUpdate(float* p, const float* g, float* buf, int64_t n, const optim::SgdStep& step,
                      cudaStream_t stream);

// Gradient clipping's global norm, as optim::SumOfSquares: *result (device
// memory) = sum_i x[i]^2 over n elements, accumulated in double. A fixed grid of
// kSumOfSquaresPartials blocks writes one partial each into `partials` (device
// scratch of that many doubles) and one thread adds them in order, so the
// result is the same on every run.
constexpr int kSumOfSquaresPartials = 1024;
cudaError_t SumOfSquares(double* result, const float* x, int64_t n, double* partials,
                         cudaStream_t stream);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_KERNELS_OPTIMIZER_H_
