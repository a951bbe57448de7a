#include "runtime/layers/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/core/random.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/kernels/embedding.h"
#endif

namespace tandem {

absl::StatusOr<Shape> Embedding::InferOutput(const Shape& input) {
  if (input.rank() != 1) return absl::InvalidArgumentError("needs token ids [T]");
  if (options_.vocab_size <= 0) return absl::InvalidArgumentError("vocab_size must be > 0");
  if (options_.dim <= 0) return absl::InvalidArgumentError("dim must be > 0");
  if (options_.max_positions == 0) options_.max_positions = input[0];
  if (input[0] > options_.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence length ", input[0], " exceeds max_positions ", options_.max_positions));
  }
  return Shape({input[0], options_.dim});
}

std::vector<ParamSpec> Embedding::Params() const {
  return {{"token_embedding", Shape({options_.vocab_size, options_.dim})},
          {"position_embedding", Shape({options_.max_positions, options_.dim})}};
}

void Embedding::Initialize(float* params, float*, uint64_t seed, uint64_t stream) const {
  const int64_t n_tok = options_.vocab_size * options_.dim;
  FillNormal(params, n_tok, 0.0f, options_.init_stddev, seed, MixStream(stream, 1));
  FillNormal(params + n_tok, options_.max_positions * options_.dim, 0.0f, options_.init_stddev,
             seed, MixStream(stream, 2));
}

LayerCost Embedding::Cost(int64_t batch) const {
  const double outputs = static_cast<double>(batch * output_shape().elements());
  return LayerCost{outputs, 2 * outputs, 4 * 3 * outputs, 4 * 4 * outputs};
}

void Embedding::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
  const int64_t B = x.batch(), T = input_shape()[0], C = options_.dim;
  const float* wte = ctx.params;
  const float* wpe = ctx.params + options_.vocab_size * C;
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    ctx.cuda->Check(cuda::EmbeddingForward(y.f32(), x.i32(), wte, wpe, B, T, C, ctx.cuda->stream),
                    "EmbeddingForward");
    return;
  }
#endif
  const int32_t* ids = x.i32();
  float* out = y.f32();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const float* tok = wte + static_cast<int64_t>(ids[b * T + t]) * C;
      const float* pos = wpe + t * C;
      float* o = out + (b * T + t) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = tok[c] + pos[c];
    }
  }
}

void Embedding::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void*,
                         const Tensor& dy, const Tensor&) const {
  const int64_t B = x.batch(), T = input_shape()[0], C = options_.dim;
  const int64_t V = options_.vocab_size;
  float* dwte = ctx.grads;
  float* dwpe = ctx.grads + V * C;
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // The sort's scratch size is CUB's to say, so it comes from the context's
    // scratch rather than the layer's workspace (WorkspaceBytes stays 0).
    size_t bytes = 0;
    if (!ctx.cuda->Check(cuda::EmbeddingBackwardScratchBytes(B, T, V, &bytes),
                         "EmbeddingBackwardScratchBytes")) {
      return;
    }
    void* scratch = ctx.cuda->Scratch(static_cast<int64_t>(bytes));
    if (scratch == nullptr) return;
    ctx.cuda->Check(
        cuda::EmbeddingBackward(dwte, dwpe, dy.f32(), x.i32(), B, T, C, V, options_.max_positions,
                                ctx.accumulate_grads, scratch, bytes, ctx.cuda->stream),
        "EmbeddingBackward");
    return;
  }
#endif
  const int32_t* ids = x.i32();
  const float* g = dy.f32();
  // Each thread owns a range of channels of both tables: no two threads write
  // the same element, and the summation order is fixed.
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), t_id = omp_get_thread_num();
    const int64_t chunk = (C + threads - 1) / threads;
    const int64_t c0 = std::min(C, t_id * chunk), c1 = std::min(C, c0 + chunk);
    if (c0 < c1) {
      if (!ctx.accumulate_grads) {
        for (int64_t v = 0; v < V; ++v) std::fill(dwte + v * C + c0, dwte + v * C + c1, 0.0f);
        for (int64_t t = 0; t < options_.max_positions; ++t) {
          std::fill(dwpe + t * C + c0, dwpe + t * C + c1, 0.0f);
        }
      }
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = 0; t < T; ++t) {
          const float* src = g + (b * T + t) * C;
          float* tok = dwte + static_cast<int64_t>(ids[b * T + t]) * C;
          float* pos = dwpe + t * C;
#pragma omp simd
          for (int64_t c = c0; c < c1; ++c) {
            tok[c] += src[c];
            pos[c] += src[c];
          }
        }
      }
    }
  }
}

}  // namespace tandem
