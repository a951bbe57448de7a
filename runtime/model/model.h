// A model: a chain of layers built from a ModelSpec, and the layout of its
// state in contiguous buffers (llm.c's one-allocation-per-state): every layer's
// parameters are one 64-byte-aligned slice of the parameter buffer, and its
// gradients, optimizer moments and non-trainable buffers sit at the same offsets
// of their own buffers. Moving a layer's whole state is one copy per buffer.
//
// A Model is immutable after Build and safe to use from several threads; the
// state it describes is owned elsewhere (ModelState, the executor).
#ifndef TANDEM_RUNTIME_MODEL_MODEL_H_
#define TANDEM_RUNTIME_MODEL_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/core/allocator.h"
#include "runtime/data/data_info.h"
#include "runtime/layers/layer.h"
#include "runtime/layers/loss.h"
#include "tandem/v1/model.pb.h"

namespace tandem {

// `spec` with every preset size that was left at zero set to its default
// (mlp hidden [1024, 1024], cnn 32/64/512/k5, resnet 16/3/2, gpt 4/4/256/128 with
// the dataset's vocabulary), so a job's resolved spec shows what it trains.
tandem::v1::ModelSpec WithPresetDefaults(const tandem::v1::ModelSpec& spec, const DataInfo& data);

// The gpt preset's context when unset, in tokens.
constexpr int64_t kDefaultGptContext = 128;

class Model {
 public:
  // Builds the chain for `spec` on data described by `data`; the loss layer is
  // appended. INVALID_ARGUMENT names the offending field ("model.gpt.n_head").
  // `compute`: the layers' matrix-product input type (Layer::compute_dtype;
  // kBF16 for a bf16 mixed-precision job). The fingerprint does not depend on
  // it: a bf16 job's checkpoint is the same fp32 state.
  static absl::StatusOr<std::unique_ptr<Model>> Build(const tandem::v1::ModelSpec& spec,
                                                      const DataInfo& data,
                                                      DType compute = DType::kF32);
  // From explicit layers (tests); the last must be the loss.
  static absl::StatusOr<std::unique_ptr<Model>> FromLayers(
      std::vector<std::unique_ptr<Layer>> layers, const DataInfo& data);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer& layer(int l) const { return *layers_[l]; }
  const CrossEntropy& loss() const { return *loss_; }
  const DataInfo& data() const { return data_; }

  // Elements of each contiguous buffer (slices padded to 64 bytes).
  int64_t parameter_elements() const { return param_offsets_.back(); }
  int64_t buffer_elements() const { return buffer_offsets_.back(); }
  // Trainable parameters, unpadded.
  int64_t parameter_count() const { return parameter_count_; }
  // Offset (elements) of layer l's slice; offset(num_layers()) is the total.
  int64_t param_offset(int l) const { return param_offsets_[l]; }
  int64_t buffer_offset(int l) const { return buffer_offsets_[l]; }
  int64_t param_slice(int l) const { return param_offsets_[l + 1] - param_offsets_[l]; }
  int64_t buffer_slice(int l) const { return buffer_offsets_[l + 1] - buffer_offsets_[l]; }

  // Deterministic initial parameters and buffers from `seed`.
  void Initialize(float* params, float* buffers, uint64_t seed) const;

  // Largest workspace any layer needs at this batch size, in bytes.
  int64_t MaxWorkspaceBytes(int64_t batch) const;
  // Activation bytes one forward keeps for backward: outputs and saved tensors.
  int64_t ActivationBytes(int64_t batch) const;

  // The layers' matrix-product input type (kBF16 or kF16 when Build was asked
  // for it, or when FromLayers got a layer that computes in one).
  DType compute_dtype() const { return compute_; }

  // Hex digest of the architecture (kinds, shapes, parameter layout); equal
  // models hash equal. Checkpoints and profiles are keyed by it.
  const std::string& fingerprint() const { return fingerprint_; }
  // One line per layer: "3 linear1 [784] -> [1024] 803,840 params".
  std::string Summary() const;

 private:
  Model() = default;
  absl::Status Finish();
  // INVALID_ARGUMENT when a layer's output per sample has more than
  // kMaxSampleElements elements or one of its parameters more than
  // kMaxParameterElements, or a size overflows. These bound arithmetic, not
  // resources: a model too large for the node is admission's RESOURCE_EXHAUSTED.
  static absl::Status CheckSizes(int l, const Layer& layer);
  // 2^40 per sample: times a batch of at most 2^16 and 4 bytes, still 2^5
  // below int64's limit for the sums made of it.
  static constexpr int64_t kMaxSampleElements = int64_t{1} << 40;
  // 2^46 parameters (256 TiB of fp32), per tensor and in all.
  static constexpr int64_t kMaxParameterElements = int64_t{1} << 46;

  std::vector<std::unique_ptr<Layer>> layers_;
  const CrossEntropy* loss_ = nullptr;
  DataInfo data_;
  std::vector<int64_t> param_offsets_, buffer_offsets_;
  int64_t parameter_count_ = 0;
  DType compute_ = DType::kF32;
  std::string fingerprint_;
};

// A layer's state as the device that computes it holds it, for `elements`
// parameters and `optimizer_states` fp32 elements of state per parameter, in a
// job computing in `compute` (docs/planning.md, "Mixed precision"). The plans
// (AnalyticProfile) and the executor's step program (ExecutorLayerSizes) both
// count from here.
//   fp32: weights 4 bytes, gradient 4, state 4k.
//   bf16: a bf16 working copy of the weights (2) and a bf16 gradient (2), the
//         fp32 master weights beside the fp32 state where the update runs
//         (4k + 4), and, while the layer computes, its weights widened to fp32
//         and an fp32 gradient to accumulate into (8, `staging`): the layers
//         read and write fp32 state whatever they compute in.
// A layer updated on the accelerator keeps its fp32 master as its weights and
// an fp32 gradient instead (4 + 4 + 4k): the same total, so the plan's count
// holds for it too.
struct LayerStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  int64_t staging = 0;
};
LayerStateBytes StateBytesOf(int64_t elements, int optimizer_states, DType compute);

// The host copy of a model's state: parameters, gradients and non-trainable
// buffers, each one contiguous allocation. Optimizer moments belong to the
// optimizer (optimizer.h). Not synchronised.
class ModelState {
 public:
  static absl::StatusOr<ModelState> Allocate(const Model& model, Allocator* allocator);

  float* params() const { return params_.f32(); }
  float* grads() const { return grads_.f32(); }
  float* buffers() const { return buffers_.f32(); }
  float* layer_params(const Model& m, int l) const { return params() + m.param_offset(l); }
  float* layer_grads(const Model& m, int l) const { return grads() + m.param_offset(l); }
  float* layer_buffers(const Model& m, int l) const {
    return buffers_.empty() ? nullptr : buffers() + m.buffer_offset(l);
  }

 private:
  Buffer params_, grads_, buffers_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_MODEL_MODEL_H_
