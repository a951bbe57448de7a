// Linear: y = x W^T + b over the last dimension, W [out, in] (PyTorch's layout).
// Inputs may have leading dimensions beyond the batch ([B, T, C] in a GPT); they
// are flattened into rows. GEMMs run on oneDNN's matmul (matmul.h) or cuBLAS
// (device_ops); with a 16-bit compute type their inputs (x, W, dy) are rounded
// to 16 bits first (on the device the layer runs on) and the products
// accumulate in f32 into f32 outputs and gradients. Forward keeps its 16-bit
// copy of x in `saved` for backward, which then reads that copy and never x:
// a caller may pass backward an x without data (shape only) there.
#ifndef TANDEM_RUNTIME_LAYERS_LINEAR_H_
#define TANDEM_RUNTIME_LAYERS_LINEAR_H_

#include "runtime/layers/init.h"
#include "runtime/layers/layer.h"

namespace tandem {

struct LinearOptions {
  int64_t out_features = 0;
  bool bias = true;
  InitOptions init;
};

class Linear final : public Layer {
 public:
  explicit Linear(LinearOptions options) : options_(options) {}
  const char* kind() const override { return "linear"; }

  std::vector<ParamSpec> Params() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override;
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return options_.out_features; }

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  int64_t Rows(int64_t batch) const { return batch * (input_shape().elements() / in_); }

  LinearOptions options_;
  int64_t in_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_LINEAR_H_
