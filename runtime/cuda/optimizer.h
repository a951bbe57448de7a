// The GPU side of an optimizer step: Optimizer::UpdateSlice's contract (a range
// of the flat parameter, gradient and moment buffers, this step's constants from
// Optimizer::BeginStep) for buffers in device memory, on the fused kernels of
// kernels/optimizer.h. The hybrid executor calls it for the layers a plan
// updates on the GPU and Optimizer::UpdateSlice for the rest, with the same
// StepConstants, so both devices apply the same step. Only in CUDA builds.
// Thread-safe as the context is (one thread per context).
#ifndef TANDEM_RUNTIME_CUDA_OPTIMIZER_H_
#define TANDEM_RUNTIME_CUDA_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "runtime/cuda/context.h"
#include "runtime/optim/optimizer.h"

namespace tandem::cuda {

// Updates elements [0, n) of the device buffers on ctx->stream; `states` holds
// Optimizer::state_count() device pointers at the same offset as params.
absl::Status UpdateSlice(CudaContext* ctx, const StepConstants& c, float* params,
                         const float* grads, float* const* states, int64_t n);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_OPTIMIZER_H_
