// Conv2d on NHWC activations: oneDNN direct convolution with the weights in the
// primitive's preferred (blocked) layout, reordered from the plain OIHW
// parameters (PyTorch's layout) on each call; on CUDA, cuDNN. With a bf16
// compute type the inputs are rounded to bf16 (oneDNN: fp32 outputs; cuDNN: bf16
// outputs widened to fp32), and a shape either library has no fast bf16 kernel
// for stays fp32. Pool2d (max, average including
// padding, as PyTorch's defaults) and GlobalAvgPool on oneDNN pooling.
#ifndef TANDEM_RUNTIME_LAYERS_CONV_H_
#define TANDEM_RUNTIME_LAYERS_CONV_H_

#include <memory>

#include "runtime/layers/init.h"
#include "runtime/layers/layer.h"

namespace tandem {

namespace cuda {
struct ConvGeometry;
}  // namespace cuda

struct Conv2dOptions {
  int64_t out_channels = 0;
  int64_t kernel_size = 0;
  int64_t stride = 1;
  int64_t padding = 0;
  bool bias = true;
  InitOptions init;
};

class Conv2d final : public Layer {
 public:
  explicit Conv2d(Conv2dOptions options);
  ~Conv2d() override;
  const char* kind() const override { return "conv2d"; }
  std::vector<ParamSpec> Params() const override;
  void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t WorkspaceBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;
  // The oneDNN implementations the layer runs at `batch` on the CPU:
  // forward, backward data and backward weights, space-separated.
  std::string CpuImplementations(int64_t batch) const;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Primitives;
  const Primitives& Get(int64_t batch) const;
  // The primitives with bf16 inputs (x, W, dy) or fp32 ones.
  Primitives MakePrimitives(int64_t batch, bool bf16) const;
  // CUDA builds: the cuDNN geometry, in bf16 where asked for and cuDNN has it.
  cuda::ConvGeometry CudaGeometry(const LayerContext& ctx, int64_t batch) const;

  Conv2dOptions options_;
  struct Cache;
  std::unique_ptr<Cache> cache_;
};

enum class PoolKind { kMax, kAvg };

struct Pool2dOptions {
  PoolKind pool = PoolKind::kMax;
  int64_t kernel_size = 2;
  // 0 = kernel_size.
  int64_t stride = 0;
  int64_t padding = 0;
};

class Pool2d final : public Layer {
 public:
  explicit Pool2d(Pool2dOptions options);
  ~Pool2d() override;
  const char* kind() const override;
  LayerCost Cost(int64_t batch) const override;
  int64_t SavedBytes(int64_t batch) const override;
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;
  // The oneDNN implementations the layer runs at `batch` on the CPU:
  // forward, backward data and backward weights, space-separated.
  std::string CpuImplementations(int64_t batch) const;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  struct Primitives;
  const Primitives& Get(int64_t batch) const;

  Pool2dOptions options_;
  // Global pooling: the window is the whole image and the output is [C].
  bool global_ = false;
  struct Cache;
  std::unique_ptr<Cache> cache_;

  friend class GlobalAvgPool;
};

// [H, W, C] -> [C]: the mean over each channel's image.
class GlobalAvgPool final : public Layer {
 public:
  GlobalAvgPool();
  const char* kind() const override { return "global_avg_pool"; }
  LayerCost Cost(int64_t batch) const override { return pool_.Cost(batch); }
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override;
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override;

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override;

 private:
  Pool2d pool_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_CONV_H_
