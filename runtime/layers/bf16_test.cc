// bf16 and fp16 mixed precision against the fp32 reference: the same layer
// built with compute_dtype kBF16 (or kF16) and kF32, the same parameters, input
// and incoming gradient; the output, the input gradient and the parameter
// gradients must agree to the 16-bit type's precision (relative L2 error) and
// must differ from fp32 (the 16-bit products ran). fp16's range ends at 65504:
// an operand beyond it is infinite, which is what loss scaling watches for.
// Finite-difference tests stay on fp32 (layers_test).
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/onednn.h"
#include "runtime/layers/attention.h"
#include "runtime/layers/blocks.h"
#include "runtime/layers/conv.h"
#include "runtime/layers/elementwise.h"
#include "runtime/layers/linear.h"
#include "runtime/layers/norm.h"
#include "spec/precision.h"

namespace tandem {
namespace {

struct Outputs {
  std::vector<float> y, dx, grads;
};

// oneDNN's bf16 primitives exist from avx512_core on (emulated there, native
// with AVX512-BF16 or AMX); with avx2 they cannot be created, and tandemd
// refuses bf16 jobs (spec/precision.h).
class Bf16Test : public testing::Test {
 protected:
  void SetUp() override {
    if (!Bf16ProductsIsa(cpu::OneDnnIsa())) {
      GTEST_SKIP() << "oneDNN runs " << cpu::OneDnnIsa() << " here: no bf16 products";
    }
  }
};

// One forward and backward of `layer` on fixed random x and dy. With
// `bf16_io` (a layer of io_dtype kBF16) x and dy are rounded to bf16 and y and
// dx come back in bf16, widened here; parameters and gradients stay fp32.
Outputs Run(Layer& layer, const Shape& input, int64_t batch, bool accumulate = false,
            bool bf16_io = false) {
  const int64_t in_n = batch * input.elements();
  const int64_t out_n = batch * layer.output_shape().elements();
  std::vector<float> params(layer.ParamCount()), buffers(layer.BufferCount()), x(in_n), dy(out_n);
  layer.Initialize(params.data(), buffers.data(), 5, 1);
  FillUniform(x.data(), in_n, -1.0f, 1.0f, 9, 2);
  FillUniform(dy.data(), out_n, -1.0f, 1.0f, 9, 3);
  std::vector<float> saved(layer.SavedBytes(batch) / 4 + 16);
  std::vector<float> workspace(layer.WorkspaceBytes(batch) / 4 + 16);
  Outputs o;
  o.y.resize(out_n);
  o.dx.resize(in_n);
  // Accumulating adds into gradients that already hold a value.
  o.grads.assign(layer.ParamCount(), accumulate ? 0.5f : 0.0f);
  LayerContext ctx;
  ctx.params = params.data();
  ctx.grads = o.grads.data();
  ctx.buffers = buffers.data();
  ctx.workspace = workspace.data();
  ctx.accumulate_grads = accumulate;
  const Shape in_shape = input.WithBatch(batch);
  const Shape out_shape = layer.output_shape().WithBatch(batch);
  std::vector<uint16_t> x16(in_n), dy16(out_n), y16(out_n), dx16(in_n);
  auto tensor = [&](float* f32, std::vector<uint16_t>& b16, const Shape& shape) {
    return bf16_io ? Tensor(b16.data(), DType::kBF16, shape) : Tensor::F32(f32, shape);
  };
  cpu::ToBf16(x.data(), x16.data(), in_n);
  cpu::ToBf16(dy.data(), dy16.data(), out_n);
  const Tensor xt = tensor(x.data(), x16, in_shape), yt = tensor(o.y.data(), y16, out_shape);
  layer.Forward(ctx, xt, yt, saved.data());
  layer.Backward(ctx, xt, yt, saved.data(), tensor(dy.data(), dy16, out_shape),
                 tensor(o.dx.data(), dx16, in_shape));
  if (bf16_io) {
    cpu::FromBf16(y16.data(), o.y.data(), out_n);
    cpu::FromBf16(dx16.data(), o.dx.data(), in_n);
  }
  return o;
}

// ||a - b|| / ||b||.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// bf16 keeps 8 significant bits (relative rounding up to 2^-9 per input); the
// products' errors average out over their sums, so 1% in L2 is generous for
// rounding and far below what a wrong operand or layout gives (order 1).
constexpr double kBf16Tolerance = 1e-2;

// fp16 keeps 11 significant bits: 8 times bf16's precision.
constexpr double kFp16Tolerance = 2e-3;

void ExpectHalfMatchesFp32(DType half, const std::function<std::unique_ptr<Layer>()>& make,
                           const Shape& input, int64_t batch, bool accumulate, double tolerance) {
  std::unique_ptr<Layer> fp32 = make(), bf16 = make();
  bf16->set_compute_dtype(half);
  ASSERT_TRUE(fp32->Build(input).ok());
  ASSERT_TRUE(bf16->Build(input).ok());
  EXPECT_GT(bf16->WorkspaceBytes(batch), fp32->WorkspaceBytes(batch))
      << "the 16-bit copies live in the workspace";
  const Outputs ref = Run(*fp32, input, batch, accumulate);
  const Outputs got = Run(*bf16, input, batch, accumulate);
  const std::string where =
      std::string(fp32->kind()) + " in " + DTypeName(half) + " on oneDNN " + cpu::OneDnnIsa();
  for (const auto& [name, a, b] :
       {std::tuple{"output", &got.y, &ref.y}, std::tuple{"input gradient", &got.dx, &ref.dx},
        std::tuple{"parameter gradients", &got.grads, &ref.grads}}) {
    const double error = RelativeError(*a, *b);
    EXPECT_LT(error, tolerance) << name << ", " << where;
    EXPECT_GT(error, 0.0) << name << " equals fp32 to the bit: the 16-bit products did not run, "
                          << where;
  }
}

void ExpectBf16MatchesFp32(const std::function<std::unique_ptr<Layer>()>& make, const Shape& input,
                           int64_t batch, bool accumulate = false,
                           double tolerance = kBf16Tolerance) {
  ExpectHalfMatchesFp32(DType::kBF16, make, input, batch, accumulate, tolerance);
}

void ExpectFp16MatchesFp32(const std::function<std::unique_ptr<Layer>()>& make, const Shape& input,
                           int64_t batch, bool accumulate = false) {
  ExpectHalfMatchesFp32(DType::kF16, make, input, batch, accumulate, kFp16Tolerance);
}

// What a transformer block runs in bf16 between its products (io_dtype
// kBF16), against the same layer in fp32: oneDNN's bf16 primitives with fp32
// statistics and math, on bf16-rounded inputs, rounded outputs.
void ExpectBf16IoMatchesFp32(const std::function<std::unique_ptr<Layer>()>& make,
                             const Shape& input, int64_t batch, bool accumulate = false) {
  std::unique_ptr<Layer> fp32 = make(), bf16 = make();
  bf16->set_compute_dtype(DType::kBF16);
  bf16->set_io_dtype(DType::kBF16);
  ASSERT_TRUE(fp32->Build(input).ok());
  ASSERT_TRUE(bf16->Build(input).ok());
  const Outputs ref = Run(*fp32, input, batch, accumulate);
  const Outputs got = Run(*bf16, input, batch, accumulate, /*bf16_io=*/true);
  const std::string where =
      std::string(fp32->kind()) + " with bf16 activations on oneDNN " + cpu::OneDnnIsa();
  for (const auto& [name, a, b] :
       {std::tuple{"output", &got.y, &ref.y}, std::tuple{"input gradient", &got.dx, &ref.dx},
        std::tuple{"parameter gradients", &got.grads, &ref.grads}}) {
    if (b->empty()) continue;
    const double error = RelativeError(*a, *b);
    EXPECT_LT(error, kBf16Tolerance) << name << ", " << where;
    EXPECT_GT(error, 0.0) << name << " equals fp32 to the bit, " << where;
  }
}

TEST_F(Bf16Test, ActivationsTakeAndGiveBf16WithinBf16Precision) {
  ExpectBf16IoMatchesFp32([] { return std::make_unique<Activation>(ActivationKind::kGelu); },
                          Shape({16, 256}), 2);
  ExpectBf16IoMatchesFp32([] { return std::make_unique<Activation>(ActivationKind::kRelu); },
                          Shape({300}), 3);
}

TEST_F(Bf16Test, LayerNormTakesAndGivesBf16WithinBf16Precision) {
  ExpectBf16IoMatchesFp32([] { return std::make_unique<LayerNorm>(); }, Shape({16, 64}), 2);
  ExpectBf16IoMatchesFp32([] { return std::make_unique<LayerNorm>(); }, Shape({16, 64}), 2,
                          /*accumulate=*/true);
}

// x in bf16 is kept by the caller: the layer saves nothing.
TEST_F(Bf16Test, LinearTakesAndGivesBf16WithinBf16Precision) {
  ExpectBf16IoMatchesFp32(
      [] { return std::make_unique<Linear>(LinearOptions{.out_features = 48}); }, Shape({96}), 16);
  ExpectBf16IoMatchesFp32(
      [] { return std::make_unique<Linear>(LinearOptions{.out_features = 24}); }, Shape({5, 40}), 3,
      /*accumulate=*/true);
  Linear linear({.out_features = 8});
  linear.set_compute_dtype(DType::kBF16);
  linear.set_io_dtype(DType::kBF16);
  ASSERT_TRUE(linear.Build(Shape({64})).ok());
  EXPECT_EQ(linear.SavedBytes(4), 0);
}

TEST_F(Bf16Test, LinearMatchesFp32WithinBf16Precision) {
  ExpectBf16MatchesFp32([] { return std::make_unique<Linear>(LinearOptions{.out_features = 48}); },
                        Shape({96}), 16);
}

TEST_F(Bf16Test, LinearOnSequencesAccumulatesGradients) {
  ExpectBf16MatchesFp32(
      [] { return std::make_unique<Linear>(LinearOptions{.out_features = 24, .bias = false}); },
      Shape({5, 40}), 3, /*accumulate=*/true);
}

TEST_F(Bf16Test, AttentionMatchesFp32WithinBf16Precision) {
  ExpectBf16MatchesFp32([] { return std::make_unique<Attention>(AttentionOptions{.n_head = 4}); },
                        Shape({16, 64}), 2);
}

TEST_F(Bf16Test, TransformerBlockMatchesFp32WithinBf16Precision) {
  ExpectBf16MatchesFp32(
      [] { return std::make_unique<TransformerBlock>(TransformerBlockOptions{.n_head = 4}); },
      Shape({16, 64}), 2);
  ExpectBf16MatchesFp32(
      [] { return std::make_unique<TransformerBlock>(TransformerBlockOptions{.n_head = 4}); },
      Shape({16, 64}), 1, /*accumulate=*/true);
}

// Under a 16-bit type the block keeps its products' inputs for backward in 16
// bits, in place of the fp32 activations (which its backward then never
// reads: Run passes them, but the block's own are left unsaved), so it saves
// less than in fp32; a lone linear layer keeps its input's 16-bit copy.
TEST(SixteenBitTest, BlocksSaveLessForBackwardThanFp32) {
  for (DType half : {DType::kBF16, DType::kF16}) {
    TransformerBlock fp32({.n_head = 4}), block({.n_head = 4});
    Attention attention_fp32({.n_head = 4}), attention({.n_head = 4});
    Linear linear({.out_features = 8});
    block.set_compute_dtype(half);
    attention.set_compute_dtype(half);
    linear.set_compute_dtype(half);
    for (Layer* l : std::initializer_list<Layer*>{&fp32, &block, &attention_fp32, &attention}) {
      ASSERT_TRUE(l->Build(Shape({16, 64})).ok());
    }
    ASSERT_TRUE(linear.Build(Shape({64})).ok());
    EXPECT_LT(block.SavedBytes(2), 0.8 * fp32.SavedBytes(2)) << DTypeName(half);
    EXPECT_LT(attention.SavedBytes(2), attention_fp32.SavedBytes(2)) << DTypeName(half);
    EXPECT_EQ(linear.SavedBytes(4), cpu::AlignWorkspace(2 * 4 * 64)) << DTypeName(half);
  }
}

// The cnn preset's two convolutions (one input channel, then 32).
TEST_F(Bf16Test, ConvolutionsMatchFp32WithinBf16Precision) {
  ExpectBf16MatchesFp32(
      [] {
        return std::make_unique<Conv2d>(
            Conv2dOptions{.out_channels = 32, .kernel_size = 5, .padding = 2});
      },
      Shape({28, 28, 1}), 4);
  ExpectBf16MatchesFp32(
      [] {
        return std::make_unique<Conv2d>(
            Conv2dOptions{.out_channels = 64, .kernel_size = 5, .padding = 2});
      },
      Shape({14, 14, 32}), 4, /*accumulate=*/true);
}

// A residual block's convolutions (main path and the strided 1x1 skip). Its
// ReLU between the convolutions sees bf16-rounded pre-activations, and the few
// that change sign drop or pass whole gradient elements: that (not rounding)
// sets the gradients' difference, a few percent in L2; a wrong operand or
// layout is of order 1.
TEST_F(Bf16Test, ResidualBlockMatchesFp32WithinBf16Precision) {
  ExpectBf16MatchesFp32(
      [] {
        return std::make_unique<ResidualBlock>(
            ResidualBlockOptions{.out_channels = 32, .stride = 2});
      },
      Shape({16, 16, 16}), 4, /*accumulate=*/false, /*tolerance=*/0.1);
}

TEST(Fp16Test, LinearMatchesFp32WithinFp16Precision) {
  ExpectFp16MatchesFp32([] { return std::make_unique<Linear>(LinearOptions{.out_features = 48}); },
                        Shape({96}), 16);
}

TEST(Fp16Test, LinearOnSequencesAccumulatesGradients) {
  ExpectFp16MatchesFp32(
      [] { return std::make_unique<Linear>(LinearOptions{.out_features = 24, .bias = false}); },
      Shape({5, 40}), 3, /*accumulate=*/true);
}

TEST(Fp16Test, AttentionMatchesFp32WithinFp16Precision) {
  ExpectFp16MatchesFp32([] { return std::make_unique<Attention>(AttentionOptions{.n_head = 4}); },
                        Shape({16, 64}), 2);
}

TEST(Fp16Test, TransformerBlockMatchesFp32WithinFp16Precision) {
  ExpectFp16MatchesFp32(
      [] { return std::make_unique<TransformerBlock>(TransformerBlockOptions{.n_head = 4}); },
      Shape({16, 64}), 2);
}

// Convolutions have no fp16 path: an fp16 model convolves in fp32, bit for bit.
TEST(Fp16Test, ConvolutionsStayFp32) {
  Conv2d fp32(Conv2dOptions{.out_channels = 8, .kernel_size = 3, .padding = 1});
  Conv2d fp16(Conv2dOptions{.out_channels = 8, .kernel_size = 3, .padding = 1});
  fp16.set_compute_dtype(DType::kF16);
  ASSERT_TRUE(fp32.Build(Shape({8, 8, 3})).ok());
  ASSERT_TRUE(fp16.Build(Shape({8, 8, 3})).ok());
  const Outputs a = tandem::Run(fp32, Shape({8, 8, 3}), 2);
  const Outputs b = tandem::Run(fp16, Shape({8, 8, 3}), 2);
  EXPECT_EQ(a.y, b.y);
  EXPECT_EQ(a.dx, b.dx);
  EXPECT_EQ(a.grads, b.grads);
}

// A gradient beyond fp16's range becomes infinite in the products that take
// it, and the weight gradient says so: the overflow dynamic loss scaling
// finds (a non-finite gradient norm) and skips. bf16 has fp32's range.
TEST(Fp16Test, AGradientBeyond65504OverflowsInFp16AndNotInBf16) {
  std::vector<DType> halves = {DType::kF16};
  if (Bf16ProductsIsa(cpu::OneDnnIsa())) halves.push_back(DType::kBF16);
  for (DType half : halves) {
    Linear layer(LinearOptions{.out_features = 4});
    layer.set_compute_dtype(half);
    ASSERT_TRUE(layer.Build(Shape({8})).ok());
    std::vector<float> params(layer.ParamCount()), x(2 * 8, 0.5f), y(2 * 4), dx(2 * 8);
    std::vector<float> dy(2 * 4, 1e5f), grads(layer.ParamCount());
    layer.Initialize(params.data(), nullptr, 5, 1);
    std::vector<float> workspace(layer.WorkspaceBytes(2) / 4 + 16);
    std::vector<float> saved(layer.SavedBytes(2) / 4 + 16);
    LayerContext ctx;
    ctx.params = params.data();
    ctx.grads = grads.data();
    ctx.workspace = workspace.data();
    layer.Forward(ctx, Tensor::F32(x.data(), Shape({2, 8})), Tensor::F32(y.data(), Shape({2, 4})),
                  saved.data());
    layer.Backward(ctx, Tensor::F32(x.data(), Shape({2, 8})), Tensor::F32(y.data(), Shape({2, 4})),
                   saved.data(), Tensor::F32(dy.data(), Shape({2, 4})),
                   Tensor::F32(dx.data(), Shape({2, 8})));
    bool finite = true;
    for (int i = 0; i < 4 * 8; ++i) finite = finite && std::isfinite(grads[i]);
    EXPECT_EQ(finite, half == DType::kBF16) << DTypeName(half);
  }
}

}  // namespace
}  // namespace tandem
