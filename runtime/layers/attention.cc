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

int64_t Attention::SavedBytes(int64_t batch) const {
  // q, k, v [B, H, T, hs]; att [B, H, T, T]; the projection's input [B, T, C].
  const int64_t btc = batch * T_ * C_;
  return 4 * cpu::AlignWorkspace(btc * 4) +
         cpu::AlignWorkspace(batch * options_.n_head * T_ * T_ * 4);
}

int64_t Attention::WorkspaceBytes(int64_t batch) const {
  const int64_t btc = batch * T_ * C_, att = batch * options_.n_head * T_ * T_;
  // Forward: qkv [B, T, 3C] + o [B, H, T, hs]. Backward: d_atty, dO, datt, dq,
  // dk, dv, dqkv.
  const int64_t forward = cpu::AlignWorkspace(3 * btc * 4) + cpu::AlignWorkspace(btc * 4);
  const int64_t backward = 5 * cpu::AlignWorkspace(btc * 4) + cpu::AlignWorkspace(att * 4) +
                           cpu::AlignWorkspace(3 * btc * 4);
  // Then the scratch the projections and the bf16 products take in turn.
  return std::max(forward, backward) + ScratchBytes(batch);
}

// The projections' own workspace, or the 16-bit copies of one product's two
// operands (each at most [B, H, T, T] or [B, T, C]); they never overlap in time.
int64_t Attention::ScratchBytes(int64_t batch) const {
  const int64_t projections = std::max(qkv_.WorkspaceBytes(batch), proj_.WorkspaceBytes(batch));
  if (!IsHalf(compute_dtype())) return projections;
  const int64_t operand = std::max(batch * T_ * C_, batch * options_.n_head * T_ * T_);
  return std::max(projections, 2 * cpu::AlignWorkspace(2 * operand));
}

void Attention::Product(const LayerContext& ctx, const cpu::MatmulShape& shape, const float* a,
                        const float* b, float* c, void* scratch) const {
  if (!IsHalf(compute_dtype())) {
    device_ops::Matmul(ctx, shape, a, b, c);
    return;
  }
  // Dense operands: batch x m x k and batch x k x n elements, transposed or not.
  const int64_t a_n = shape.batch * shape.m * shape.k, b_n = shape.batch * shape.k * shape.n;
  Carver w(scratch);
  uint16_t* a16 = static_cast<uint16_t*>(w.TakeBytes(2 * a_n));
  uint16_t* b16 = static_cast<uint16_t*>(w.TakeBytes(2 * b_n));
  device_ops::ToHalf(ctx, compute_dtype(), a, a16, a_n);
  device_ops::ToHalf(ctx, compute_dtype(), b, b16, b_n);
  device_ops::MatmulHalf(ctx, compute_dtype(), shape, a16, b16, c);
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
  Carver s(saved);
  float* q = s.Take(btc);
  float* k = s.Take(btc);
  float* v = s.Take(btc);
  float* atty = s.Take(btc);
  float* att = s.Take(B * H * T_ * T_);
  Carver w(ctx.workspace);
  float* qkv = w.Take(3 * btc);
  float* o = w.Take(btc);

  void* scratch = w.TakeBytes(ScratchBytes(B));
  LayerContext sub = ctx;
  sub.workspace = scratch;
  qkv_.Forward(sub, x, Tensor::F32(qkv, Shape({B, T_, 3 * C_})), nullptr);
  device_ops::SplitHeads(ctx, qkv, q, k, v, B, T_, H, hs_);

  cpu::MatmulShape scores;  // att[bh] = q[bh] k[bh]^T / sqrt(hs)
  scores.batch = B * H;
  scores.m = T_;
  scores.n = T_;
  scores.k = hs_;
  scores.trans_b = true;
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(hs_));
  Product(ctx, scores, q, k, att, scratch);
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
  Product(ctx, av, att, v, o, scratch);
  device_ops::HeadsToRows(ctx, o, atty, B, T_, H, hs_);

  sub.params = ctx.params + qkv_.ParamCount();
  proj_.Forward(sub, Tensor::F32(atty, Shape({B, T_, C_})), y, nullptr);
}

void Attention::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void* saved,
                         const Tensor& dy, const Tensor& dx) const {
  const int64_t B = x.batch(), H = options_.n_head, btc = B * T_ * C_;
  Carver s(saved);
  const float* q = s.Take(btc);
  const float* k = s.Take(btc);
  const float* v = s.Take(btc);
  const float* atty = s.Take(btc);
  const float* att = s.Take(B * H * T_ * T_);
  Carver w(ctx.workspace);
  float* d_atty = w.Take(btc);
  float* d_o = w.Take(btc);
  float* d_q = w.Take(btc);
  float* d_k = w.Take(btc);
  float* d_v = w.Take(btc);
  float* d_att = w.Take(B * H * T_ * T_);
  float* d_qkv = w.Take(3 * btc);

  void* scratch = w.TakeBytes(ScratchBytes(B));
  LayerContext sub = ctx;
  sub.workspace = scratch;
  sub.params = ctx.params + qkv_.ParamCount();
  sub.grads = ctx.grads + qkv_.ParamCount();
  const Shape btc_shape({B, T_, C_});
  proj_.Backward(sub, Tensor::F32(const_cast<float*>(atty), btc_shape), Tensor(), nullptr, dy,
                 Tensor::F32(d_atty, btc_shape));
  device_ops::RowsToHeads(ctx, d_atty, d_o, B, T_, H, hs_);

  cpu::MatmulShape dv;  // dv[bh] = att[bh]^T dO[bh]
  dv.batch = B * H;
  dv.m = T_;
  dv.n = hs_;
  dv.k = T_;
  dv.trans_a = true;
  Product(ctx, dv, att, d_o, d_v, scratch);

  cpu::MatmulShape datt;  // datt[bh] = dO[bh] v[bh]^T
  datt.batch = B * H;
  datt.m = T_;
  datt.n = T_;
  datt.k = hs_;
  datt.trans_b = true;
  Product(ctx, datt, d_o, v, d_att, scratch);
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

  const float scale = 1.0f / std::sqrt(static_cast<float>(hs_));
  cpu::MatmulShape dq;  // dq[bh] = scale * dS[bh] k[bh]
  dq.batch = B * H;
  dq.m = T_;
  dq.n = hs_;
  dq.k = T_;
  dq.alpha = scale;
  Product(ctx, dq, d_att, k, d_q, scratch);
  cpu::MatmulShape dk = dq;  // dk[bh] = scale * dS[bh]^T q[bh]
  dk.trans_a = true;
  Product(ctx, dk, d_att, q, d_k, scratch);
  device_ops::MergeHeadGradients(ctx, d_q, d_k, d_v, d_qkv, B, T_, H, hs_);

  sub.params = ctx.params;
  sub.grads = ctx.grads;
  qkv_.Backward(sub, x, Tensor(), nullptr, Tensor::F32(d_qkv, Shape({B, T_, 3 * C_})), dx);
}

}  // namespace tandem
