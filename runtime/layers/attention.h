// Causal multi-head self-attention with its projections, on [T, C] sequences:
//   qkv = x Wqkv^T + bqkv;  per head h: att = softmax(mask(q k^T / sqrt(hs)));
//   o = att v;  y = concat_h(o) Wproj^T + bproj.
// The GEMMs run on oneDNN matmul (batched over batch x heads), the softmax on
// oneDNN softmax; the causal mask sets future positions to -inf before it.
// Under a 16-bit compute type each product's operands are rounded once:
// forward saves q, k and v in 16 bits only (backward uses them only in
// products), and backward rounds dO and dS once for their two products each.
#ifndef TANDEM_RUNTIME_LAYERS_ATTENTION_H_
#define TANDEM_RUNTIME_LAYERS_ATTENTION_H_

#include <algorithm>
#include <memory>

#include "runtime/cpu/matmul.h"
#include "runtime/layers/layer.h"
#include "runtime/layers/linear.h"

namespace tandem {

struct AttentionOptions {
  int64_t n_head = 0;
  InitOptions init{InitKind::kNormal, 0.02f};
  // Init std of the output projection (GPT-2 scales it by 1/sqrt(2 n_layer)).
  float projection_stddev = 0.02f;
};

class Attention final : public Layer {
 public:
  explicit Attention(AttentionOptions options);
  ~Attention() override;
  const char* kind() const override { return "attention"; }
  std::vector<ParamSpec> Params() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override;
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Softmax;
  const Softmax& GetSoftmax(int64_t batch) const;
  // Scratch after the attention's own temporaries: the projections' workspace,
  // or two slots for the 16-bit products' operand copies.
  int64_t ScratchBytes(int64_t batch) const;
  // Elements of the largest 16-bit operand copy: [B, H, T, T] or [B, T, C].
  int64_t SlotElements(int64_t batch) const {
    return std::max(batch * T_ * C_, batch * options_.n_head * T_ * T_);
  }
  // Where forward's results for backward sit in `saved` (null: sizes only).
  struct SavedRegions;
  SavedRegions CarveSaved(const void* saved, int64_t batch) const;

  AttentionOptions options_;
  int64_t T_ = 0, C_ = 0, hs_ = 0;
  Linear qkv_, proj_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_ATTENTION_H_
