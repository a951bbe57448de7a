// Normalisation layers on oneDNN: BatchNorm2d over NHWC images (batch statistics
// in training, running statistics in evaluation, updated as PyTorch does:
// momentum 0.1, unbiased running variance) and LayerNorm over the last dimension.
// Both have a scale (init 1) and a shift (init 0).
#ifndef TANDEM_RUNTIME_LAYERS_NORM_H_
#define TANDEM_RUNTIME_LAYERS_NORM_H_

#include <memory>

#include "runtime/layers/layer.h"

namespace tandem {

class BatchNorm2d final : public Layer {
 public:
  BatchNorm2d(float momentum = 0.1f, float epsilon = 1e-5f);
  ~BatchNorm2d() override;
  const char* kind() const override { return "batch_norm2d"; }
  std::vector<ParamSpec> Params() const override;
  // Running mean then running variance, [C] each.
  int64_t BufferCount() const override { return 2 * channels_; }
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override { return 2 * channels_ * 4; }
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Primitives;
  const Primitives& Get(int64_t batch) const;

  float Momentum(const LayerContext& ctx) const {
    return ctx.running_stats_momentum > 0 ? ctx.running_stats_momentum : momentum_;
  }
  const float momentum_, epsilon_;
  int64_t channels_ = 0;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

class LayerNorm final : public Layer {
 public:
  explicit LayerNorm(float epsilon = 1e-5f);
  ~LayerNorm() override;
  const char* kind() const override { return "layer_norm"; }
  std::vector<ParamSpec> Params() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  // Mean and variance per row.
  int64_t SavedBytes(int64_t batch) const override { return 2 * Rows(batch) * 4; }
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Primitives;
  const Primitives& Get(int64_t batch) const;
  int64_t Rows(int64_t batch) const { return batch * (input_shape().elements() / width_); }

  const float epsilon_;
  int64_t width_ = 0;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_NORM_H_
