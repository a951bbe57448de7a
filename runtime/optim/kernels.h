// Fused optimizer kernels over contiguous fp32 buffers: one pass reads and writes
// each element once. AVX-512, AVX2 or scalar, chosen at run time (cpu_features.h):
// Adam is written in intrinsics, SGD and SumOfSquares are vectorised by the
// compiler at each level (isa_dispatch.h), and kernels_internal.h runs either at
// any level for tests; multi-threaded with OpenMP over contiguous chunks. The
// arithmetic follows PyTorch's torch.optim implementations (single-tensor path),
// so runs match it to rounding. Thread-safe.
#ifndef TANDEM_RUNTIME_OPTIM_KERNELS_H_
#define TANDEM_RUNTIME_OPTIM_KERNELS_H_

#include <cstdint>

namespace tandem::optim {

// Adam / AdamW for step t (1-based):
//   g' = grad_scale * g (+ weight_decay * p when !decoupled)
//   p  = p * (1 - lr * weight_decay)                   (decoupled, AdamW)
//   m  = beta1 m + (1 - beta1) g';   v = beta2 v + (1 - beta2) g'^2
//   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
struct AdamStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled = false;
  float grad_scale = 1.0f;
  int64_t t = 1;
};
void AdamUpdate(float* p, const float* g, float* m, float* v, int64_t n, const AdamStep& s);

// Adam in mixed precision (docs/planning.md, "Mixed precision"): the step above
// on fp32 master weights `p` and state from bf16 gradients `g` (widened
// exactly), and in the same pass the updated weights rounded to bf16 (nearest,
// ties to even; NaN stays NaN) into `copy`, the working copy the forward reads:
// 28 bytes per parameter, as the fp32 step. `p` ends equal to AdamUpdate's on
// the widened gradients at the same instruction-set level.
void AdamUpdateBf16(float* p, const uint16_t* g, float* m, float* v, uint16_t* copy, int64_t n,
                    const AdamStep& s);

// The per-step constants every Adam implementation (AVX-512, AVX2, scalar, the
// fused CUDA kernel) uses, derived once: bias corrections in double, the rest in
// fp32. Per element, with g' = grad_scale * g + l2 * p:
//   m = beta1 m + one_minus_beta1 g';  v = beta2 v + one_minus_beta2 g'^2
//   p = decay p - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
struct AdamConstants {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, decay, l2,
      grad_scale;
};
AdamConstants MakeAdamConstants(const AdamStep& s);

// SGD with optional momentum (PyTorch, dampening 0):
//   g' = grad_scale * g + weight_decay * p
//   buf = g' on the first step, else momentum * buf + g'
//   p -= lr * (nesterov ? g' + momentum * buf : buf)      (momentum > 0)
//   p -= lr * g'                                           (momentum = 0; buf unused)
struct SgdStep {
  float lr = 1e-2f;
  float momentum = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  bool first_step = true;
};
void SgdUpdate(float* p, const float* g, float* buf, int64_t n, const SgdStep& s);

// sum_i x[i]^2, accumulated in double per thread.
double SumOfSquares(const float* x, int64_t n);

// For tests and benchmarks: which implementation the dispatch picks.
const char* AdamImplementation();

}  // namespace tandem::optim

#endif  // TANDEM_RUNTIME_OPTIM_KERNELS_H_
