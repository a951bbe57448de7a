// Softmax cross-entropy: the last layer of every chain. Input: logits [P, V] per
// sample (P = 1 for classification, T for a language model); targets in the
// context (i32 [batch * P]); output: per-sample loss [1], the mean over its P
// positions of -log softmax(logits)[target], in nats. Backward takes dy [batch, 1]
// (the trainer passes 1/batch for a mean loss) and gives
//   dlogits = (softmax(logits) - onehot(target)) * dy / P.
// The log-softmax runs on oneDNN's logsoftmax and is kept for backward.
#ifndef TANDEM_RUNTIME_LAYERS_LOSS_H_
#define TANDEM_RUNTIME_LAYERS_LOSS_H_

#include <memory>

#include "runtime/layers/layer.h"

namespace tandem {

class CrossEntropy final : public Layer {
 public:
  CrossEntropy();
  ~CrossEntropy() override;
  const char* kind() const override { return "cross_entropy"; }
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override { return batch * input_shape().elements() * 4; }
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

  int64_t classes() const { return classes_; }
  int64_t positions() const { return positions_; }

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Primitives;
  const Primitives& Get(int64_t batch) const;

  int64_t classes_ = 0, positions_ = 0;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_LOSS_H_
