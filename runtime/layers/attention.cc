#include "runtime/layers/attention.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"
#include "runtime/layers/carver.h"
#include "runtime/layers/device_ops.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/kernels/softmax.h"
#endif

namespace tandem {

struct Attention::Softmax {
  dnnl::memory::desc md;
  dnnl::softmax_forward forward;
  dnnl::softmax_backward backward;
};

struct Attention::Cache {
  cpu::PrimitiveCache<Softmax> softmax;
};

Attention::Attention(AttentionOptions options)
    : options_(options),
      qkv_({.out_features = 0, .bias = true, .init = options.init}),
      proj_({.out_features = 0,
             .bias = true,
             .init = {InitKind::kNormal, options.projection_stddev}}),
      cache_(std::make_unique<Cache>()) {}

Attention::~Attention() = default;

absl::StatusOr<Shape> Attention::InferOutput(const Shape& input) {
  if (input.rank() != 2) return absl::InvalidArgumentError("needs a sequence input [T, C]");
  if (options_.n_head <= 0) return absl::InvalidArgumentError("n_head must be > 0");
  T_ = input[0];
  C_ = input[1];
  if (C_ % options_.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("n_head ", options_.n_head, " does not divide the width ", C_));
  }
  hs_ = C_ / options_.n_head;
  qkv_ = Linear({.out_features = 3 * C_, .bias = true, .init = options_.init});
  proj_ = Linear(
      {.out_features = C_, .bias = true, .init = {InitKind::kNormal, options_.projection_stddev}});
  qkv_.set_compute_dtype(compute_dtype());
  proj_.set_compute_dtype(compute_dtype());
  // io_dtype kBF16: x (and dx) in bf16 are the qkv projection's.
  qkv_.set_io_dtype(io_dtype());
  absl::Status s = qkv_.Build(input);
  if (s.ok()) s = proj_.Build(input);
  if (!s.ok()) return s;
  return input;
}

std::vector<ParamSpec> Attention::Params() const {
  std::vector<ParamSpec> p;
  for (const ParamSpec& q : qkv_.Params()) p.push_back({"qkv." + q.name, q.shape});
  for (const ParamSpec& q : proj_.Params()) p.push_back({"proj." + q.name, q.shape});
  return p;
}

void Attention::Initialize(float* params, float* buffers, uint64_t seed, uint64_t stream) const {
  qkv_.Initialize(params, buffers, seed, MixStream(stream, 1));
  proj_.Initialize(params + qkv_.ParamCount(), buffers, seed, MixStream(stream, 2));
}

LayerCost Attention::Cost(int64_t batch) const {
  const double B = static_cast<double>(batch), T = static_cast<double>(T_),
               C = static_cast<double>(C_), H = static_cast<double>(options_.n_head);
  const LayerCost a = qkv_.Cost(batch), b = proj_.Cost(batch);
  LayerCost c;
  // q k^T and att v: 2 x 2BHT^2 hs = 4 B T^2 C; softmax ~5 per score.
  c.forward_flops = a.forward_flops + b.forward_flops + 4 * B * T * T * C + 5 * B * H * T * T;
  c.backward_flops = a.backward_flops + b.backward_flops + 8 * B * T * T * C + 4 * B * H * T * T;
  c.forward_bytes = a.forward_bytes + b.forward_bytes + 4 * (3 * B * T * C + 3 * B * H * T * T);
  c.backward_bytes = a.backward_bytes + b.backward_bytes + 4 * (6 * B * T * C + 4 * B * H * T * T);
  return c;
}

namespace {

// An operand of the attention's products: fp32, or its 16-bit copy under a
// 16-bit compute type (the other pointer null).
struct Operand {
  const float* f32 = nullptr;
  const uint16_t* half = nullptr;
};

// c = a b (batched), in `dtype` when the operands are 16-bit copies.
void Product(const LayerContext& ctx, DType dtype, const cpu::MatmulShape& shape, Operand a,
             Operand b, float* c) {
  if (a.half != nullptr) {
    device_ops::MatmulHalf(ctx, dtype, shape, a.half, b.half, c);
  } else {
    device_ops::Matmul(ctx, shape, a.f32, b.f32, c);
  }
}

// x [n] as a product operand: itself in fp32, else rounded into `slot`.
Operand Rounded(const LayerContext& ctx, DType dtype, const float* x, int64_t n, void* slot) {
  if (!IsHalf(dtype)) return {x, nullptr};
  uint16_t* out = static_cast<uint16_t*>(slot);
  device_ops::ToHalf(ctx, dtype, x, out, n);
  return {nullptr, out};
}

}  // namespace

struct Attention::SavedRegions {
  // q, k, v [B, H, T, hs]: in fp32, or (16-bit compute) their 16-bit copies.
  float *q = nullptr, *k = nullptr, *v = nullptr;
  uint16_t *q16 = nullptr, *k16 = nullptr, *v16 = nullptr;
  // The projection's input [B, T, C], fp32 only: in 16 bits the projection
  // keeps its own copy (Linear's saved region).
  float* atty = nullptr;
  // The softmax's output [B, H, T, T].
  float* att = nullptr;
  void *qkv_saved = nullptr, *proj_saved = nullptr;
  int64_t bytes = 0;

  Operand Q() const { return {q, q16}; }
  Operand K() const { return {k, k16}; }
  Operand V() const { return {v, v16}; }
};

Attention::SavedRegions Attention::CarveSaved(const void* saved, int64_t batch) const {
  const int64_t btc = batch * T_ * C_;
  Carver s(saved);
  SavedRegions r;
  if (IsHalf(compute_dtype())) {
    r.q16 = static_cast<uint16_t*>(s.TakeBytes(2 * btc));
    r.k16 = static_cast<uint16_t*>(s.TakeBytes(2 * btc));
    r.v16 = static_cast<uint16_t*>(s.TakeBytes(2 * btc));
  } else {
    r.q = s.Take(btc);
    r.k = s.Take(btc);
    r.v = s.Take(btc);
    r.atty = s.Take(btc);
  }
  r.att = s.Take(batch * options_.n_head * T_ * T_);
  r.qkv_saved = s.TakeBytes(qkv_.SavedBytes(batch));
  r.proj_saved = s.TakeBytes(proj_.SavedBytes(batch));
  r.bytes = s.used();
  return r;
}

int64_t Attention::SavedBytes(int64_t batch) const { return CarveSaved(nullptr, batch).bytes; }

int64_t Attention::WorkspaceBytes(int64_t batch) const {
  const int64_t btc = batch * T_ * C_, att = batch * options_.n_head * T_ * T_;
  // Forward: qkv [B, T, 3C] + o [B, H, T, hs], and in 16 bits the fp32 heads
  // q, k, v before they are rounded into `saved`. Backward: d_atty, dO, dq,
  // dk, dv, datt, dqkv.
  const int64_t heads = IsHalf(compute_dtype()) ? 3 * Carver::Floats(btc) : 0;
  const int64_t forward = Carver::Floats(3 * btc) + Carver::Floats(btc) + heads;
  const int64_t backward = 5 * Carver::Floats(btc) + Carver::Floats(att) + Carver::Floats(3 * btc);
  // Then the scratch the projections and the 16-bit products take in turn.
  return std::max(forward, backward) + ScratchBytes(batch);
}

// The projections' own workspace, or two slots for 16-bit operand copies (each
// at most [B, H, T, T] or [B, T, C]); they never overlap in time.
int64_t Attention::ScratchBytes(int64_t batch) const {
  const int64_t projections = std::max(qkv_.WorkspaceBytes(batch), proj_.WorkspaceBytes(batch));
  if (!IsHalf(compute_dtype())) return projections;
  return std::max(projections, 2 * cpu::AlignWorkspace(2 * SlotElements(batch)));
}

const Attention::Softmax& Attention::GetSoftmax(int64_t batch) const {
  return cache_->softmax.Get(batch, [&] {
    Softmax s;
    s.md = cpu::PlainF32({batch * options_.n_head * T_, T_}, dnnl::memory::format_tag::ab);
    dnnl::softmax_forward::primitive_desc fwd(
        dnnl::softmax_forward::desc(dnnl::prop_kind::forward_training, s.md, 1),
        cpu::UserScratchpad(), cpu::CpuEngine());
    s.forward = dnnl::softmax_forward(fwd);
    s.backward = dnnl::softmax_backward(dnnl::softmax_backward::primitive_desc(
        dnnl::softmax_backward::desc(s.md, s.md, 1), cpu::UserScratchpad(), cpu::CpuEngine(), fwd));
    return s;
  });
}

void Attention::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                        void* saved) const {
  const int64_t B = x.batch(), H = options_.n_head, btc = B * T_ * C_;
  const DType dtype = compute_dtype();
  const bool half = IsHalf(dtype);
  const SavedRegions r = CarveSaved(saved, B);
  Carver w(ctx.workspace);
  float* qkv = w.Take(3 * btc);
  float* o = w.Take(btc);
  // The heads in fp32: in `saved`, or in 16 bits here before rounding.
  float* q = half ? w.Take(btc) : r.q;
  float* k = half ? w.Take(btc) : r.k;
  float* v = half ? w.Take(btc) : r.v;

  void* scratch = w.TakeBytes(ScratchBytes(B));
  LayerContext sub = ctx;
  sub.workspace = scratch;
  qkv_.Forward(sub, x, Tensor::F32(qkv, Shape({B, T_, 3 * C_})), r.qkv_saved);
  device_ops::SplitHeads(ctx, qkv, q, k, v, B, T_, H, hs_);
  if (half) {
    device_ops::ToHalf(ctx, dtype, q, r.q16, btc);
    device_ops::ToHalf(ctx, dtype, k, r.k16, btc);
    device_ops::ToHalf(ctx, dtype, v, r.v16, btc);
  }

  cpu::MatmulShape scores;  // att[bh] = q[bh] k[bh]^T / sqrt(hs)
  scores.batch = B * H;
  scores.m = T_;
  scores.n = T_;
  scores.k = hs_;
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hs_));
  float* att = r.att;
  Product(ctx, dtype, scores, r.Q(), r.K(), att);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    ctx.cuda->Check(cuda::CausalSoftmaxForward(att, B * H, T_, ctx.cuda->stream),
                    "CausalSoftmaxForward");
  } else  // The CPU path, unchanged, below.
#endif
  {
    cpu::CausalMask(att, B * H, T_);
    const Softmax& sm = GetSoftmax(B);
    cpu::Execute(sm.forward,
                 {{DNNL_ARG_SRC, cpu::Wrap(sm.md, att)}, {DNNL_ARG_DST, cpu::Wrap(sm.md, att)}});
  }

  cpu::MatmulShape av;  // o[bh] = att[bh] v[bh]
  av.batch = B * H;
  av.m = T_;
  av.n = hs_;
  av.k = T_;
  Product(ctx, dtype, av, Rounded(ctx, dtype, att, B * H * T_ * T_, scratch), r.V(), o);
  // In 16 bits the projection's input goes where qkv was (split already).
  float* atty = half ? qkv : r.atty;
  device_ops::HeadsToRows(ctx, o, atty, B, T_, H, hs_);

  sub.params = ctx.params + qkv_.ParamCount();
  proj_.Forward(sub, Tensor::F32(atty, Shape({B, T_, C_})), y, r.proj_saved);
}

void Attention::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void* saved,
                         const Tensor& dy, const Tensor& dx) const {
  const int64_t B = x.batch(), H = options_.n_head, btc = B * T_ * C_;
  const DType dtype = compute_dtype();
  const SavedRegions r = CarveSaved(saved, B);
  const float* att = r.att;
  Carver w(ctx.workspace);
  float* d_atty = w.Take(btc);
  float* d_o = w.Take(btc);
  float* d_q = w.Take(btc);
  float* d_k = w.Take(btc);
  float* d_v = w.Take(btc);
  float* d_att = w.Take(B * H * T_ * T_);
  float* d_qkv = w.Take(3 * btc);

  void* scratch = w.TakeBytes(ScratchBytes(B));
  // Two operand slots in the scratch (used in 16 bits only).
  char* slot0 = static_cast<char*>(scratch);
  char* slot1 = IsHalf(dtype) ? slot0 + cpu::AlignWorkspace(2 * SlotElements(B)) : nullptr;
  LayerContext sub = ctx;
  sub.workspace = scratch;
  sub.params = ctx.params + qkv_.ParamCount();
  sub.grads = ctx.grads + qkv_.ParamCount();
  const Shape btc_shape({B, T_, C_});
  proj_.Backward(sub, Tensor::F32(r.atty, btc_shape), Tensor(), r.proj_saved, dy,
                 Tensor::F32(d_atty, btc_shape));
  device_ops::RowsToHeads(ctx, d_atty, d_o, B, T_, H, hs_);

  // dO, rounded once for its two products.
  const Operand d_o_op = Rounded(ctx, dtype, d_o, btc, slot1);
  cpu::MatmulShape dv;  // dv[bh] = att[bh]^T dO[bh]
  dv.batch = B * H;
  dv.m = T_;
  dv.n = hs_;
  dv.k = T_;
  dv.trans_a = true;
  Product(ctx, dtype, dv, Rounded(ctx, dtype, att, B * H * T_ * T_, slot0), d_o_op, d_v);

  cpu::MatmulShape datt;  // datt[bh] = dO[bh] v[bh]^T
  datt.batch = B * H;
  datt.m = T_;
  datt.n = T_;
  datt.k = hs_;
  datt.trans_b = true;
  Product(ctx, dtype, datt, d_o_op, r.V(), d_att);
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    ctx.cuda->Check(cuda::CausalSoftmaxBackward(d_att, att, B * H, T_, ctx.cuda->stream),
                    "CausalSoftmaxBackward");
  } else  // The CPU path, unchanged, below.
#endif
  {
    const Softmax& sm = GetSoftmax(B);
    cpu::Execute(sm.backward, {{DNNL_ARG_DST, cpu::Wrap(sm.md, att)},
                               {DNNL_ARG_DIFF_DST, cpu::Wrap(sm.md, d_att)},
                               {DNNL_ARG_DIFF_SRC, cpu::Wrap(sm.md, d_att)}});
  }

  // dS, rounded once for its two products.
  const Operand d_s = Rounded(ctx, dtype, d_att, B * H * T_ * T_, slot0);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs_));
  cpu::MatmulShape dq;  // dq[bh] = scale * dS[bh] k[bh]
  dq.batch = B * H;
  dq.m = T_;
  dq.n = hs_;
  dq.k = T_;
  dq.alpha = scale;
  Product(ctx, dtype, dq, d_s, r.K(), d_q);
  cpu::MatmulShape dk = dq;  // dk[bh] = scale * dS[bh]^T q[bh]
  dk.trans_a = true;
  Product(ctx, dtype, dk, d_s, r.Q(), d_k);
  device_ops::MergeHeadGradients(ctx, d_q, d_k, d_v, d_qkv, B, T_, H, hs_);

  sub.params = ctx.params;
  sub.grads = ctx.grads;
  qkv_.Backward(sub, x, Tensor(), r.qkv_saved, Tensor::F32(d_qkv, Shape({B, T_, 3 * C_})), dx);
}

}  // namespace tandem
