// Shape-preserving layers: ReLU and GELU (oneDNN eltwise), Dropout (counter-based
// mask, see random.h), and Flatten ([B, ...] -> [B, prod(...)]).
#ifndef TANDEM_RUNTIME_LAYERS_ELEMENTWISE_H_
#define TANDEM_RUNTIME_LAYERS_ELEMENTWISE_H_

#include <memory>

#include "runtime/layers/layer.h"

namespace tandem {

enum class ActivationKind {
  kRelu,
  // The tanh approximation (GPT-2; PyTorch's GELU(approximate='tanh')).
  kGelu,
};

class Activation final : public Layer {
 public:
  explicit Activation(ActivationKind activation);
  ~Activation() override;
  const char* kind() const override;
  LayerCost Cost(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override { return input; }

 private:
  struct Primitives;
  const Primitives& Get(int64_t elements) const;

  const ActivationKind activation_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

class Dropout final : public Layer {
 public:
  // Drop probability in [0, 1).
  explicit Dropout(float probability) : p_(probability) {}
  const char* kind() const override { return "dropout"; }
  LayerCost Cost(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;
  float probability() const { return p_; }

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  const float p_;
};

class Flatten final : public Layer {
 public:
  const char* kind() const override { return "flatten"; }
  LayerCost Cost(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_ELEMENTWISE_H_
