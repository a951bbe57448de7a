// Every layer's backward against finite differences, plus shape and cost checks.
#include <memory>

#include "gtest/gtest.h"
#include "runtime/layers/elementwise.h"
#include "runtime/layers/gradient_check.h"
#include "runtime/layers/linear.h"

namespace tandem {
namespace {

void ExpectGradientsMatch(Layer& layer, const Shape& input, GradientCheckOptions options = {}) {
  ASSERT_TRUE(layer.Build(input).ok());
  const GradientCheckResult r = CheckGradients(layer, options);
  EXPECT_GT(r.checked, 0);
  EXPECT_EQ(r.failed, 0) << layer.kind() << ": max rel error " << r.max_rel_error << "\n"
                         << (r.failures.empty() ? "" : r.failures[0]) << "\n"
                         << (r.failures.size() > 1 ? r.failures[1] : "") << "\n"
                         << (r.failures.size() > 5 ? r.failures[5] : "") << " checked " << r.checked
                         << " failed " << r.failed;
}

TEST(LinearTest, GradientsMatchFiniteDifferences) {
  Linear layer({.out_features = 5});
  ExpectGradientsMatch(layer, Shape({7}), {.batch = 3});
}

TEST(LinearTest, AppliesToTheLastDimensionOfSequences) {
  Linear layer({.out_features = 6, .bias = false});
  ASSERT_TRUE(layer.Build(Shape({4, 8})).ok());
  EXPECT_EQ(layer.output_shape(), Shape({4, 6}));
  ExpectGradientsMatch(layer, Shape({4, 8}), {.batch = 2});
}

TEST(LinearTest, RejectsZeroOutputs) {
  Linear layer({.out_features = 0});
  const absl::Status s = layer.Build(Shape({3}));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("out_features"), std::string::npos) << s;
}

TEST(LinearTest, CostCountsMultiplyAddsTwice) {
  Linear layer({.out_features = 10});
  ASSERT_TRUE(layer.Build(Shape({784})).ok());
  EXPECT_DOUBLE_EQ(layer.Cost(128).forward_flops, 2.0 * 128 * 784 * 10 + 128 * 10);
  EXPECT_EQ(layer.ParamCount(), 784 * 10 + 10);
}

TEST(ActivationTest, ReluGradients) {
  Activation layer(ActivationKind::kRelu);
  // Away from the kink at 0, where finite differences are undefined.
  ASSERT_TRUE(layer.Build(Shape({16})).ok());
  GradientCheckResult r = CheckGradients(layer, {.batch = 3, .eps = 1e-3f});
  EXPECT_LE(r.failed, 1) << r.failures[0];
}

TEST(ActivationTest, GeluGradients) {
  Activation layer(ActivationKind::kGelu);
  ExpectGradientsMatch(layer, Shape({3, 5}), {.batch = 2, .eps = 1e-3f, .input_range = 3.0f});
}

TEST(DropoutTest, GradientsUseTheSameMask) {
  Dropout layer(0.3f);
  ExpectGradientsMatch(layer, Shape({50}), {.batch = 2});
}

TEST(DropoutTest, DropsAboutPAndScalesTheRest) {
  Dropout layer(0.25f);
  ASSERT_TRUE(layer.Build(Shape({10000})).ok());
  std::vector<float> x(10000, 1.0f), y(10000);
  LayerContext ctx;
  ctx.seed = 3;
  layer.Forward(ctx, Tensor::F32(x.data(), Shape({1, 10000})),
                Tensor::F32(y.data(), Shape({1, 10000})), nullptr);
  int zeros = 0;
  for (float v : y) {
    if (v == 0.0f)
      ++zeros;
    else
      EXPECT_FLOAT_EQ(v, 1.0f / 0.75f);
  }
  EXPECT_NEAR(zeros / 10000.0, 0.25, 0.02);
}

TEST(FlattenTest, GradientsPassThrough) {
  Flatten layer;
  ExpectGradientsMatch(layer, Shape({2, 3, 4}), {.batch = 2});
  EXPECT_EQ(layer.output_shape(), Shape({24}));
}

}  // namespace
}  // namespace tandem

#include "runtime/layers/blocks.h"
#include "runtime/layers/conv.h"
#include "runtime/layers/embedding.h"
#include "runtime/layers/loss.h"
#include "runtime/layers/norm.h"

namespace tandem {
namespace {

TEST(Conv2dTest, GradientsMatchFiniteDifferences) {
  Conv2d layer({.out_channels = 4, .kernel_size = 3, .stride = 1, .padding = 1});
  ExpectGradientsMatch(layer, Shape({5, 5, 3}), {.batch = 2});
  EXPECT_EQ(layer.output_shape(), Shape({5, 5, 4}));
}

TEST(Conv2dTest, StridedWithoutBias) {
  Conv2d layer({.out_channels = 3, .kernel_size = 3, .stride = 2, .padding = 0, .bias = false});
  ExpectGradientsMatch(layer, Shape({7, 7, 2}), {.batch = 2});
  EXPECT_EQ(layer.output_shape(), Shape({3, 3, 3}));
}

// A ResNet's downsampling shortcut: 1x1, stride 2, fewer input channels than
// oneDNN's channel block. Its jit_1x1 backward-weights kernel writes past its
// workspace for this shape (oneDNN issue 6035: heap corruption with avx2,
// wrong weight gradients elsewhere), so the layer takes another kernel.
TEST(Conv2dTest, StridedOneByOneWithFewChannels) {
  Conv2d layer({.out_channels = 8, .kernel_size = 1, .stride = 2, .padding = 0, .bias = false});
  ExpectGradientsMatch(layer, Shape({8, 8, 4}), {.batch = 16});
  EXPECT_EQ(layer.output_shape(), Shape({4, 4, 8}));
  const std::string impls = layer.CpuImplementations(16);
  EXPECT_EQ(impls.substr(impls.rfind(' ') + 1).rfind("jit_1x1", 0), std::string::npos) << impls;
}

TEST(Conv2dTest, AccumulatesGradients) {
  Conv2d layer({.out_channels = 2, .kernel_size = 3, .padding = 1});
  ASSERT_TRUE(layer.Build(Shape({4, 4, 2})).ok());
  std::vector<float> params(layer.ParamCount()), x(2 * 32), y(2 * 32), dy(2 * 32, 0.5f),
      ws(layer.WorkspaceBytes(2) / 4 + 16), once(params.size()), twice(params.size());
  layer.Initialize(params.data(), nullptr, 1, 1);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.01f * static_cast<float>(i);
  LayerContext ctx;
  ctx.params = params.data();
  ctx.workspace = ws.data();
  const Tensor xt = Tensor::F32(x.data(), Shape({2, 4, 4, 2}));
  const Tensor dyt = Tensor::F32(dy.data(), Shape({2, 4, 4, 2}));
  ctx.grads = once.data();
  layer.Backward(ctx, xt, Tensor(), nullptr, dyt, Tensor());
  ctx.grads = twice.data();
  layer.Backward(ctx, xt, Tensor(), nullptr, dyt, Tensor());
  ctx.accumulate_grads = true;
  layer.Backward(ctx, xt, Tensor(), nullptr, dyt, Tensor());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

TEST(Pool2dTest, MaxPoolGradients) {
  Pool2d layer({.pool = PoolKind::kMax, .kernel_size = 2});
  ExpectGradientsMatch(layer, Shape({4, 4, 3}), {.batch = 2, .eps = 1e-3f});
  EXPECT_EQ(layer.output_shape(), Shape({2, 2, 3}));
}

TEST(Pool2dTest, AvgPoolGradients) {
  Pool2d layer({.pool = PoolKind::kAvg, .kernel_size = 3, .stride = 2, .padding = 1});
  ExpectGradientsMatch(layer, Shape({5, 5, 2}), {.batch = 2});
}

TEST(GlobalAvgPoolTest, Gradients) {
  GlobalAvgPool layer;
  ExpectGradientsMatch(layer, Shape({3, 4, 5}), {.batch = 2});
  EXPECT_EQ(layer.output_shape(), Shape({5}));
}

TEST(BatchNorm2dTest, Gradients) {
  BatchNorm2d layer;
  ExpectGradientsMatch(layer, Shape({3, 3, 4}), {.batch = 3, .eps = 1e-2f, .rtol = 5e-2});
}

TEST(BatchNorm2dTest, UpdatesRunningStatisticsLikePyTorch) {
  BatchNorm2d layer;
  ASSERT_TRUE(layer.Build(Shape({1, 2, 1})).ok());
  float params[2], buffers[2];
  layer.Initialize(params, buffers, 0, 0);
  float x[4] = {1, 3, 5, 7}, y[4], saved[2];
  LayerContext ctx;
  ctx.params = params;
  ctx.buffers = buffers;
  layer.Forward(ctx, Tensor::F32(x, Shape({2, 1, 2, 1})), Tensor::F32(y, Shape({2, 1, 2, 1})),
                saved);
  EXPECT_FLOAT_EQ(buffers[0], 0.1f * 4.0f);
  // Batch variance 5 (biased); unbiased 20/3.
  EXPECT_NEAR(buffers[1], 0.9f + 0.1f * 20.0f / 3.0f, 1e-5);
}

TEST(LayerNormTest, Gradients) {
  LayerNorm layer;
  ExpectGradientsMatch(layer, Shape({3, 8}), {.batch = 2, .eps = 1e-2f, .rtol = 5e-2});
}

TEST(EmbeddingTest, Gradients) {
  Embedding layer({.vocab_size = 11, .dim = 6});
  ExpectGradientsMatch(layer, Shape({5}),
                       {.batch = 3, .int_input_limit = 11, .check_input = false});
  EXPECT_EQ(layer.output_shape(), Shape({5, 6}));
}

TEST(AttentionTest, Gradients) {
  Attention layer({.n_head = 2});
  ExpectGradientsMatch(layer, Shape({5, 8}), {.batch = 2, .eps = 1e-2f, .rtol = 5e-2});
}

TEST(AttentionTest, IsCausal) {
  Attention layer({.n_head = 2});
  ASSERT_TRUE(layer.Build(Shape({4, 4})).ok());
  std::vector<float> params(layer.ParamCount()), saved(layer.SavedBytes(1) / 4 + 16),
      ws(layer.WorkspaceBytes(1) / 4 + 16), x(16), y1(16), y2(16);
  layer.Initialize(params.data(), nullptr, 3, 3);
  for (int i = 0; i < 16; ++i) x[i] = 0.1f * static_cast<float>(i % 7);
  LayerContext ctx;
  ctx.params = params.data();
  ctx.workspace = ws.data();
  layer.Forward(ctx, Tensor::F32(x.data(), Shape({1, 4, 4})),
                Tensor::F32(y1.data(), Shape({1, 4, 4})), saved.data());
  x[15] += 5.0f;  // Change only the last position.
  layer.Forward(ctx, Tensor::F32(x.data(), Shape({1, 4, 4})),
                Tensor::F32(y2.data(), Shape({1, 4, 4})), saved.data());
  for (int i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(y1[i], y2[i]) << i;
  EXPECT_NE(y1[12], y2[12]);
}

TEST(TransformerBlockTest, Gradients) {
  TransformerBlock layer({.n_head = 2});
  ExpectGradientsMatch(layer, Shape({4, 8}), {.batch = 2, .eps = 1e-2f, .rtol = 5e-2});
}

TEST(TransformerBlockTest, GradientsWithDropout) {
  TransformerBlock layer({.n_head = 2, .dropout = 0.2f});
  ExpectGradientsMatch(layer, Shape({3, 8}), {.batch = 2, .eps = 1e-2f, .rtol = 5e-2});
}

TEST(ResidualBlockTest, IdentitySkipGradients) {
  ResidualBlock layer({.out_channels = 3, .stride = 1});
  // Small eps keeps the two ReLUs from crossing their kinks; the floor covers the
  // fp32 rounding of the loss that a small eps amplifies.
  ExpectGradientsMatch(layer, Shape({4, 4, 3}),
                       {.batch = 3, .eps = 5e-4f, .rtol = 5e-2, .atol_floor = 5e-2});
  EXPECT_FALSE(layer.has_projection());
}

TEST(ResidualBlockTest, ProjectionSkipGradients) {
  ResidualBlock layer({.out_channels = 4, .stride = 2});
  ExpectGradientsMatch(layer, Shape({4, 4, 2}), {.batch = 3, .eps = 2e-3f, .rtol = 5e-2});
  EXPECT_TRUE(layer.has_projection());
  EXPECT_EQ(layer.output_shape(), Shape({2, 2, 4}));
}

TEST(ResidualAddTest, BackwardFeedsBothInputs) {
  float a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, y[3], dy[3] = {1, -1, 2}, da[3] = {1, 1, 1}, db[3];
  ResidualAdd::Forward(a, b, y, 3);
  EXPECT_FLOAT_EQ(y[2], 9);
  ResidualAdd::Backward(dy, da, db, 3, /*accumulate=*/false);
  EXPECT_FLOAT_EQ(da[1], -1);
  EXPECT_FLOAT_EQ(db[2], 2);
}

TEST(CrossEntropyTest, Gradients) {
  CrossEntropy layer;
  ExpectGradientsMatch(layer, Shape({5}), {.batch = 3, .eps = 1e-2f, .target_limit = 5});
}

TEST(CrossEntropyTest, SequenceGradients) {
  CrossEntropy layer;
  ExpectGradientsMatch(layer, Shape({4, 6}),
                       {.batch = 2, .eps = 1e-2f, .target_limit = 6, .targets_per_sample = 4});
}

TEST(CrossEntropyTest, UniformLogitsGiveLogClasses) {
  CrossEntropy layer;
  ASSERT_TRUE(layer.Build(Shape({10})).ok());
  float logits[20] = {}, loss[2], saved[20];
  int32_t targets[2] = {3, 9};
  LayerContext ctx;
  ctx.targets = targets;
  layer.Forward(ctx, Tensor::F32(logits, Shape({2, 10})), Tensor::F32(loss, Shape({2, 1})), saved);
  EXPECT_NEAR(loss[0], std::log(10.0), 1e-5);
  EXPECT_NEAR(loss[1], std::log(10.0), 1e-5);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(DropoutTest, AMicroBatchGetsTheSameMaskAsTheWholeBatch) {
  Dropout layer(0.4f);
  ASSERT_TRUE(layer.Build(Shape({7})).ok());
  std::vector<float> x(5 * 7), whole(5 * 7), part(3 * 7);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + static_cast<float>(i);
  LayerContext ctx;
  ctx.seed = 11;
  ctx.rng_stream = 3;
  layer.Forward(ctx, Tensor::F32(x.data(), Shape({5, 7})), Tensor::F32(whole.data(), Shape({5, 7})),
                nullptr);
  // Samples 2..4 as a micro-batch of their own.
  ctx.sample_offset = 2;
  layer.Forward(ctx, Tensor::F32(x.data() + 14, Shape({3, 7})),
                Tensor::F32(part.data(), Shape({3, 7})), nullptr);
  for (int i = 0; i < 21; ++i) EXPECT_EQ(part[i], whole[14 + i]) << i;
}

}  // namespace
}  // namespace tandem
