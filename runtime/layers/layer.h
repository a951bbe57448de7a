// A layer of a model chain: forward and backward on one batch, its parameters as
// a slice of the model's contiguous buffers, and its analytic costs.
//
// A model is a chain of layers 1..L (docs/planning.md); the output of layer l is the
// input of layer l+1 and is kept by the caller for backward, so a layer's
// `Backward` receives its input `x` and output `y` again. Anything else a layer
// needs from forward for backward it writes into `saved` (SavedBytes(batch)
// bytes, caller-owned), which is what the executor keeps, offloads or drops for
// recompute. Parameters, gradients and non-trainable buffers (BatchNorm running
// statistics) are views into the model's contiguous state (LayerContext), so a
// layer's whole state moves in one copy.
//
// Shapes: per-sample shapes exclude the batch; tensors passed to Forward and
// Backward carry the batch as dimension 0. Images are NHWC.
//
// A Layer object holds configuration and per-shape caches only (no tensors), so
// one object can run on several threads at once with different contexts.
#ifndef TANDEM_RUNTIME_LAYERS_LAYER_H_
#define TANDEM_RUNTIME_LAYERS_LAYER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/core/device_kind.h"
#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"
#include "runtime/core/tensor.h"

namespace tandem {

namespace cuda {
// Stream, cuBLAS/cuDNN handles and scratch of one CUDA device (runtime/cuda/).
struct CudaContext;
}  // namespace cuda

// What one call costs, analytically, for a given batch.
struct LayerCost {
  // Floating-point operations, in FLOPs (a multiply-add is 2). Backward includes
  // the input gradient.
  double forward_flops = 0;
  double backward_flops = 0;
  // Bytes read and written from memory by the phase (roofline traffic), in bytes.
  double forward_bytes = 0;
  double backward_bytes = 0;
};

// Where a call runs, what it may touch, and how. All pointers (state, tensors,
// workspace) are in the memory of `device`.
struct LayerContext {
  // kCpu and kEmulated run the CPU kernels; kCuda runs CUDA kernels on `cuda`.
  DeviceKind device = DeviceKind::kCpu;
  cuda::CudaContext* cuda = nullptr;
  // This layer's slices of the model state; null for parameterless layers.
  const float* params = nullptr;
  float* grads = nullptr;
  float* buffers = nullptr;
  // Training (dropout on, batch statistics) or evaluation.
  bool training = true;
  // Backward adds into `grads` instead of overwriting them (micro-batches after
  // the first of a step).
  bool accumulate_grads = false;
  // This forward repeats one already run (activation recompute): it must produce
  // the same result and leave state alone (no running-statistics update).
  bool recompute = false;
  // When > 0, the momentum of running-statistics updates in place of the
  // layer's own: 1/n for the n-th batch gives their plain average (SWA's
  // recomputation of batch-norm statistics for an averaged model).
  float running_stats_momentum = 0;
  // Randomness for this call (dropout): a counter-based stream, see random.h.
  uint64_t seed = 0;
  uint64_t rng_stream = 0;
  // Index of this call's first sample within the whole batch (micro-batches and
  // data-parallel shares), so per-element randomness matches a full-batch call.
  uint64_t sample_offset = 0;
  // Elements per sample of the tensor the randomness applies to; set by the
  // layer that draws (see Dropout).
  uint64_t sample_elements = 0;
  // Scratch of at least WorkspaceBytes(batch) bytes, valid for the call only.
  // On CUDA, device memory; library scratch whose size is known only at run time
  // (cuDNN algorithms, CUB sorts) comes from the CudaContext instead.
  void* workspace = nullptr;
  // Class ids for the loss layer: i32 [batch] or [batch, T].
  const int32_t* targets = nullptr;
};

struct ParamSpec {
  std::string name;
  Shape shape;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // The kind, as in profiles and plans: "linear", "conv2d", "transformer_block"...
  virtual const char* kind() const = 0;
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  // Fixes the per-sample input shape, checks it fits, derives the output shape.
  // Must be called once before anything below.
  absl::Status Build(const Shape& input);
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape() const { return output_shape_; }
  // Token ids for embeddings; f32 for everything else.
  virtual DType input_dtype() const { return DType::kF32; }
  // The input type of the layer's matrix products: kF32, or kBF16 or kF16 for
  // mixed precision (16-bit inputs, f32 accumulation and output; tensors,
  // parameters and everything else stay f32). Linear layers and attention
  // honour both 16-bit types on every device; convolutions honour bf16 only
  // (fp16 convolves in fp32, TF32 on CUDA). Set before Build; layers made of
  // parts give it to them.
  void set_compute_dtype(DType dtype) { compute_dtype_ = dtype; }
  DType compute_dtype() const { return compute_dtype_; }
  // The type of the activations Forward and Backward take and give (x, y, dy,
  // dx): kF32, or kBF16 inside a block that keeps its intermediates in bf16
  // (TransformerBlock). Activation and LayerNorm honour kBF16 for all four: on
  // the CPU through oneDNN's bf16 primitives (statistics and math in fp32), on
  // CUDA widened to fp32 in the context's scratch and rounded back. A Linear
  // layer (and Attention, through its qkv projection) then takes x in bf16
  // and keeps no copy of it (Backward gets it again), and reads the types of
  // y, dy and dx from the tensors. Parameters
  // and their gradients stay fp32. Chains of layers pass fp32. Set before
  // Build.
  void set_io_dtype(DType dtype) { io_dtype_ = dtype; }
  DType io_dtype() const { return io_dtype_; }

  // Trainable parameters, in the order they sit in the layer's slice.
  virtual std::vector<ParamSpec> Params() const { return {}; }
  int64_t ParamCount() const;
  // Non-trainable state (e.g. running statistics), in elements.
  virtual int64_t BufferCount() const { return 0; }
  // Deterministic initial values for `params` (ParamCount) and `buffers`
  // (BufferCount) from (seed, stream).
  virtual void Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const {}

  virtual LayerCost Cost(int64_t batch) const = 0;
  // Bytes written into `saved` by Forward for Backward. The same size on every
  // device, holding the same values up to rounding, except max pooling's argmax,
  // which only the CPU writes (CUDA recomputes it from x and y).
  virtual int64_t SavedBytes(int64_t batch) const { return 0; }
  // Scratch bytes a Forward or Backward call needs: the largest any device's
  // code path needs (see runtime/cuda/README.md).
  virtual int64_t WorkspaceBytes(int64_t batch) const { return 0; }
  int64_t OutputBytes(int64_t batch) const { return batch * output_shape_.elements() * 4; }

  // y = f(x). x: [batch, input_shape], y: [batch, output_shape] (caller-owned).
  virtual void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                       void* saved) const = 0;
  // From dy ([batch, output_shape]) computes the parameter gradients (written,
  // or added when ctx.accumulate_grads) and dx when dx.data is not null.
  virtual void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                        const void* saved, const Tensor& dy, const Tensor& dx) const = 0;

 protected:
  // Validates `input` and returns the output shape.
  virtual absl::StatusOr<Shape> InferOutput(const Shape& input) = 0;

 private:
  std::string name_;
  DType compute_dtype_ = DType::kF32;
  DType io_dtype_ = DType::kF32;
  Shape input_shape_;
  Shape output_shape_;
};

// Element counts rounded up so every layer's slice of a contiguous buffer starts
// on a 64-byte boundary.
constexpr int64_t kSliceAlignElements = 16;
inline int64_t AlignElements(int64_t n) {
  return (n + kSliceAlignElements - 1) / kSliceAlignElements * kSliceAlignElements;
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_LAYER_H_
