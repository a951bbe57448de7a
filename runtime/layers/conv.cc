#include "runtime/layers/conv.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/cpu/primitive_cache.h"
#include "runtime/layers/carver.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_ops.h"
#include "runtime/cuda/kernels/conv_layout.h"
#include "runtime/cuda/kernels/elementwise.h"
#endif

namespace tandem {
namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

int64_t OutSize(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// An NHWC activation descriptor for oneDNN, whose logical order is NCHW.
memory::desc Nhwc(int64_t n, const Shape& hwc) {
  return cpu::PlainF32({n, hwc[2], hwc[0], hwc[1]}, tag::nhwc);
}

dnnl::reorder MakeReorder(const memory::desc& from, const memory::desc& to, bool accumulate) {
  dnnl::primitive_attr attr = cpu::UserScratchpad();
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  return dnnl::reorder(
      dnnl::reorder::primitive_desc(cpu::CpuEngine(), from, cpu::CpuEngine(), to, attr));
}

// CarveCuda's size; without CUDA types, so that plans count it in any build.
int64_t CudaWorkspaceBytes(int64_t weights, int64_t inputs, int64_t outputs, bool bf16) {
  Carver c(nullptr);
  c.Take(weights);
  c.Take(weights);
  if (bf16) {
    for (int64_t n : {weights, weights, inputs, outputs}) c.TakeBytes(2 * n);
  }
  return c.used();
}

#ifdef TANDEM_HAVE_CUDA
// The CUDA workspace: the weights and their gradient transposed to OHWI (fp32),
// then, for bf16 convolutions, bf16 copies of those two, of x (or dx) and of y
// (or dy).
struct CudaWorkspace {
  float *w, *dw;
  uint16_t *w16, *dw16, *x16, *y16;
};

CudaWorkspace CarveCuda(void* base, int64_t weights, int64_t inputs, int64_t outputs, bool bf16) {
  Carver c(base);
  CudaWorkspace w{};
  w.w = c.Take(weights);
  w.dw = c.Take(weights);
  if (bf16) {
    w.w16 = static_cast<uint16_t*>(c.TakeBytes(2 * weights));
    w.dw16 = static_cast<uint16_t*>(c.TakeBytes(2 * weights));
    w.x16 = static_cast<uint16_t*>(c.TakeBytes(2 * inputs));
    w.y16 = static_cast<uint16_t*>(c.TakeBytes(2 * outputs));
  }
  return w;
}

cuda::ConvGeometry ConvGeometryOf(const Conv2dOptions& o, const Shape& in, const Shape& out,
                                  int64_t batch) {
  return {.batch = batch,
          .height = in[0],
          .width = in[1],
          .in_channels = in[2],
          .out_channels = o.out_channels,
          .kernel = o.kernel_size,
          .stride = o.stride,
          .padding = o.padding,
          .out_height = out[0],
          .out_width = out[1]};
}

struct CudaSizes {
  int64_t weights, inputs, outputs;
};

CudaSizes SizesOf(const cuda::ConvGeometry& g) {
  return {g.out_channels * g.in_channels * g.kernel * g.kernel,
          g.batch * g.height * g.width * g.in_channels,
          g.batch * g.out_height * g.out_width * g.out_channels};
}

// The CUDA paths: cuDNN on the weights transposed to OHWI in the workspace (and
// the weight gradient there too), biases by our kernels. With g.bf16 the
// convolutions take and give bf16 copies (cuDNN's BFLOAT16 configuration), which
// are widened back into the fp32 outputs and gradients.
void ForwardOnCuda(const Conv2dOptions& o, const cuda::ConvGeometry& g, const LayerContext& ctx,
                   const Tensor& x, const Tensor& y) {
  const CudaSizes n = SizesOf(g);
  const CudaWorkspace w = CarveCuda(ctx.workspace, n.weights, n.inputs, n.outputs, g.bf16);
  cudaStream_t stream = ctx.cuda->stream;
  cuda::CudaContext* cc = ctx.cuda;
  if (!cc->Check(cuda::OihwToOhwi(w.w, ctx.params, o.out_channels, g.in_channels, o.kernel_size,
                                  o.kernel_size, stream),
                 "OihwToOhwi")) {
    return;
  }
  const bool ok = g.bf16
                      ? cc->Check(cuda::ToBf16(w.w, w.w16, n.weights, stream), "ToBf16") &&
                            cc->Check(cuda::ToBf16(x.f32(), w.x16, n.inputs, stream), "ToBf16") &&
                            cc->Check(cuda::ConvolutionForward(cc, g, w.x16, w.w16, w.y16)) &&
                            cc->Check(cuda::FromBf16(w.y16, y.f32(), n.outputs, stream), "FromBf16")
                      : cc->Check(cuda::ConvolutionForward(cc, g, x.f32(), w.w, y.f32()));
  if (ok && o.bias) {
    const int64_t rows = x.batch() * g.out_height * g.out_width;
    cc->Check(cuda::BroadcastBias(y.f32(), ctx.params + n.weights, 1, rows, o.out_channels,
                                  o.out_channels, 0, /*accumulate=*/true, stream),
              "BroadcastBias");
  }
}

void BackwardOnCuda(const Conv2dOptions& o, const cuda::ConvGeometry& g, const LayerContext& ctx,
                    const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const CudaSizes n = SizesOf(g);
  const CudaWorkspace w = CarveCuda(ctx.workspace, n.weights, n.inputs, n.outputs, g.bf16);
  cudaStream_t stream = ctx.cuda->stream;
  cuda::CudaContext* cc = ctx.cuda;
  // The weight gradient first: with bf16, x's copy is then free for dx's.
  const bool filter =
      g.bf16 ? cc->Check(cuda::ToBf16(dy.f32(), w.y16, n.outputs, stream), "ToBf16") &&
                   cc->Check(cuda::ToBf16(x.f32(), w.x16, n.inputs, stream), "ToBf16") &&
                   cc->Check(cuda::ConvolutionBackwardFilter(cc, g, w.x16, w.y16, w.dw16)) &&
                   cc->Check(cuda::FromBf16(w.dw16, w.dw, n.weights, stream), "FromBf16")
             : cc->Check(cuda::ConvolutionBackwardFilter(cc, g, x.f32(), dy.f32(), w.dw));
  if (!filter ||
      !cc->Check(cuda::OhwiToOihw(ctx.grads, w.dw, o.out_channels, g.in_channels, o.kernel_size,
                                  o.kernel_size, ctx.accumulate_grads, stream),
                 "OhwiToOihw")) {
    return;
  }
  if (dx.data != nullptr) {
    if (!cc->Check(cuda::OihwToOhwi(w.w, ctx.params, o.out_channels, g.in_channels, o.kernel_size,
                                    o.kernel_size, stream),
                   "OihwToOhwi")) {
      return;
    }
    const bool data =
        g.bf16 ? cc->Check(cuda::ToBf16(w.w, w.w16, n.weights, stream), "ToBf16") &&
                     cc->Check(cuda::ConvolutionBackwardData(cc, g, w.y16, w.w16, w.x16)) &&
                     cc->Check(cuda::FromBf16(w.x16, dx.f32(), n.inputs, stream), "FromBf16")
               : cc->Check(cuda::ConvolutionBackwardData(cc, g, dy.f32(), w.w, dx.f32()));
    if (!data) return;
  }
  if (o.bias) {
    cc->Check(
        cuda::ColumnSum(ctx.grads + n.weights, dy.f32(), x.batch() * g.out_height * g.out_width,
                        o.out_channels, ctx.accumulate_grads, stream),
        "ColumnSum");
  }
}
#endif

// The f32 tensor `t` as a oneDNN operand described by `f32`, or, when `round`,
// rounded into `copy` and described by `bf16`.
memory Operand(const memory::desc& f32, const memory::desc& bf16, const Tensor& t, void* copy,
               bool round) {
  if (!round) return cpu::Wrap(f32, t.data);
  auto* h = static_cast<uint16_t*>(copy);
  cpu::ToBf16(t.f32(), h, bf16.get_size() / 2);
  return cpu::Wrap(bf16, h);
}

}  // namespace

// ---------------------------------------------------------------------------
// Conv2d

struct Conv2d::Primitives {
  memory::desc src, dst, weights_plain, bias;
  // bf16 compute: x and dy are rounded into src16 and dst16 (bf16 NHWC) in the
  // workspace, the weights reordered to bf16; outputs and gradients stay f32.
  bool bf16 = false;
  memory::desc src16, dst16;
  // oneDNN's implementations of forward, backward-data and backward-weights,
  // e.g. "jit_bf16:avx512_core_bf16".
  std::string impls;
  dnnl::convolution_forward forward;
  memory::desc forward_weights;
  dnnl::reorder to_forward_weights;  // Valid when forward_weights != weights_plain.
  dnnl::convolution_backward_data backward_data;
  memory::desc backward_data_weights;
  dnnl::reorder to_backward_data_weights;
  dnnl::convolution_backward_weights backward_weights;
  memory::desc diff_weights;
  dnnl::reorder diff_weights_to_plain, diff_weights_add_to_plain;
  int64_t workspace_bytes = 0;
};

struct Conv2d::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

Conv2d::Conv2d(Conv2dOptions options) : options_(options), cache_(std::make_unique<Cache>()) {}
Conv2d::~Conv2d() = default;

absl::StatusOr<Shape> Conv2d::InferOutput(const Shape& input) {
  const Conv2dOptions& o = options_;
  if (o.out_channels <= 0) return absl::InvalidArgumentError("out_channels must be > 0");
  if (o.kernel_size <= 0) return absl::InvalidArgumentError("kernel_size must be > 0");
  if (o.stride <= 0) return absl::InvalidArgumentError("stride must be > 0");
  if (o.padding < 0) return absl::InvalidArgumentError("padding must be >= 0");
  if (input.rank() != 3) {
    return absl::InvalidArgumentError("needs an image input [H, W, C]");
  }
  const int64_t oh = OutSize(input[0], o.kernel_size, o.stride, o.padding);
  const int64_t ow = OutSize(input[1], o.kernel_size, o.stride, o.padding);
  if (oh <= 0 || ow <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel ", o.kernel_size, " does not fit the padded image"));
  }
  return Shape({oh, ow, o.out_channels});
}

std::vector<ParamSpec> Conv2d::Params() const {
  const Shape& in = input_shape();
  std::vector<ParamSpec> p = {{"weight", Shape({options_.out_channels, in[2], options_.kernel_size,
                                                options_.kernel_size})}};
  if (options_.bias) p.push_back({"bias", Shape({options_.out_channels})});
  return p;
}

void Conv2d::Initialize(float* params, float*, uint64_t seed, uint64_t stream) const {
  const int64_t fan_in = input_shape()[2] * options_.kernel_size * options_.kernel_size;
  const int64_t nw = options_.out_channels * fan_in;
  InitWeightAndBias(options_.init, fan_in, params, nw, params + nw,
                    options_.bias ? options_.out_channels : 0, seed, stream);
}

LayerCost Conv2d::Cost(int64_t batch) const {
  const Shape& in = input_shape();
  const Shape& out = output_shape();
  const double k2c = static_cast<double>(options_.kernel_size * options_.kernel_size * in[2]);
  const double outputs = static_cast<double>(batch * out.elements());
  LayerCost c;
  c.forward_flops = 2 * outputs * k2c;
  c.backward_flops = 4 * outputs * k2c;
  const double params = static_cast<double>(ParamCount());
  c.forward_bytes = 4 * (batch * in.elements() + outputs + params);
  c.backward_bytes = 4 * (2 * batch * in.elements() + 2 * outputs + 2 * params);
  return c;
}

std::string Conv2d::CpuImplementations(int64_t batch) const { return Get(batch).impls; }

const Conv2d::Primitives& Conv2d::Get(int64_t batch) const {
  return cache_->primitives.Get(batch, [&] {
    if (compute_dtype() == DType::kBF16) {
      // Where oneDNN has no bf16 kernel for this shape (only its reference
      // one), the layer stays fp32: slower in bf16 is no mixed precision.
      Primitives p = MakePrimitives(batch, /*bf16=*/true);
      if (p.impls.find("ref") == std::string::npos) return p;
    }
    return MakePrimitives(batch, /*bf16=*/false);
  });
}

Conv2d::Primitives Conv2d::MakePrimitives(int64_t batch, bool bf16) const {
  const Conv2dOptions& o = options_;
  const Shape& in = input_shape();
  const memory::dims strides = {o.stride, o.stride}, pad = {o.padding, o.padding};
  const auto in_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  Primitives p;
  p.bf16 = bf16;
  p.src = Nhwc(batch, in);
  p.dst = Nhwc(batch, output_shape());
  p.src16 = memory::desc(p.src.dims(), memory::data_type::bf16, tag::nhwc);
  p.dst16 = memory::desc(p.dst.dims(), memory::data_type::bf16, tag::nhwc);
  const memory::desc& src_in = bf16 ? p.src16 : p.src;
  const memory::desc& dy_in = bf16 ? p.dst16 : p.dst;
  p.weights_plain = cpu::PlainF32({o.out_channels, in[2], o.kernel_size, o.kernel_size}, tag::oihw);
  p.bias = cpu::PlainF32({o.out_channels}, tag::x);
  const memory::desc any_weights(p.weights_plain.dims(), in_type, tag::any);
  const memory::desc any_diff_weights(p.weights_plain.dims(), memory::data_type::f32, tag::any);
  const memory::desc none;
  const auto alg = dnnl::algorithm::convolution_direct;

  dnnl::convolution_forward::primitive_desc fwd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, src_in, any_weights,
                                      o.bias ? p.bias : none, p.dst, strides, pad, pad),
      cpu::UserScratchpad(), cpu::CpuEngine());
  p.forward = dnnl::convolution_forward(fwd);
  p.impls = fwd.impl_info_str();
  p.forward_weights = fwd.weights_desc();
  if (p.forward_weights != p.weights_plain) {
    p.to_forward_weights = MakeReorder(p.weights_plain, p.forward_weights, false);
  }

  dnnl::convolution_backward_data::primitive_desc bwd_data(
      dnnl::convolution_backward_data::desc(alg, p.src, any_weights, dy_in, strides, pad, pad),
      cpu::UserScratchpad(), cpu::CpuEngine(), fwd);
  p.backward_data = dnnl::convolution_backward_data(bwd_data);
  p.impls = p.impls + " " + bwd_data.impl_info_str();
  p.backward_data_weights = bwd_data.weights_desc();
  if (p.backward_data_weights != p.weights_plain) {
    p.to_backward_data_weights = MakeReorder(p.weights_plain, p.backward_data_weights, false);
  }

  const auto bwd_weights_desc = dnnl::convolution_backward_weights::desc(
      alg, src_in, any_diff_weights, o.bias ? p.bias : none, dy_in, strides, pad, pad);
  // oneDNN's jit_1x1 backward-weights kernels write past their workspace for
  // a strided 1x1 convolution of nhwc data with fewer input channels than
  // their block (oneDNN issue 6035: heap corruption with avx2, wrong weight
  // gradients elsewhere; a ResNet's downsampling shortcut). Such a layer
  // takes the first of oneDNN's other implementations.
  dnnl_primitive_desc_t steered =
      o.kernel_size == 1 && o.stride > 1
          ? cpu::ImplementationNotNamed(&bwd_weights_desc.data, cpu::UserScratchpad(), fwd,
                                        "jit_1x1")
          : nullptr;
  const dnnl::convolution_backward_weights::primitive_desc bwd_weights =
      steered != nullptr ? dnnl::convolution_backward_weights::primitive_desc(steered)
                         : dnnl::convolution_backward_weights::primitive_desc(
                               bwd_weights_desc, cpu::UserScratchpad(), cpu::CpuEngine(), fwd);
  p.backward_weights = dnnl::convolution_backward_weights(bwd_weights);
  p.impls = p.impls + " " + bwd_weights.impl_info_str();
  p.diff_weights = bwd_weights.diff_weights_desc();
  p.diff_weights_to_plain = MakeReorder(p.diff_weights, p.weights_plain, false);
  p.diff_weights_add_to_plain = MakeReorder(p.diff_weights, p.weights_plain, true);

  const int64_t copies =
      bf16 ? cpu::AlignWorkspace(p.src16.get_size()) + cpu::AlignWorkspace(p.dst16.get_size()) : 0;
  const int64_t forward_ws = cpu::AlignWorkspace(p.forward_weights.get_size()) + copies;
  const int64_t backward_ws = cpu::AlignWorkspace(p.backward_data_weights.get_size()) +
                              cpu::AlignWorkspace(p.diff_weights.get_size()) +
                              cpu::AlignWorkspace(4 * o.out_channels) + copies;
  p.workspace_bytes = std::max(forward_ws, backward_ws);
  return p;
}

// The CPU's oneDNN weight reorders, or on CUDA the weights and their gradient
// transposed to OHWI and, in bf16, the bf16 copies (CarveCuda; the cuDNN
// algorithm's own scratch comes from the context).
int64_t Conv2d::WorkspaceBytes(int64_t batch) const {
  const int64_t weights =
      options_.out_channels * input_shape()[2] * options_.kernel_size * options_.kernel_size;
  return std::max(
      Get(batch).workspace_bytes,
      CudaWorkspaceBytes(weights, batch * input_shape().elements(),
                         batch * output_shape().elements(), compute_dtype() == DType::kBF16));
}

#ifdef TANDEM_HAVE_CUDA
// This layer's geometry on CUDA, in bf16 where asked for and cuDNN has it.
cuda::ConvGeometry Conv2d::CudaGeometry(const LayerContext& ctx, int64_t batch) const {
  cuda::ConvGeometry g = ConvGeometryOf(options_, input_shape(), output_shape(), batch);
  g.bf16 = compute_dtype() == DType::kBF16 && cuda::Bf16ConvolutionAvailable(ctx.cuda, g);
  return g;
}
#endif

void Conv2d::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void*) const {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    return ForwardOnCuda(options_, CudaGeometry(ctx, x.batch()), ctx, x, y);
  }
#endif
  const Primitives& p = Get(x.batch());
  const float* weights = ctx.params;
  if (p.forward_weights != p.weights_plain) {
    cpu::Execute(p.to_forward_weights,
                 {{DNNL_ARG_FROM, cpu::Wrap(p.weights_plain, weights)},
                  {DNNL_ARG_TO, cpu::Wrap(p.forward_weights, ctx.workspace)}});
    weights = static_cast<const float*>(ctx.workspace);
  }
  Carver w(ctx.workspace);
  w.TakeBytes(p.forward_weights.get_size());
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, Operand(p.src, p.src16, x, w.TakeBytes(p.src16.get_size()), p.bf16)},
      {DNNL_ARG_WEIGHTS, cpu::Wrap(p.forward_weights, weights)},
      {DNNL_ARG_DST, cpu::Wrap(p.dst, y.data)}};
  if (options_.bias) {
    args.emplace(DNNL_ARG_BIAS,
                 cpu::Wrap(p.bias, ctx.params + options_.out_channels * input_shape()[2] *
                                                    options_.kernel_size * options_.kernel_size));
  }
  cpu::Execute(p.forward, args);
}

void Conv2d::Backward(const LayerContext& ctx, const Tensor& x, const Tensor&, const void*,
                      const Tensor& dy, const Tensor& dx) const {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    return BackwardOnCuda(options_, CudaGeometry(ctx, x.batch()), ctx, x, dy, dx);
  }
#endif
  const Primitives& p = Get(x.batch());
  Carver w(ctx.workspace);
  float* bwd_weights = static_cast<float*>(w.TakeBytes(p.backward_data_weights.get_size()));
  float* diff_weights = static_cast<float*>(w.TakeBytes(p.diff_weights.get_size()));
  float* diff_bias = w.Take(options_.out_channels);
  const memory src = Operand(p.src, p.src16, x, w.TakeBytes(p.src16.get_size()), p.bf16);
  const memory diff_dst = Operand(p.dst, p.dst16, dy, w.TakeBytes(p.dst16.get_size()), p.bf16);
  const int64_t n_weights = p.weights_plain.get_size() / 4;

  if (dx.data != nullptr) {
    const float* weights = ctx.params;
    if (p.backward_data_weights != p.weights_plain) {
      cpu::Execute(p.to_backward_data_weights,
                   {{DNNL_ARG_FROM, cpu::Wrap(p.weights_plain, weights)},
                    {DNNL_ARG_TO, cpu::Wrap(p.backward_data_weights, bwd_weights)}});
      weights = bwd_weights;
    }
    cpu::Execute(p.backward_data, {{DNNL_ARG_DIFF_DST, diff_dst},
                                   {DNNL_ARG_WEIGHTS, cpu::Wrap(p.backward_data_weights, weights)},
                                   {DNNL_ARG_DIFF_SRC, cpu::Wrap(p.src, dx.data)}});
  }
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_SRC, src},
      {DNNL_ARG_DIFF_DST, diff_dst},
      {DNNL_ARG_DIFF_WEIGHTS, cpu::Wrap(p.diff_weights, diff_weights)}};
  if (options_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, cpu::Wrap(p.bias, diff_bias));
  cpu::Execute(p.backward_weights, args);
  cpu::Execute(ctx.accumulate_grads ? p.diff_weights_add_to_plain : p.diff_weights_to_plain,
               {{DNNL_ARG_FROM, cpu::Wrap(p.diff_weights, diff_weights)},
                {DNNL_ARG_TO, cpu::Wrap(p.weights_plain, ctx.grads)}});
  if (options_.bias) {
    cpu::CopyOrAccumulate(diff_bias, ctx.grads + n_weights, options_.out_channels,
                          ctx.accumulate_grads);
  }
}

// ---------------------------------------------------------------------------
// Pool2d

struct Pool2d::Primitives {
  memory::desc src, dst, workspace;
  dnnl::pooling_forward forward;
  dnnl::pooling_backward backward;
};

struct Pool2d::Cache {
  cpu::PrimitiveCache<Primitives> primitives;
};

Pool2d::Pool2d(Pool2dOptions options) : options_(options), cache_(std::make_unique<Cache>()) {
  if (options_.stride == 0) options_.stride = options_.kernel_size;
}
Pool2d::~Pool2d() = default;

const char* Pool2d::kind() const {
  return options_.pool == PoolKind::kMax ? "max_pool2d" : "avg_pool2d";
}

absl::StatusOr<Shape> Pool2d::InferOutput(const Shape& input) {
  if (input.rank() != 3) return absl::InvalidArgumentError("needs an image input [H, W, C]");
  if (global_) {
    options_.kernel_size = input[0];
    options_.stride = 1;
    options_.padding = 0;
  }
  if (options_.kernel_size <= 0) return absl::InvalidArgumentError("kernel_size must be > 0");
  if (options_.stride <= 0) return absl::InvalidArgumentError("stride must be > 0");
  if (options_.padding < 0 || options_.padding * 2 > options_.kernel_size) {
    return absl::InvalidArgumentError("padding must be in [0, kernel_size / 2]");
  }
  const int64_t kw = global_ ? input[1] : options_.kernel_size;
  const int64_t oh = OutSize(input[0], options_.kernel_size, options_.stride, options_.padding);
  const int64_t ow = OutSize(input[1], kw, options_.stride, options_.padding);
  if (oh <= 0 || ow <= 0) return absl::InvalidArgumentError("window does not fit the image");
  return Shape({oh, ow, input[2]});
}

LayerCost Pool2d::Cost(int64_t batch) const {
  const double in = static_cast<double>(batch * input_shape().elements());
  const double out = static_cast<double>(batch * output_shape().elements());
  const double window = static_cast<double>(options_.kernel_size * options_.kernel_size);
  return LayerCost{out * window, in + out * window, 4 * (in + out), 4 * (2 * in + out)};
}

const Pool2d::Primitives& Pool2d::Get(int64_t batch) const {
  return cache_->primitives.Get(batch, [&] {
    const Shape& in = input_shape();
    const int64_t kh = options_.kernel_size, kw = global_ ? in[1] : options_.kernel_size;
    const memory::dims strides = {options_.stride, options_.stride}, kernel = {kh, kw},
                       pad = {options_.padding, options_.padding};
    const auto alg = options_.pool == PoolKind::kMax ? dnnl::algorithm::pooling_max
                                                     : dnnl::algorithm::pooling_avg_include_padding;
    Primitives p;
    p.src = Nhwc(batch, in);
    p.dst = Nhwc(batch, output_shape());
    dnnl::pooling_forward::primitive_desc fwd(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, alg, p.src, p.dst, strides,
                                    kernel, pad, pad),
        cpu::UserScratchpad(), cpu::CpuEngine());
    p.workspace = fwd.workspace_desc();
    p.forward = dnnl::pooling_forward(fwd);
    p.backward = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(
        dnnl::pooling_backward::desc(alg, p.src, p.dst, strides, kernel, pad, pad),
        cpu::UserScratchpad(), cpu::CpuEngine(), fwd));
    return p;
  });
}

int64_t Pool2d::SavedBytes(int64_t batch) const {
  // Max pooling keeps oneDNN's argmax workspace for backward on the CPU. On CUDA
  // nothing is written there (cuDNN's backward reads x and y instead); the size
  // is the same so a plan's figure holds on either device.
  return options_.pool == PoolKind::kMax ? Get(batch).workspace.get_size() : 0;
}

#ifdef TANDEM_HAVE_CUDA
namespace {

cuda::PoolGeometry PoolGeometryOf(const Pool2dOptions& o, bool global, const Shape& in,
                                  const Shape& out, int64_t batch) {
  return {.max = o.pool == PoolKind::kMax,
          .batch = batch,
          .height = in[0],
          .width = in[1],
          .channels = in[2],
          .window_h = o.kernel_size,
          .window_w = global ? in[1] : o.kernel_size,
          .stride = o.stride,
          .padding = o.padding,
          .out_height = out[0],
          .out_width = out[1]};
}

}  // namespace
#endif

void Pool2d::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y, void* saved) const {
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    // Nothing is saved: cuDNN's backward finds the maxima again from x and y.
    ctx.cuda->Check(cuda::PoolingForward(
        ctx.cuda, PoolGeometryOf(options_, global_, input_shape(), output_shape(), x.batch()),
        x.f32(), y.f32()));
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, cpu::Wrap(p.src, x.data)},
                                          {DNNL_ARG_DST, cpu::Wrap(p.dst, y.data)}};
  if (options_.pool == PoolKind::kMax)
    args.emplace(DNNL_ARG_WORKSPACE, cpu::Wrap(p.workspace, saved));
  cpu::Execute(p.forward, args);
}

void Pool2d::Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                      const Tensor& dy, const Tensor& dx) const {
  if (dx.data == nullptr) return;
#ifdef TANDEM_HAVE_CUDA
  if (ctx.device == DeviceKind::kCuda) {
    if (x.data == nullptr || y.data == nullptr) {
      ctx.cuda->RecordError(absl::InvalidArgumentError(
          absl::StrCat(kind(), " backward on CUDA needs the forward's input and output")));
      return;
    }
    ctx.cuda->Check(cuda::PoolingBackward(
        ctx.cuda, PoolGeometryOf(options_, global_, input_shape(), output_shape(), x.batch()),
        x.f32(), y.f32(), dy.f32(), dx.f32()));
    return;
  }
#endif
  const Primitives& p = Get(x.batch());
  std::unordered_map<int, memory> args = {{DNNL_ARG_DIFF_DST, cpu::Wrap(p.dst, dy.data)},
                                          {DNNL_ARG_DIFF_SRC, cpu::Wrap(p.src, dx.data)}};
  if (options_.pool == PoolKind::kMax)
    args.emplace(DNNL_ARG_WORKSPACE, cpu::Wrap(p.workspace, saved));
  cpu::Execute(p.backward, args);
}

// ---------------------------------------------------------------------------
// GlobalAvgPool

GlobalAvgPool::GlobalAvgPool() : pool_({.pool = PoolKind::kAvg, .kernel_size = 1}) {
  pool_.global_ = true;
}

absl::StatusOr<Shape> GlobalAvgPool::InferOutput(const Shape& input) {
  if (input.rank() != 3) return absl::InvalidArgumentError("needs an image input [H, W, C]");
  const absl::Status s = pool_.Build(input);
  if (!s.ok()) return s;
  return Shape({input[2]});
}

void GlobalAvgPool::Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                            void* saved) const {
  pool_.Forward(ctx, x, Tensor::F32(y.f32(), pool_.output_shape().WithBatch(x.batch())), saved);
}

void GlobalAvgPool::Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
                             const void* saved, const Tensor& dy, const Tensor& dx) const {
  pool_.Backward(ctx, x, y, saved, Tensor::F32(dy.f32(), pool_.output_shape().WithBatch(x.batch())),
                 dx);
}

}  // namespace tandem
