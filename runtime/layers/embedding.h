// Token embedding plus learned positional embedding (GPT-2):
//   y[b, t, :] = wte[x[b, t], :] + wpe[t, :],  x: i32 token ids [B, T].
// Ids must lie in [0, vocab_size); the dataset and the job validation ensure it.
#ifndef TANDEM_RUNTIME_LAYERS_EMBEDDING_H_
#define TANDEM_RUNTIME_LAYERS_EMBEDDING_H_

#include "runtime/layers/layer.h"

namespace tandem {

struct EmbeddingOptions {
  int64_t vocab_size = 0;
  int64_t dim = 0;
  // 0 = the input's sequence length.
  int64_t max_positions = 0;
  float init_stddev = 0.02f;
};

class Embedding final : public Layer {
 public:
  explicit Embedding(EmbeddingOptions options) : options_(options) {}
  const char* kind() const override { return "embedding"; }
  DType input_dtype() const override { return DType::kI32; }
  std::vector<ParamSpec> Params() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  EmbeddingOptions options_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_EMBEDDING_H_
