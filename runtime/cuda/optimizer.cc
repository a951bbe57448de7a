#include "runtime/cuda/optimizer.h"

#include "runtime/cuda/kernels/optimizer.h"

namespace tandem::cuda {

absl::Status UpdateSlice(CudaContext* ctx, const StepConstants& c, float* params,
                         const float* grads, float* const* states, int64_t n) {
  if (c.kind == tandem::v1::OPTIMIZER_KIND_SGD) {
    return CudaStatus(
        SgdUpdate(params, grads, c.sgd.momentum > 0 ? states[0] : nullptr, n, c.sgd, ctx->stream),
        "SgdUpdate");
  }
  return CudaStatus(AdamUpdate(params, grads, states[0], states[1], n, c.adam, ctx->stream),
                    "AdamUpdate");
}

}  // namespace tandem::cuda
