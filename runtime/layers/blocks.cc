#include "runtime/layers/blocks.h"

#include <algorithm>

#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/layers/carver.h"
#include "runtime/layers/device_ops.h"

namespace tandem {
namespace {

// The context of sub-layer `part` of a composite: its slices of the parameters,
// gradients and buffers, which follow the sub-layers' order. `part(i)` also
// points the workspace at `scratch`, the sub-layers' shared scratch after the
// composite's own temporaries.
class PartContexts {
 public:
  PartContexts(const LayerContext& ctx, const std::vector<const Layer*>& parts,
               void* scratch = nullptr)
      : ctx_(ctx), scratch_(scratch) {
    int64_t p = 0, b = 0;
    for (const Layer* part : parts) {
      param_offsets_.push_back(p);
      buffer_offsets_.push_back(b);
      p += part->ParamCount();
      b += part->BufferCount();
    }
  }
  LayerContext Get(int part, uint64_t rng_salt = 0) const {
    LayerContext c = ctx_;
    if (ctx_.params) c.params = ctx_.params + param_offsets_[part];
    if (ctx_.grads) c.grads = ctx_.grads + param_offsets_[part];
    if (ctx_.buffers) c.buffers = ctx_.buffers + buffer_offsets_[part];
    c.rng_stream = MixStream(ctx_.rng_stream, part, rng_salt);
    return c;
  }
  LayerContext operator()(int part) const {
    LayerContext c = Get(part);
    c.workspace = scratch_;
    return c;
  }

 private:
  const LayerContext& ctx_;
  void* scratch_;
  std::vector<int64_t> param_offsets_, buffer_offsets_;
};

std::vector<ParamSpec> PrefixedParams(const std::vector<const Layer*>& parts,
                                      const std::vector<const char*>& names) {
  std::vector<ParamSpec> out;
  for (size_t i = 0; i < parts.size(); ++i) {
    for (const ParamSpec& p : parts[i]->Params()) {
      out.push_back({std::string(names[i]) + "." + p.name, p.shape});
    }
  }
  return out;
}

void InitializeParts(const std::vector<const Layer*>& parts, float* params, float* buffers,
                     uint64_t seed, uint64_t stream) {
  for (size_t i = 0; i < parts.size(); ++i) {
    parts[i]->Initialize(params, buffers, seed, MixStream(stream, i));
    params += parts[i]->ParamCount();
    buffers += parts[i]->BufferCount();
  }
}

LayerCost SumCosts(const std::vector<const Layer*>& parts, int64_t batch) {
  LayerCost total;
  for (const Layer* p : parts) {
    const LayerCost c = p->Cost(batch);
    total.forward_flops += c.forward_flops;
    total.backward_flops += c.backward_flops;
    total.forward_bytes += c.forward_bytes;
    total.backward_bytes += c.backward_bytes;
  }
  return total;
}

int64_t MaxWorkspace(const std::vector<const Layer*>& parts, int64_t batch) {
  int64_t w = 0;
  for (const Layer* p : parts) w = std::max(w, p->WorkspaceBytes(batch));
  return w;
}

Tensor F32(float* p, const Shape& sample, int64_t batch) {
  return Tensor::F32(p, sample.WithBatch(batch));
}

Tensor Bf16(uint16_t* p, const Shape& sample, int64_t batch) {
  return Tensor(p, DType::kBF16, sample.WithBatch(batch));
}

Tensor None() { return Tensor(); }

}  // namespace

void ResidualAdd::Forward(const float* a, const float* b, float* y, int64_t n) {
  cpu::Add(a, b, y, n);
}

void ResidualAdd::Backward(const float* dy, float* da, float* db, int64_t n, bool accumulate) {
  if (da != nullptr) cpu::CopyOrAccumulate(dy, da, n, accumulate);
  if (db != nullptr) cpu::CopyOrAccumulate(dy, db, n, accumulate);
}

void ResidualAdd::Forward(const LayerContext& ctx, const float* a, const float* b, float* y,
                          int64_t n) {
  device_ops::Add(ctx, a, b, y, n);
}

void ResidualAdd::Backward(const LayerContext& ctx, const float* dy, float* da, float* db,
                           int64_t n, bool accumulate) {
  if (da != nullptr) device_ops::CopyOrAccumulate(ctx, dy, da, n, accumulate);
  if (db != nullptr) device_ops::CopyOrAccumulate(ctx, dy, db, n, accumulate);
}

// ---------------------------------------------------------------------------
// TransformerBlock

TransformerBlock::TransformerBlock(TransformerBlockOptions options) : options_(options) {}

absl::StatusOr<Shape> TransformerBlock::InferOutput(const Shape& input) {
  if (input.rank() != 2) return absl::InvalidArgumentError("needs a sequence input [T, C]");
  T_ = input[0];
  C_ = input[1];
  hidden_ = options_.mlp_hidden > 0 ? options_.mlp_hidden : 4 * C_;
  const InitOptions init{InitKind::kNormal, options_.init_stddev};
  ln1_ = std::make_unique<LayerNorm>();
  ln2_ = std::make_unique<LayerNorm>();
  attn_ = std::make_unique<Attention>(AttentionOptions{
      .n_head = options_.n_head, .init = init, .projection_stddev = options_.residual_init_stddev});
  fc1_ =
      std::make_unique<Linear>(LinearOptions{.out_features = hidden_, .bias = true, .init = init});
  gelu_ = std::make_unique<Activation>(ActivationKind::kGelu);
  fc2_ = std::make_unique<Linear>(
      LinearOptions{.out_features = C_,
                    .bias = true,
                    .init = {InitKind::kNormal, options_.residual_init_stddev}});
  drop1_ = std::make_unique<Dropout>(options_.dropout);
  drop2_ = std::make_unique<Dropout>(options_.dropout);
  const Shape hidden_shape({T_, hidden_});
  // In bf16 the normalisations, attention's input and the MLP pass bf16
  // between them (io_dtype; ForwardBf16).
  const bool bf16 = compute_dtype() == DType::kBF16;
  for (Layer* part : std::initializer_list<Layer*>{ln1_.get(), attn_.get(), ln2_.get(), fc1_.get(),
                                                   gelu_.get(), fc2_.get()})
    part->set_io_dtype(bf16 ? DType::kBF16 : DType::kF32);
  for (auto [layer, shape] : std::vector<std::pair<Layer*, Shape>>{{ln1_.get(), input},
                                                                   {attn_.get(), input},
                                                                   {ln2_.get(), input},
                                                                   {fc1_.get(), input},
                                                                   {gelu_.get(), hidden_shape},
                                                                   {fc2_.get(), hidden_shape},
                                                                   {drop1_.get(), input},
                                                                   {drop2_.get(), input}}) {
    layer->set_compute_dtype(compute_dtype());
    const absl::Status s = layer->Build(shape);
    if (!s.ok()) return s;
  }
  return input;
}

std::vector<const Layer*> TransformerBlock::Parts() const {
  return {ln1_.get(), attn_.get(), ln2_.get(), fc1_.get(), fc2_.get()};
}

std::vector<ParamSpec> TransformerBlock::Params() const {
  return PrefixedParams(Parts(), {"ln1", "attn", "ln2", "fc1", "fc2"});
}

void TransformerBlock::Initialize(float* params, float* buffers, uint64_t seed,
                                  uint64_t stream) const {
  InitializeParts(Parts(), params, buffers, seed, stream);
}

LayerCost TransformerBlock::Cost(int64_t batch) const {
  std::vector<const Layer*> all = Parts();
  all.push_back(gelu_.get());
  LayerCost c = SumCosts(all, batch);
  const double n = static_cast<double>(batch * T_ * C_);
  c.forward_flops += 2 * n;  // the two residual adds
  c.backward_flops += 2 * n;
  c.forward_bytes += 2 * 12 * n;
  c.backward_bytes += 2 * 12 * n;
  return c;
}

struct TransformerBlock::SavedRegions {
  // ln1's and ln2's outputs and GELU's are read back only as the inputs of
  // attention's and the FCs' products: under a 16-bit compute type those keep
  // their own 16-bit copies, and these are not saved (null).
  float *ln1_out, *res1, *ln2_out, *fc1_out, *gelu_out;
  // In bf16 (ForwardBf16) these are saved instead (res1 and fc1_out null):
  // ln1's output (attention's input), res1 (ln2's input), ln2's output
  // (fc1's), fc1's output (GELU's) and GELU's (fc2's); attention's qkv
  // projection and the FCs then keep no copies of their own.
  uint16_t *ln1_out16, *res1_16, *ln2_out16, *fc1_out16, *gelu_out16;
  void *ln1_saved, *attn_saved, *ln2_saved, *fc1_saved, *fc2_saved;
  int64_t bytes;
};

TransformerBlock::SavedRegions TransformerBlock::CarveSaved(const void* saved,
                                                            int64_t batch) const {
  const int64_t btc = batch * T_ * C_, bth = batch * T_ * hidden_;
  const bool fp32 = !IsHalf(compute_dtype());
  const bool bf16 = compute_dtype() == DType::kBF16;
  auto half = [](Carver& c, int64_t n, bool take) {
    return take ? static_cast<uint16_t*>(c.TakeBytes(2 * n)) : nullptr;
  };
  Carver s(saved);
  SavedRegions r;
  r.ln1_out = fp32 ? s.Take(btc) : nullptr;
  r.ln1_out16 = half(s, btc, bf16);
  r.ln1_saved = s.TakeBytes(ln1_->SavedBytes(batch));
  r.attn_saved = s.TakeBytes(attn_->SavedBytes(batch));
  r.res1 = bf16 ? nullptr : s.Take(btc);
  r.res1_16 = half(s, btc, bf16);
  r.ln2_out = fp32 ? s.Take(btc) : nullptr;
  r.ln2_out16 = half(s, btc, bf16);
  r.ln2_saved = s.TakeBytes(ln2_->SavedBytes(batch));
  r.fc1_out = bf16 ? nullptr : s.Take(bth);
  r.fc1_out16 = half(s, bth, bf16);
  r.gelu_out = fp32 ? s.Take(bth) : nullptr;
  r.gelu_out16 = half(s, bth, bf16);
  r.fc1_saved = s.TakeBytes(fc1_->SavedBytes(batch));
  r.fc2_saved = s.TakeBytes(fc2_->SavedBytes(batch));
  r.bytes = s.used();
  return r;
}

int64_t TransformerBlock::SavedBytes(int64_t batch) const {
  return CarveSaved(nullptr, batch).bytes;
}

// Workspace layout: three [B, T, C] temporaries, one [B, T, hidden], then the
// sub-layers' shared scratch.
int64_t TransformerBlock::WorkspaceBytes(int64_t batch) const {
  std::vector<const Layer*> all = Parts();
  all.push_back(gelu_.get());
  return 3 * Carver::Floats(batch * T_ * C_) + Carver::Floats(batch * T_ * hidden_) +
         MaxWorkspace(all, batch);
}

namespace {

// An activation the block keeps: its bf16 form where it has one (bf16), else
// its fp32 one (null under fp16 compute: its shape only).
Tensor Kept(float* f32, uint16_t* b16, const Shape& sample, int64_t batch) {
  return b16 != nullptr ? Bf16(b16, sample, batch) : F32(f32, sample, batch);
}

// out = a + g, g a normalisation's input gradient: fp32 in `out` itself, or
// bf16 (widened into it).
void AddResidualGradient(const LayerContext& ctx, const float* a, const Tensor& g, float* out,
                         int64_t n) {
  if (g.dtype != DType::kBF16) {
    device_ops::CopyOrAccumulate(ctx, a, out, n, /*accumulate=*/true);
    return;
  }
  device_ops::CopyOrAccumulate(ctx, a, out, n, /*accumulate=*/false);
  device_ops::AccumulateBf16(ctx, static_cast<const uint16_t*>(g.data), out, n);
}

}  // namespace

// In bf16 the normalisations, attention's input and the MLP pass bf16 between
// them (io_dtype): ln1 reads x rounded (again in backward, rather than
// saved), attention reads ln1's bf16 output as its qkv operand, ln2 reads the
// first residual sum rounded, fc1 writes bf16 for GELU, which writes bf16 for
// fc2, and backward's gradients between those parts are bf16, each in the
// first half of the fp32 region the other precisions use. The residual
// stream (x, res1, y), the branches' outputs and their dropout stay fp32;
// res1 itself then lives in the workspace and only its bf16 copy is saved.
void TransformerBlock::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                               void* saved) const {
  const int64_t B = x.batch(), btc = B * T_ * C_, bth = B * T_ * hidden_;
  const Shape seq({T_, C_}), hid({T_, hidden_});
  const bool bf16 = compute_dtype() == DType::kBF16;
  const SavedRegions r = CarveSaved(saved, B);
  Carver w(ctx.workspace);
  float* branch = w.Take(btc);
  float* dropped = w.Take(btc);
  float* spare_seq = w.Take(btc);
  float* spare_hid = w.Take(bth);
  void* scratch = w.TakeBytes(0);
  // What is not saved (16-bit compute) lives in the spares: ln1's output is
  // dead once attention has run, so ln2's takes its place. In bf16 the spares
  // hold x rounded and res1.
  auto* x16 = static_cast<uint16_t*>(static_cast<void*>(spare_seq));
  float* res1 = bf16 ? spare_hid : r.res1;
  const Tensor ln1_in = bf16 ? Bf16(x16, seq, B) : x;
  const Tensor ln1_out = Kept(r.ln1_out != nullptr ? r.ln1_out : spare_seq, r.ln1_out16, seq, B);
  const Tensor ln2_out = Kept(r.ln2_out != nullptr ? r.ln2_out : spare_seq, r.ln2_out16, seq, B);
  const Tensor fc1_out = Kept(r.fc1_out, r.fc1_out16, hid, B);
  const Tensor gelu_out =
      Kept(r.gelu_out != nullptr ? r.gelu_out : spare_hid, r.gelu_out16, hid, B);

  const PartContexts part(ctx, Parts(), scratch);
  if (bf16) device_ops::ToBf16(ctx, x.f32(), x16, btc);
  ln1_->Forward(part(0), ln1_in, ln1_out, r.ln1_saved);
  attn_->Forward(part(1), ln1_out, F32(branch, seq, B), r.attn_saved);
  drop1_->Forward(part.Get(0, 1), F32(branch, seq, B), F32(dropped, seq, B), nullptr);
  ResidualAdd::Forward(ctx, x.f32(), dropped, res1, btc);
  if (bf16) device_ops::ToBf16(ctx, res1, r.res1_16, btc);
  ln2_->Forward(part(2), Kept(res1, r.res1_16, seq, B), ln2_out, r.ln2_saved);
  fc1_->Forward(part(3), ln2_out, fc1_out, r.fc1_saved);
  gelu_->Forward(part(3), fc1_out, gelu_out, nullptr);
  fc2_->Forward(part(4), gelu_out, F32(branch, seq, B), r.fc2_saved);
  drop2_->Forward(part.Get(0, 2), F32(branch, seq, B), F32(dropped, seq, B), nullptr);
  ResidualAdd::Forward(ctx, res1, dropped, y.f32(), btc);
}

void TransformerBlock::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&,
                                const void* saved, const Tensor& dy, const Tensor& dx) const {
  const int64_t B = x.batch(), btc = B * T_ * C_, bth = B * T_ * hidden_;
  const Shape seq({T_, C_}), hid({T_, hidden_});
  const bool bf16 = compute_dtype() == DType::kBF16;
  const SavedRegions r = CarveSaved(saved, B);
  Carver w(ctx.workspace);
  float* d_branch = w.Take(btc);
  float* d_res1 = w.Take(btc);
  float* d_tmp = w.Take(btc);
  float* d_hidden = w.Take(bth);
  void* scratch = w.TakeBytes(0);
  // A gradient between the parts, in the type they pass.
  auto grad = [&](float* region, const Shape& sample) {
    return bf16 ? Bf16(static_cast<uint16_t*>(static_cast<void*>(region)), sample, B)
                : F32(region, sample, B);
  };
  // Null activations (fp16 compute) carry their shapes only: the layers
  // reading them take their 16-bit copies from their own saved regions.
  const Tensor gelu_out = Kept(r.gelu_out, r.gelu_out16, hid, B);

  const PartContexts part(ctx, Parts(), scratch);
  // y = res1 + drop2(fc2(gelu(fc1(ln2(res1))))).
  drop2_->Backward(part.Get(0, 2), Tensor(), Tensor(), nullptr, dy, F32(d_branch, seq, B));
  fc2_->Backward(part(4), gelu_out, None(), r.fc2_saved, F32(d_branch, seq, B),
                 grad(d_hidden, hid));
  gelu_->Backward(part(3), Kept(r.fc1_out, r.fc1_out16, hid, B), gelu_out, nullptr,
                  grad(d_hidden, hid), grad(d_hidden, hid));
  fc1_->Backward(part(3), Kept(r.ln2_out, r.ln2_out16, seq, B), None(), r.fc1_saved,
                 grad(d_hidden, hid), grad(d_tmp, seq));
  // ln2's input gradient: into d_res1 itself, or in bf16 where d_branch was.
  const Tensor d_ln2 = bf16 ? grad(d_branch, seq) : F32(d_res1, seq, B);
  ln2_->Backward(part(2), Kept(r.res1, r.res1_16, seq, B), None(), r.ln2_saved, grad(d_tmp, seq),
                 d_ln2);
  AddResidualGradient(ctx, dy.f32(), d_ln2, d_res1, btc);
  // res1 = x + drop1(attn(ln1(x))).
  drop1_->Backward(part.Get(0, 1), Tensor(), Tensor(), nullptr, F32(d_res1, seq, B),
                   F32(d_branch, seq, B));
  attn_->Backward(part(1), Kept(r.ln1_out, r.ln1_out16, seq, B), None(), r.attn_saved,
                  F32(d_branch, seq, B), grad(d_tmp, seq));
  // In bf16, ln1's input rounded again as forward rounded it (d_hidden is
  // free now).
  const Tensor ln1_in = bf16 ? grad(d_hidden, seq) : x;
  if (bf16) device_ops::ToBf16(ctx, x.f32(), static_cast<uint16_t*>(ln1_in.data), btc);
  if (dx.data == nullptr) {
    ln1_->Backward(part(0), ln1_in, None(), r.ln1_saved, grad(d_tmp, seq), None());
    return;
  }
  const Tensor d_ln1 = bf16 ? grad(d_branch, seq) : dx;
  ln1_->Backward(part(0), ln1_in, None(), r.ln1_saved, grad(d_tmp, seq), d_ln1);
  AddResidualGradient(ctx, d_res1, d_ln1, dx.f32(), btc);
}

// ---------------------------------------------------------------------------
// ResidualBlock

ResidualBlock::ResidualBlock(ResidualBlockOptions options) : options_(options) {}

absl::StatusOr<Shape> ResidualBlock::InferOutput(const Shape& input) {
  if (input.rank() != 3) return absl::InvalidArgumentError("needs an image input [H, W, C]");
  const int64_t out = options_.out_channels;
  if (out <= 0) return absl::InvalidArgumentError("out_channels must be > 0");
  conv1_ = std::make_unique<Conv2d>(Conv2dOptions{.out_channels = out,
                                                  .kernel_size = 3,
                                                  .stride = options_.stride,
                                                  .padding = 1,
                                                  .bias = false});
  bn1_ = std::make_unique<BatchNorm2d>();
  relu_ = std::make_unique<Activation>(ActivationKind::kRelu);
  conv2_ = std::make_unique<Conv2d>(Conv2dOptions{
      .out_channels = out, .kernel_size = 3, .stride = 1, .padding = 1, .bias = false});
  bn2_ = std::make_unique<BatchNorm2d>();
  conv1_->set_compute_dtype(compute_dtype());
  conv2_->set_compute_dtype(compute_dtype());
  absl::Status s = conv1_->Build(input);
  if (s.ok()) s = bn1_->Build(conv1_->output_shape());
  if (s.ok()) s = relu_->Build(conv1_->output_shape());
  if (s.ok()) s = conv2_->Build(conv1_->output_shape());
  if (s.ok()) s = bn2_->Build(conv2_->output_shape());
  if (!s.ok()) return s;
  if (options_.stride != 1 || input[2] != out) {
    conv_skip_ = std::make_unique<Conv2d>(Conv2dOptions{.out_channels = out,
                                                        .kernel_size = 1,
                                                        .stride = options_.stride,
                                                        .padding = 0,
                                                        .bias = false});
    bn_skip_ = std::make_unique<BatchNorm2d>();
    conv_skip_->set_compute_dtype(compute_dtype());
    s = conv_skip_->Build(input);
    if (s.ok()) s = bn_skip_->Build(conv_skip_->output_shape());
    if (!s.ok()) return s;
    if (conv_skip_->output_shape() != conv2_->output_shape()) {
      return absl::InvalidArgumentError("skip and main paths disagree in shape");
    }
  } else {
    conv_skip_.reset();
    bn_skip_.reset();
  }
  return conv2_->output_shape();
}

std::vector<const Layer*> ResidualBlock::Parts() const {
  std::vector<const Layer*> p = {conv1_.get(), bn1_.get(), conv2_.get(), bn2_.get()};
  if (conv_skip_) {
    p.push_back(conv_skip_.get());
    p.push_back(bn_skip_.get());
  }
  return p;
}

std::vector<ParamSpec> ResidualBlock::Params() const {
  return PrefixedParams(Parts(), {"conv1", "bn1", "conv2", "bn2", "skip_conv", "skip_bn"});
}

int64_t ResidualBlock::BufferCount() const {
  int64_t n = 0;
  for (const Layer* p : Parts()) n += p->BufferCount();
  return n;
}

void ResidualBlock::Initialize(float* params, float* buffers, uint64_t seed,
                               uint64_t stream) const {
  InitializeParts(Parts(), params, buffers, seed, stream);
}

LayerCost ResidualBlock::Cost(int64_t batch) const {
  std::vector<const Layer*> all = Parts();
  all.push_back(relu_.get());
  all.push_back(relu_.get());
  return SumCosts(all, batch);
}

// The projection's regions are null without one.
struct ResidualBlock::SavedRegions {
  float *c1, *b1, *r1, *c2, *b2, *cs = nullptr, *bs = nullptr;
  void *bn1_saved, *bn2_saved, *bns_saved = nullptr;
  int64_t bytes;
};

ResidualBlock::SavedRegions ResidualBlock::CarveSaved(const void* saved, int64_t batch) const {
  const int64_t n = batch * output_shape().elements();
  Carver s(saved);
  SavedRegions r;
  r.c1 = s.Take(n);
  r.bn1_saved = s.TakeBytes(bn1_->SavedBytes(batch));
  r.b1 = s.Take(n);
  r.r1 = s.Take(n);
  r.c2 = s.Take(n);
  r.bn2_saved = s.TakeBytes(bn2_->SavedBytes(batch));
  r.b2 = s.Take(n);
  if (conv_skip_) {
    r.cs = s.Take(n);
    r.bns_saved = s.TakeBytes(bn_skip_->SavedBytes(batch));
    r.bs = s.Take(n);
  }
  r.bytes = s.used();
  return r;
}

int64_t ResidualBlock::SavedBytes(int64_t batch) const { return CarveSaved(nullptr, batch).bytes; }

// Workspace: three output-sized temporaries, then the sub-layers' scratch.
int64_t ResidualBlock::WorkspaceBytes(int64_t batch) const {
  return 3 * Carver::Floats(batch * output_shape().elements()) +
         Carver::Floats(batch * input_shape().elements()) + MaxWorkspace(Parts(), batch);
}

void ResidualBlock::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                            void* saved) const {
  const int64_t B = x.batch(), n = B * output_shape().elements();
  const Shape& os = output_shape();
  const SavedRegions r = CarveSaved(saved, B);
  Carver w(ctx.workspace);
  float* sum = w.Take(n);
  w.Take(n);
  w.Take(n);
  w.Take(B * input_shape().elements());
  void* scratch = w.TakeBytes(0);
  const PartContexts part(ctx, Parts(), scratch);
  conv1_->Forward(part(0), x, F32(r.c1, os, B), nullptr);
  bn1_->Forward(part(1), F32(r.c1, os, B), F32(r.b1, os, B), r.bn1_saved);
  relu_->Forward(part(1), F32(r.b1, os, B), F32(r.r1, os, B), nullptr);
  conv2_->Forward(part(2), F32(r.r1, os, B), F32(r.c2, os, B), nullptr);
  bn2_->Forward(part(3), F32(r.c2, os, B), F32(r.b2, os, B), r.bn2_saved);
  const float* skip = x.f32();
  if (conv_skip_) {
    conv_skip_->Forward(part(4), x, F32(r.cs, os, B), nullptr);
    bn_skip_->Forward(part(5), F32(r.cs, os, B), F32(r.bs, os, B), r.bns_saved);
    skip = r.bs;
  }
  ResidualAdd::Forward(ctx, r.b2, skip, sum, n);
  relu_->Forward(part(1), F32(sum, os, B), y, nullptr);
}

void ResidualBlock::Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                             const void* saved, const Tensor& dy, const Tensor& dx) const {
  const int64_t B = x.batch(), n = B * output_shape().elements();
  const Shape& os = output_shape();
  const Shape& is = input_shape();
  const SavedRegions r = CarveSaved(saved, B);
  Carver w(ctx.workspace);
  float* d_sum = w.Take(n);
  float* d_a = w.Take(n);
  float* d_b = w.Take(n);
  float* d_in = w.Take(B * is.elements());
  void* scratch = w.TakeBytes(0);
  const PartContexts part(ctx, Parts(), scratch);
  relu_->Backward(part(1), None(), y, nullptr, dy, F32(d_sum, os, B));
  // Main path: d_sum -> bn2 -> conv2 -> relu -> bn1 -> conv1.
  bn2_->Backward(part(3), F32(r.c2, os, B), F32(r.b2, os, B), r.bn2_saved, F32(d_sum, os, B),
                 F32(d_a, os, B));
  conv2_->Backward(part(2), F32(r.r1, os, B), None(), nullptr, F32(d_a, os, B), F32(d_b, os, B));
  relu_->Backward(part(1), None(), F32(r.r1, os, B), nullptr, F32(d_b, os, B), F32(d_b, os, B));
  bn1_->Backward(part(1), F32(r.c1, os, B), F32(r.b1, os, B), r.bn1_saved, F32(d_b, os, B),
                 F32(d_a, os, B));
  conv1_->Backward(part(0), x, None(), nullptr, F32(d_a, os, B), dx.data != nullptr ? dx : None());
  if (conv_skip_) {
    bn_skip_->Backward(part(5), F32(r.cs, os, B), F32(r.bs, os, B), r.bns_saved, F32(d_sum, os, B),
                       F32(d_a, os, B));
    conv_skip_->Backward(part(4), x, None(), nullptr, F32(d_a, os, B),
                         dx.data != nullptr ? F32(d_in, is, B) : None());
    if (dx.data != nullptr) {
      device_ops::CopyOrAccumulate(ctx, d_in, dx.f32(), B * is.elements(), true);
    }
  } else if (dx.data != nullptr) {
    device_ops::CopyOrAccumulate(ctx, d_sum, dx.f32(), n, true);
  }
}

}  // namespace tandem
