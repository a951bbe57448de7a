#include "runtime/model/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "base/work_counters.h"
#include "runtime/core/random.h"
#include "runtime/layers/blocks.h"
#include "runtime/layers/conv.h"
#include "runtime/layers/elementwise.h"
#include "runtime/layers/embedding.h"
#include "runtime/layers/linear.h"
#include "runtime/layers/norm.h"

namespace tandem {
namespace {

using tandem::v1::ModelSpec;

// Preset defaults (the proto comments of model.proto).
constexpr int64_t kMlpHidden = 1024, kMlpHiddenLayers = 2;
constexpr int64_t kCnnConv1 = 32, kCnnConv2 = 64, kCnnHidden = 512, kCnnKernel = 5;
constexpr int64_t kResNetBase = 16, kResNetStages = 3, kResNetBlocks = 2;
constexpr int64_t kGptLayers = 4, kGptHeads = 4, kGptWidth = 256;

absl::Status FieldError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

// Positive value or the default when zero; negative is an error naming `field`.
absl::StatusOr<int64_t> PositiveOr(int64_t value, int64_t fallback, const std::string& field,
                                   int64_t max = int64_t{1} << 20) {
  if (value < 0) return FieldError(field, absl::StrCat("must be > 0, got ", value));
  if (value > max) return FieldError(field, absl::StrCat("must be <= ", max, ", got ", value));
  return value == 0 ? fallback : value;
}

absl::Status CheckProbability(float p, const std::string& field) {
  if (!(p >= 0.0f && p < 1.0f))
    return FieldError(field, absl::StrCat("must be in [0, 1), got ", p));
  return absl::OkStatus();
}

ActivationKind ToActivation(tandem::v1::Activation a) {
  return a == tandem::v1::ACTIVATION_GELU ? ActivationKind::kGelu : ActivationKind::kRelu;
}

using Layers = std::vector<std::unique_ptr<Layer>>;

absl::Status NeedImages(const DataInfo& data, const std::string& field) {
  if (data.input_dtype != DType::kF32 || data.sample_shape.rank() != 3) {
    return FieldError(field,
                      absl::StrCat("needs image samples [H, W, C]; the dataset gives ",
                                   data.sample_shape.ToString(), " ", DTypeName(data.input_dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Layers> BuildMlp(const tandem::v1::MlpSpec& s, const DataInfo& data) {
  if (data.input_dtype != DType::kF32) {
    return FieldError("model.mlp", "needs real-valued inputs; the dataset gives token ids");
  }
  TANDEM_RETURN_IF_ERROR(CheckProbability(s.dropout(), "model.mlp.dropout"));
  std::vector<int64_t> hidden(s.hidden_sizes().begin(), s.hidden_sizes().end());
  if (hidden.empty()) hidden.assign(kMlpHiddenLayers, kMlpHidden);
  if (hidden.size() > 64) return FieldError("model.mlp.hidden_sizes", "at most 64 layers");
  Layers layers;
  layers.push_back(std::make_unique<Flatten>());
  for (size_t i = 0; i < hidden.size(); ++i) {
    const std::string field = absl::StrCat("model.mlp.hidden_sizes[", i, "]");
    if (hidden[i] <= 0 || hidden[i] > (1 << 20)) {
      return FieldError(field, absl::StrCat("must be in [1, 1048576], got ", hidden[i]));
    }
    layers.push_back(std::make_unique<Linear>(LinearOptions{.out_features = hidden[i]}));
    layers.push_back(std::make_unique<Activation>(ToActivation(s.activation())));
    if (s.dropout() > 0) layers.push_back(std::make_unique<Dropout>(s.dropout()));
  }
  layers.push_back(std::make_unique<Linear>(LinearOptions{.out_features = data.num_classes}));
  return layers;
}

absl::StatusOr<Layers> BuildCnn(const tandem::v1::CnnSpec& s, const DataInfo& data) {
  TANDEM_RETURN_IF_ERROR(NeedImages(data, "model.cnn"));
  TANDEM_ASSIGN_OR_RETURN(const int64_t c1, PositiveOr(s.conv1_channels(), kCnnConv1,
                                                       "model.cnn.conv1_channels", 4096));
  TANDEM_ASSIGN_OR_RETURN(const int64_t c2, PositiveOr(s.conv2_channels(), kCnnConv2,
                                                       "model.cnn.conv2_channels", 4096));
  TANDEM_ASSIGN_OR_RETURN(const int64_t h,
                          PositiveOr(s.hidden_size(), kCnnHidden, "model.cnn.hidden_size"));
  TANDEM_ASSIGN_OR_RETURN(const int64_t k,
                          PositiveOr(s.kernel_size(), kCnnKernel, "model.cnn.kernel_size", 31));
  if (k % 2 == 0) return FieldError("model.cnn.kernel_size", absl::StrCat("must be odd, got ", k));
  Layers layers;
  for (int64_t channels : {c1, c2}) {
    layers.push_back(std::make_unique<Conv2d>(
        Conv2dOptions{.out_channels = channels, .kernel_size = k, .stride = 1, .padding = k / 2}));
    layers.push_back(std::make_unique<Activation>(ActivationKind::kRelu));
    layers.push_back(
        std::make_unique<Pool2d>(Pool2dOptions{.pool = PoolKind::kMax, .kernel_size = 2}));
  }
  layers.push_back(std::make_unique<Flatten>());
  layers.push_back(std::make_unique<Linear>(LinearOptions{.out_features = h}));
  layers.push_back(std::make_unique<Activation>(ActivationKind::kRelu));
  layers.push_back(std::make_unique<Linear>(LinearOptions{.out_features = data.num_classes}));
  return layers;
}

absl::StatusOr<Layers> BuildResNet(const tandem::v1::ResNetSpec& s, const DataInfo& data) {
  TANDEM_RETURN_IF_ERROR(NeedImages(data, "model.resnet"));
  TANDEM_ASSIGN_OR_RETURN(const int64_t base, PositiveOr(s.base_channels(), kResNetBase,
                                                         "model.resnet.base_channels", 1024));
  TANDEM_ASSIGN_OR_RETURN(const int64_t stages,
                          PositiveOr(s.stages(), kResNetStages, "model.resnet.stages", 6));
  TANDEM_ASSIGN_OR_RETURN(const int64_t blocks, PositiveOr(s.blocks_per_stage(), kResNetBlocks,
                                                           "model.resnet.blocks_per_stage", 32));
  Layers layers;
  layers.push_back(std::make_unique<Conv2d>(Conv2dOptions{
      .out_channels = base, .kernel_size = 3, .stride = 1, .padding = 1, .bias = false}));
  layers.push_back(std::make_unique<BatchNorm2d>());
  layers.push_back(std::make_unique<Activation>(ActivationKind::kRelu));
  int64_t channels = base;
  for (int64_t stage = 0; stage < stages; ++stage) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      layers.push_back(std::make_unique<ResidualBlock>(
          ResidualBlockOptions{.out_channels = channels, .stride = stride}));
    }
    channels *= 2;
  }
  layers.push_back(std::make_unique<GlobalAvgPool>());
  layers.push_back(std::make_unique<Linear>(LinearOptions{.out_features = data.num_classes}));
  return layers;
}

absl::StatusOr<Layers> BuildGpt(const tandem::v1::GptSpec& s, const DataInfo& data) {
  if (data.input_dtype != DType::kI32 || data.sample_shape.rank() != 1) {
    return FieldError("model.gpt", "needs token sequences (a text or synthetic token dataset)");
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t n_layer,
                          PositiveOr(s.n_layer(), kGptLayers, "model.gpt.n_layer", 1024));
  TANDEM_ASSIGN_OR_RETURN(const int64_t n_head,
                          PositiveOr(s.n_head(), kGptHeads, "model.gpt.n_head", 1024));
  TANDEM_ASSIGN_OR_RETURN(const int64_t d_model,
                          PositiveOr(s.d_model(), kGptWidth, "model.gpt.d_model", 65536));
  TANDEM_ASSIGN_OR_RETURN(const int64_t vocab,
                          PositiveOr(s.vocab_size(), data.num_classes, "model.gpt.vocab_size"));
  TANDEM_RETURN_IF_ERROR(CheckProbability(s.dropout(), "model.gpt.dropout"));
  if (d_model % n_head != 0) {
    return FieldError("model.gpt.n_head",
                      absl::StrCat(n_head, " heads do not divide d_model ", d_model));
  }
  if (vocab < data.num_classes) {
    return FieldError(
        "model.gpt.vocab_size",
        absl::StrCat(vocab, " is smaller than the dataset's vocabulary ", data.num_classes));
  }
  const int64_t T = data.sample_shape[0];
  if (s.context() != 0 && s.context() != T) {
    return FieldError("model.gpt.context",
                      absl::StrCat("is ", s.context(), " but the dataset gives sequences of ", T));
  }
  Layers layers;
  layers.push_back(std::make_unique<Embedding>(
      EmbeddingOptions{.vocab_size = vocab, .dim = d_model, .max_positions = T}));
  const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(n_layer));
  for (int64_t i = 0; i < n_layer; ++i) {
    layers.push_back(std::make_unique<TransformerBlock>(TransformerBlockOptions{
        .n_head = n_head, .dropout = s.dropout(), .residual_init_stddev = residual_std}));
  }
  layers.push_back(std::make_unique<LayerNorm>());
  layers.push_back(std::make_unique<Linear>(
      LinearOptions{.out_features = vocab, .bias = false, .init = {InitKind::kNormal, 0.02f}}));
  return layers;
}

absl::StatusOr<std::unique_ptr<Layer>> BuildConv2d(const tandem::v1::Conv2dLayer& c,
                                                   const std::string& field) {
  if (c.out_channels() <= 0) return FieldError(field + ".out_channels", "must be > 0");
  if (c.kernel_size() <= 0) return FieldError(field + ".kernel_size", "must be > 0");
  if (c.stride() < 0) return FieldError(field + ".stride", "must be >= 0");
  if (c.padding() < 0) return FieldError(field + ".padding", "must be >= 0");
  return std::make_unique<Conv2d>(Conv2dOptions{.out_channels = c.out_channels(),
                                                .kernel_size = c.kernel_size(),
                                                .stride = c.stride() > 0 ? c.stride() : 1,
                                                .padding = c.padding(),
                                                .bias = !c.has_bias() || c.bias()});
}

absl::StatusOr<std::unique_ptr<Layer>> BuildPool2d(const tandem::v1::Pool2dLayer& p,
                                                   const std::string& field) {
  if (p.kind() == tandem::v1::POOL_KIND_UNSPECIFIED) {
    return FieldError(field + ".kind", "must be POOL_KIND_MAX or POOL_KIND_AVG");
  }
  if (p.kernel_size() <= 0) return FieldError(field + ".kernel_size", "must be > 0");
  if (p.stride() < 0) return FieldError(field + ".stride", "must be >= 0");
  return std::make_unique<Pool2d>(
      Pool2dOptions{.pool = p.kind() == tandem::v1::POOL_KIND_MAX ? PoolKind::kMax : PoolKind::kAvg,
                    .kernel_size = p.kernel_size(),
                    .stride = p.stride(),
                    .padding = p.padding()});
}

absl::StatusOr<std::unique_ptr<Layer>> BuildListLayer(const tandem::v1::LayerSpec& s,
                                                      const std::string& field) {
  using tandem::v1::LayerSpec;
  switch (s.kind_case()) {
    case LayerSpec::kLinear: {
      if (s.linear().out_features() <= 0)
        return FieldError(field + ".linear.out_features", "must be > 0");
      return std::make_unique<Linear>(
          LinearOptions{.out_features = s.linear().out_features(),
                        .bias = !s.linear().has_bias() || s.linear().bias()});
    }
    case LayerSpec::kConv2D:
      return BuildConv2d(s.conv2d(), field + ".conv2d");
    case LayerSpec::kPool2D:
      return BuildPool2d(s.pool2d(), field + ".pool2d");
    case LayerSpec::kBatchNorm2D:
      return std::make_unique<BatchNorm2d>(
          s.batch_norm2d().momentum() > 0 ? s.batch_norm2d().momentum() : 0.1f,
          s.batch_norm2d().epsilon() > 0 ? s.batch_norm2d().epsilon() : 1e-5f);
    case LayerSpec::kActivation:
      if (s.activation().activation() == tandem::v1::ACTIVATION_UNSPECIFIED) {
        return FieldError(field + ".activation.activation",
                          "must be ACTIVATION_RELU or ACTIVATION_GELU");
      }
      return std::make_unique<Activation>(ToActivation(s.activation().activation()));
    case LayerSpec::kDropout:
      TANDEM_RETURN_IF_ERROR(
          CheckProbability(s.dropout().probability(), field + ".dropout.probability"));
      return std::make_unique<Dropout>(s.dropout().probability());
    case LayerSpec::kFlatten:
      return std::make_unique<Flatten>();
    case LayerSpec::kLayerNorm:
      return std::make_unique<LayerNorm>(s.layer_norm().epsilon() > 0 ? s.layer_norm().epsilon()
                                                                      : 1e-5f);
    case LayerSpec::kEmbedding: {
      const auto& e = s.embedding();
      if (e.dim() <= 0) return FieldError(field + ".embedding.dim", "must be > 0");
      return std::make_unique<Embedding>(EmbeddingOptions{
          .vocab_size = e.vocab_size(), .dim = e.dim(), .max_positions = e.max_positions()});
    }
    case LayerSpec::kAttention:
      if (s.attention().n_head() <= 0)
        return FieldError(field + ".attention.n_head", "must be > 0");
      return std::make_unique<Attention>(AttentionOptions{.n_head = s.attention().n_head()});
    case LayerSpec::kTransformerBlock: {
      const auto& t = s.transformer_block();
      if (t.n_head() <= 0) return FieldError(field + ".transformer_block.n_head", "must be > 0");
      TANDEM_RETURN_IF_ERROR(CheckProbability(t.dropout(), field + ".transformer_block.dropout"));
      return std::make_unique<TransformerBlock>(TransformerBlockOptions{
          .n_head = t.n_head(), .mlp_hidden = t.mlp_hidden(), .dropout = t.dropout()});
    }
    case LayerSpec::kResidualBlock: {
      const auto& r = s.residual_block();
      if (r.out_channels() <= 0)
        return FieldError(field + ".residual_block.out_channels", "must be > 0");
      return std::make_unique<ResidualBlock>(ResidualBlockOptions{
          .out_channels = r.out_channels(), .stride = r.stride() > 0 ? r.stride() : 1});
    }
    case LayerSpec::kGlobalAvgPool:
      return std::make_unique<GlobalAvgPool>();
    case LayerSpec::KIND_NOT_SET:
      break;
  }
  return FieldError(field, "has no layer kind");
}

uint64_t Fnv1a(const std::string& s, uint64_t h) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

ModelSpec WithPresetDefaults(const ModelSpec& spec, const DataInfo& data) {
  ModelSpec out = spec;
  auto fill = [](auto* msg, auto getter, auto setter, int64_t value) {
    if ((msg->*getter)() == 0) (msg->*setter)(static_cast<int32_t>(value));
  };
  switch (out.model_case()) {
    case ModelSpec::kMlp: {
      auto* m = out.mutable_mlp();
      if (m->hidden_sizes_size() == 0) {
        for (int i = 0; i < kMlpHiddenLayers; ++i) m->add_hidden_sizes(kMlpHidden);
      }
      if (m->activation() == tandem::v1::ACTIVATION_UNSPECIFIED) {
        m->set_activation(tandem::v1::ACTIVATION_RELU);
      }
      break;
    }
    case ModelSpec::kCnn: {
      auto* m = out.mutable_cnn();
      using C = tandem::v1::CnnSpec;
      fill(m, &C::conv1_channels, &C::set_conv1_channels, kCnnConv1);
      fill(m, &C::conv2_channels, &C::set_conv2_channels, kCnnConv2);
      fill(m, &C::hidden_size, &C::set_hidden_size, kCnnHidden);
      fill(m, &C::kernel_size, &C::set_kernel_size, kCnnKernel);
      break;
    }
    case ModelSpec::kResnet: {
      auto* m = out.mutable_resnet();
      using R = tandem::v1::ResNetSpec;
      fill(m, &R::base_channels, &R::set_base_channels, kResNetBase);
      fill(m, &R::stages, &R::set_stages, kResNetStages);
      fill(m, &R::blocks_per_stage, &R::set_blocks_per_stage, kResNetBlocks);
      break;
    }
    case ModelSpec::kGpt: {
      auto* m = out.mutable_gpt();
      using G = tandem::v1::GptSpec;
      fill(m, &G::n_layer, &G::set_n_layer, kGptLayers);
      fill(m, &G::n_head, &G::set_n_head, kGptHeads);
      fill(m, &G::d_model, &G::set_d_model, kGptWidth);
      fill(m, &G::context, &G::set_context, kDefaultGptContext);
      fill(m, &G::vocab_size, &G::set_vocab_size, data.num_classes);
      break;
    }
    default:
      break;
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> Model::Build(const ModelSpec& spec, const DataInfo& data,
                                                    DType compute) {
  work_counters::Count(work_counters::model_builds);
  if (data.num_classes < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: needs at least 2 classes, got ", data.num_classes));
  }
  absl::StatusOr<Layers> layers;
  switch (spec.model_case()) {
    case ModelSpec::kMlp:
      layers = BuildMlp(spec.mlp(), data);
      break;
    case ModelSpec::kCnn:
      layers = BuildCnn(spec.cnn(), data);
      break;
    case ModelSpec::kResnet:
      layers = BuildResNet(spec.resnet(), data);
      break;
    case ModelSpec::kGpt:
      layers = BuildGpt(spec.gpt(), data);
      break;
    case ModelSpec::kLayers: {
      Layers list;
      if (spec.layers().layers_size() == 0) return FieldError("model.layers.layers", "is empty");
      if (spec.layers().layers_size() > 4096)
        return FieldError("model.layers.layers", "at most 4096 layers");
      for (int i = 0; i < spec.layers().layers_size(); ++i) {
        const std::string field = absl::StrCat("model.layers.layers[", i, "]");
        TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer,
                                BuildListLayer(spec.layers().layers(i), field));
        if (!spec.layers().layers(i).name().empty())
          layer->set_name(spec.layers().layers(i).name());
        list.push_back(std::move(layer));
      }
      layers = std::move(list);
      break;
    }
    case ModelSpec::MODEL_NOT_SET:
      return FieldError("model", "is required: set one of mlp, cnn, resnet, gpt, layers");
  }
  if (!layers.ok()) return layers.status();
  layers->push_back(std::make_unique<CrossEntropy>());
  for (auto& layer : *layers) layer->set_compute_dtype(compute);
  return FromLayers(std::move(*layers), data);
}

absl::StatusOr<std::unique_ptr<Model>> Model::FromLayers(std::vector<std::unique_ptr<Layer>> layers,
                                                         const DataInfo& data) {
  auto model = std::unique_ptr<Model>(new Model());
  for (const auto& layer : layers) {
    if (IsHalf(layer->compute_dtype())) model->compute_ = layer->compute_dtype();
  }
  model->layers_ = std::move(layers);
  model->data_ = data;
  TANDEM_RETURN_IF_ERROR(model->Finish());
  return model;
}

// Every size a layer derives from its configuration, checked in 64 bits
// before anything multiplies it further (a kernel of 2^31 - 1 made a conv's
// weight count wrap to a negative allocation).
absl::Status Model::CheckSizes(int l, const Layer& layer) {
  auto too_large = [&](const std::string& what, const Shape& shape, int64_t limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: layer ", l, " (", layer.kind(), "): ", what, " ", shape.ToString(),
                     " has more than ", limit, " elements (or a negative size)"));
  };
  if (!layer.output_shape().CheckedElements(kMaxSampleElements)) {
    return too_large("output per sample", layer.output_shape(), kMaxSampleElements);
  }
  for (const ParamSpec& p : layer.Params()) {
    if (!p.shape.CheckedElements(kMaxParameterElements)) {
      return too_large(p.name, p.shape, kMaxParameterElements);
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Finish() {
  if (layers_.empty()) return absl::InvalidArgumentError("model: has no layers");
  loss_ = dynamic_cast<const CrossEntropy*>(layers_.back().get());
  if (loss_ == nullptr) return absl::InvalidArgumentError("model: the last layer must be the loss");
  Shape shape = data_.sample_shape;
  param_offsets_ = {0};
  buffer_offsets_ = {0};
  std::string canonical = absl::StrCat("in", shape.ToString(), DTypeName(data_.input_dtype));
  for (int l = 0; l < num_layers(); ++l) {
    Layer& layer = *layers_[l];
    if (layer.name().empty()) layer.set_name(absl::StrCat(layer.kind(), l));
    if (l > 0 && layer.input_dtype() == DType::kI32) {
      return absl::InvalidArgumentError(absl::StrCat("model: layer ", l, " (", layer.kind(),
                                                     ") takes token ids, so it must come first"));
    }
    if (l == 0 && layer.input_dtype() != data_.input_dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: the first layer (", layer.kind(), ") takes ", DTypeName(layer.input_dtype()),
          " inputs but the dataset gives ", DTypeName(data_.input_dtype)));
    }
    absl::Status s = layer.Build(shape);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("model: layer ", l, ": ", s.message()));
    }
    TANDEM_RETURN_IF_ERROR(CheckSizes(l, layer));
    shape = layer.output_shape();
    parameter_count_ += layer.ParamCount();
    if (parameter_count_ > kMaxParameterElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: more than ", kMaxParameterElements, " parameters by layer ", l));
    }
    param_offsets_.push_back(param_offsets_.back() + AlignElements(layer.ParamCount()));
    buffer_offsets_.push_back(buffer_offsets_.back() + AlignElements(layer.BufferCount()));
    absl::StrAppend(&canonical, "|", layer.kind(), layer.output_shape().ToString());
    for (const ParamSpec& p : layer.Params())
      absl::StrAppend(&canonical, ",", p.name, p.shape.ToString());
  }
  // The loss's logits must match the classes the data provides.
  if (loss_->classes() < data_.num_classes) {
    return absl::InvalidArgumentError(absl::StrCat("model: the output has ", loss_->classes(),
                                                   " classes but the dataset has ",
                                                   data_.num_classes));
  }
  if (loss_->positions() != data_.targets_per_sample) {
    return absl::InvalidArgumentError(absl::StrCat("model: the output has ", loss_->positions(),
                                                   " positions per sample but the dataset gives ",
                                                   data_.targets_per_sample,
                                                   " targets per sample"));
  }
  fingerprint_ = absl::StrFormat("%016x%016x", Fnv1a(canonical, 0xcbf29ce484222325ull),
                                 Fnv1a(canonical, 0x84222325cbf29ce4ull));
  return absl::OkStatus();
}

void Model::Initialize(float* params, float* buffers, uint64_t seed) const {
  for (int l = 0; l < num_layers(); ++l) {
    float* p = params + param_offsets_[l];
    float* b = buffers == nullptr ? nullptr : buffers + buffer_offsets_[l];
    // Padding between slices stays zero so whole-buffer norms ignore it.
    std::fill(p, params + param_offsets_[l + 1], 0.0f);
    if (b != nullptr) std::fill(b, buffers + buffer_offsets_[l + 1], 0.0f);
    layers_[l]->Initialize(p, b, seed, MixStream(seed, 0x1a7e5, static_cast<uint64_t>(l)));
  }
}

int64_t Model::MaxWorkspaceBytes(int64_t batch) const {
  int64_t w = 0;
  for (const auto& layer : layers_) w = std::max(w, layer->WorkspaceBytes(batch));
  return w;
}

int64_t Model::ActivationBytes(int64_t batch) const {
  int64_t bytes = 0;
  for (const auto& layer : layers_) bytes += layer->OutputBytes(batch) + layer->SavedBytes(batch);
  return bytes;
}

std::string Model::Summary() const {
  std::string out;
  for (int l = 0; l < num_layers(); ++l) {
    const Layer& layer = *layers_[l];
    absl::StrAppendFormat(&out, "%3d %-22s %-16s -> %-16s %12d params\n", l, layer.name(),
                          layer.input_shape().ToString(), layer.output_shape().ToString(),
                          layer.ParamCount());
  }
  absl::StrAppendFormat(&out, "total %d parameters (%s)\n", parameter_count_,
                        FormatBytes(parameter_count_ * 4));
  return out;
}

absl::StatusOr<ModelState> ModelState::Allocate(const Model& model, Allocator* allocator) {
  ModelState state;
  TANDEM_ASSIGN_OR_RETURN(state.params_, Buffer::Allocate(allocator, model.parameter_elements() * 4,
                                                          MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(state.grads_, Buffer::Allocate(allocator, model.parameter_elements() * 4,
                                                         MemoryCategory::kGradients));
  TANDEM_ASSIGN_OR_RETURN(state.buffers_, Buffer::Allocate(allocator, model.buffer_elements() * 4,
                                                           MemoryCategory::kParameters));
  std::fill(state.grads(), state.grads() + model.parameter_elements(), 0.0f);
  return state;
}

LayerStateBytes StateBytesOf(int64_t elements, int optimizer_states, DType compute) {
  LayerStateBytes b;
  if (compute == DType::kBF16) {
    b.parameters = b.gradients = 2 * elements;
    b.optimizer_state = (4 * int64_t{optimizer_states} + 4) * elements;
    b.staging = 8 * elements;
  } else {
    b.parameters = b.gradients = 4 * elements;
    b.optimizer_state = 4 * int64_t{optimizer_states} * elements;
  }
  return b;
}

}  // namespace tandem
