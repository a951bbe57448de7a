// Composite layers, built from the primitive layers so every device backend that
// implements those runs them too. They hold the model's skip connections, so the
// chain the planner sees stays a chain.
//
// TransformerBlock (pre-norm, GPT-2):  h = x + Dropout(Attn(LN1(x)));
//                                      y = h + Dropout(FC2(GELU(FC1(LN2(h))))).
// ResidualBlock (ResNet basic block):  y = ReLU(BN2(Conv2(ReLU(BN1(Conv1(x))))) + S(x)),
//   S = identity, or BN(Conv1x1(x)) when the stride or the channels change.
// ResidualAdd is the two-input sum both use: y = a + b; da = db = dy.
#ifndef TANDEM_RUNTIME_LAYERS_BLOCKS_H_
#define TANDEM_RUNTIME_LAYERS_BLOCKS_H_

#include <memory>
#include <optional>

#include "runtime/layers/attention.h"
#include "runtime/layers/conv.h"
#include "runtime/layers/elementwise.h"
#include "runtime/layers/layer.h"
#include "runtime/layers/linear.h"
#include "runtime/layers/norm.h"

namespace tandem {

// y = a + b, and its backward: both inputs receive dy (added into their
// gradients when `accumulate`). With a context, on ctx.device; without, on the CPU.
struct ResidualAdd {
  static void Forward(const float* a, const float* b, float* y, int64_t n);
  static void Backward(const float* dy, float* da, float* db, int64_t n, bool accumulate);
  static void Forward(const LayerContext& ctx, const float* a, const float* b, float* y, int64_t n);
  static void Backward(const LayerContext& ctx, const float* dy, float* da, float* db, int64_t n,
                       bool accumulate);
};

struct TransformerBlockOptions {
  int64_t n_head = 0;
  // 0 = 4 x width.
  int64_t mlp_hidden = 0;
  float dropout = 0.0f;
  float init_stddev = 0.02f;
  // Residual projections (attention output, FC2), GPT-2: 0.02 / sqrt(2 n_layer).
  float residual_init_stddev = 0.02f;
};

class TransformerBlock final : public Layer {
 public:
  explicit TransformerBlock(TransformerBlockOptions options);
  const char* kind() const override { return "transformer_block"; }
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
  // Sub-layers in parameter order.
  std::vector<const Layer*> Parts() const;
  // Where Forward leaves what Backward reads, carved from `saved` (null: only
  // its size, which is SavedBytes).
  struct SavedRegions;
  SavedRegions CarveSaved(const void* saved, int64_t batch) const;

  TransformerBlockOptions options_;
  int64_t T_ = 0, C_ = 0, hidden_ = 0;
  std::unique_ptr<LayerNorm> ln1_, ln2_;
  std::unique_ptr<Attention> attn_;
  std::unique_ptr<Linear> fc1_, fc2_;
  std::unique_ptr<Activation> gelu_;
  std::unique_ptr<Dropout> drop1_, drop2_;
};

struct ResidualBlockOptions {
  int64_t out_channels = 0;
  int64_t stride = 1;
};

class ResidualBlock final : public Layer {
 public:
  explicit ResidualBlock(ResidualBlockOptions options);
  const char* kind() const override { return "residual_block"; }
  std::vector<ParamSpec> Params() const override;
  int64_t BufferCount() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override;
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;
  bool has_projection() const { return conv_skip_ != nullptr; }

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  std::vector<const Layer*> Parts() const;
  // As TransformerBlock's.
  struct SavedRegions;
  SavedRegions CarveSaved(const void* saved, int64_t batch) const;

  ResidualBlockOptions options_;
  std::unique_ptr<Conv2d> conv1_, conv2_, conv_skip_;
  std::unique_ptr<BatchNorm2d> bn1_, bn2_, bn_skip_;
  std::unique_ptr<Activation> relu_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_BLOCKS_H_
