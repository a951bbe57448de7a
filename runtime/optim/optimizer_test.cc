// Optimizer steps against values computed by hand from the update rules, every
// vector path against the scalar one, and clipping against its definition.
#include "runtime/optim/optimizer.h"

#include <cmath>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/bf16.h"
#include "runtime/core/random.h"

namespace tandem {
namespace {

tandem::v1::OptimizerSpec Adam(float lr, float wd = 0, bool adamw = false) {
  tandem::v1::OptimizerSpec s;
  s.set_kind(adamw ? tandem::v1::OPTIMIZER_KIND_ADAMW : tandem::v1::OPTIMIZER_KIND_ADAM);
  s.set_learning_rate(lr);
  s.set_beta1(0.9f);
  s.set_beta2(0.999f);
  s.set_epsilon(1e-8f);
  s.set_weight_decay(wd);
  return s;
}

TEST(AdamTest, FirstTwoStepsMatchHandComputedValues) {
  auto opt = *Optimizer::Create(Adam(0.1f), 1, DefaultHostAllocator());
  float p = 1.0f, g = 0.5f;
  // t=1: m = 0.05, v = 0.00025; mhat = 0.5, vhat = 0.25; p = 1 - 0.1 * 0.5 / (0.5 + 1e-8).
  opt->Step(&p, &g, 0.1f, 1.0f);
  EXPECT_NEAR(p, 0.9f, 1e-6);
  EXPECT_NEAR(opt->state(0)[0], 0.05f, 1e-7);
  // 1 - 0.999f is not exactly 1e-3 in fp32; compare relatively.
  EXPECT_NEAR(opt->state(1)[0], 0.00025f, 0.00025f * 1e-4);
  // t=2 with g = -1: m = 0.045 - 0.1 = -0.055, v = 0.00024975 + 0.001 = 0.00124975;
  // mhat = -0.055 / 0.19 = -0.289474; vhat = 0.00124975 / 0.001999 = 0.625188;
  // p = 0.9 + 0.1 * 0.289474 / 0.790688 = 0.936611.
  g = -1.0f;
  opt->Step(&p, &g, 0.1f, 1.0f);
  EXPECT_NEAR(p, 0.936611f, 1e-5);
  EXPECT_EQ(opt->step(), 2);
}

TEST(AdamTest, WeightDecayIsL2ForAdamAndDecoupledForAdamW) {
  float p1 = 2.0f, p2 = 2.0f, g = 0.0f;
  auto adam = *Optimizer::Create(Adam(0.1f, 0.5f), 1, DefaultHostAllocator());
  auto adamw = *Optimizer::Create(Adam(0.1f, 0.5f, true), 1, DefaultHostAllocator());
  adam->Step(&p1, &g, 0.1f, 1.0f);
  adamw->Step(&p2, &g, 0.1f, 1.0f);
  // Adam: g' = 0.5 * 2 = 1 -> normalized step of lr: 2 - 0.1.
  EXPECT_NEAR(p1, 1.9f, 1e-5);
  // AdamW: p * (1 - 0.1 * 0.5) = 1.9, and no gradient step (g = 0, m = 0).
  EXPECT_NEAR(p2, 1.9f, 1e-6);
}

TEST(SgdTest, MomentumAndNesterovMatchHandComputedValues) {
  tandem::v1::OptimizerSpec s;
  s.set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  s.set_learning_rate(0.1f);
  s.set_momentum(0.9f);
  auto opt = *Optimizer::Create(s, 1, DefaultHostAllocator());
  float p = 1.0f, g = 1.0f;
  opt->Step(&p, &g, 0.1f, 1.0f);  // buf = 1, p = 0.9
  EXPECT_NEAR(p, 0.9f, 1e-6);
  opt->Step(&p, &g, 0.1f, 1.0f);  // buf = 1.9, p = 0.71
  EXPECT_NEAR(p, 0.71f, 1e-6);
  s.set_nesterov(true);
  auto nesterov = *Optimizer::Create(s, 1, DefaultHostAllocator());
  p = 1.0f;
  nesterov->Step(&p, &g, 0.1f, 1.0f);  // buf = 1, step = 1 + 0.9 = 1.9
  EXPECT_NEAR(p, 0.81f, 1e-6);
}

TEST(SgdTest, PlainSgdHasNoState) {
  tandem::v1::OptimizerSpec s;
  s.set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  auto opt = *Optimizer::Create(s, 4, DefaultHostAllocator());
  EXPECT_EQ(opt->state_count(), 0);
  float p = 3.0f, g = 2.0f;
  opt->Step(&p, &g, 0.5f, 1.0f);
  EXPECT_FLOAT_EQ(p, 2.0f);
}

TEST(AdamTest, VectorPathsMatchScalarOnOddLengths) {
  // One buffer through the dispatched kernel, one element at a time (the scalar
  // tail) for the other; lengths not divisible by 16 exercise both.
  const int64_t n = 1000003;
  std::vector<float> p1(n), p2(n), g(n), m1(n, 0), v1(n, 0), m2(n, 0), v2(n, 0);
  FillUniform(p1.data(), n, -1, 1, 1, 1);
  FillUniform(g.data(), n, -1, 1, 1, 2);
  p2 = p1;
  optim::AdamStep step{
      .lr = 1e-3f, .weight_decay = 0.01f, .decoupled = true, .grad_scale = 0.7f, .t = 3};
  optim::AdamUpdate(p1.data(), g.data(), m1.data(), v1.data(), n, step);
  for (int64_t i = 0; i < n; i += 9973) {
    optim::AdamUpdate(p2.data() + i, g.data() + i, m2.data() + i, v2.data() + i, 1, step);
    EXPECT_NEAR(p1[i], p2[i], 1e-6) << i;
    EXPECT_NEAR(v1[i], v2[i], 1e-9) << i;
  }
}

// Mixed precision: from a bf16 gradient, the master weights and state end as
// the fp32 step's on the widened gradient, and the working copy is the
// updated weights rounded, for Adam (fused) and SGD with momentum (widened
// into the scratch).
TEST(MixedPrecisionTest, UpdateSliceBf16IsTheFp32StepOnTheWidenedGradient) {
  tandem::v1::OptimizerSpec sgd;
  sgd.set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  sgd.set_learning_rate(0.1f);
  sgd.set_momentum(0.9f);
  for (const tandem::v1::OptimizerSpec& spec : {Adam(1e-2f, 0.01f, true), sgd}) {
    const int64_t n = 1001;
    auto a = *Optimizer::Create(spec, n, DefaultHostAllocator());
    auto b = *Optimizer::Create(spec, n, DefaultHostAllocator());
    std::vector<float> p(n), q(n), g(n), scratch(n);
    std::vector<uint16_t> g16(n), copy(n);
    for (int64_t i = 0; i < n; ++i) {
      p[i] = q[i] = std::sin(0.37 * i);
      g16[i] = FloatToBf16(std::cos(0.11 * i) * 0.3f);
      g[i] = Bf16ToFloat(g16[i]);
    }
    float* sa[2] = {a->state_count() > 0 ? a->state(0) : nullptr,
                    a->state_count() > 1 ? a->state(1) : nullptr};
    float* sb[2] = {b->state_count() > 0 ? b->state(0) : nullptr,
                    b->state_count() > 1 ? b->state(1) : nullptr};
    for (int step = 0; step < 3; ++step) {
      Optimizer::UpdateSlice(a->BeginStep(0.1f, 0.5f), p.data(), g.data(), sa, n);
      Optimizer::UpdateSliceBf16(b->BeginStep(0.1f, 0.5f), q.data(), g16.data(), sb, copy.data(),
                                 scratch.data(), n);
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(q[i], p[i]) << spec.kind() << " " << i;
      ASSERT_EQ(copy[i], FloatToBf16(p[i])) << spec.kind() << " " << i;
      for (int s = 0; s < a->state_count(); ++s) ASSERT_EQ(sb[s][i], sa[s][i]) << i;
    }
  }
}

TEST(ClipTest, ScaleFollowsClipGradNorm) {
  EXPECT_FLOAT_EQ(Optimizer::ClipScale(10.0, 0.0f), 1.0f);
  EXPECT_FLOAT_EQ(Optimizer::ClipScale(0.5, 1.0f), 1.0f);
  EXPECT_NEAR(Optimizer::ClipScale(4.0, 1.0f), 0.25f, 1e-6);
  std::vector<float> x = {3, 4};
  EXPECT_DOUBLE_EQ(optim::SumOfSquares(x.data(), 2), 25.0);
}

TEST(ScheduleTest, WarmupThenCosine) {
  tandem::v1::OptimizerSpec s = Adam(1.0f);
  s.set_schedule(tandem::v1::LEARNING_RATE_SCHEDULE_COSINE);
  s.set_warmup_steps(10);
  auto opt = Optimizer::Stateless(s);
  EXPECT_FLOAT_EQ(opt->LearningRate(0, 110), 0.1f);
  EXPECT_FLOAT_EQ(opt->LearningRate(9, 110), 1.0f);
  EXPECT_NEAR(opt->LearningRate(60, 110), 0.5f, 1e-6);
  EXPECT_NEAR(opt->LearningRate(110, 110), 0.0f, 1e-6);
}

}  // namespace
}  // namespace tandem
