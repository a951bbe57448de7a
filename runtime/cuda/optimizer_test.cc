// The fused GPU optimizer steps against runtime/optim's CPU kernels, several
// steps in a row, through the same StepConstants. Skipped without a GPU.
#include "runtime/cuda/optimizer.h"

#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cuda/device_query.h"
#include "runtime/cuda/kernels/optimizer.h"
#include "runtime/cuda/test_util.h"
#include "runtime/optim/kernels.h"

namespace tandem::cuda {
namespace {

std::vector<float> Uniform(int64_t n, uint64_t stream, float low, float high) {
  std::vector<float> v(n);
  FillUniform(v.data(), n, low, high, 3, stream);
  return v;
}

// Runs `steps` optimizer steps of `spec` on both devices from the same state and
// compares parameters and moments; reports how many parameters differ in a bit.
void CompareSteps(const tandem::v1::OptimizerSpec& spec, int steps, double tolerance) {
  TestDevice d = *MakeTestDevice();
  constexpr int64_t n = 100003;
  std::vector<float> p = Uniform(n, 1, -1, 1);
  std::unique_ptr<Optimizer> cpu_opt = *Optimizer::Create(spec, n, DefaultHostAllocator());
  std::unique_ptr<Optimizer> gpu_constants = Optimizer::Stateless(spec);
  Buffer dp = Upload(d.ctx.get(), p);
  std::vector<Buffer> dstates;
  for (int i = 0; i < cpu_opt->state_count(); ++i) {
    dstates.push_back(Upload(d.ctx.get(), std::vector<float>(n, 0.0f)));
  }
  float* states[2] = {dstates.size() > 0 ? dstates[0].f32() : nullptr,
                      dstates.size() > 1 ? dstates[1].f32() : nullptr};
  for (int step = 0; step < steps; ++step) {
    // Gradients of every sign and scale, and an exact zero.
    std::vector<float> g = Uniform(n, 10 + step, -3, 3);
    g[17] = 0.0f;
    const float lr = 1e-3f * (1 + step), grad_scale = step == 1 ? 0.5f : 1.0f;
    cpu_opt->Step(p.data(), g.data(), lr, grad_scale);
    const StepConstants& c = gpu_constants->BeginStep(lr, grad_scale);
    Buffer dg = Upload(d.ctx.get(), g);
    ASSERT_TRUE(UpdateSlice(d.ctx.get(), c, dp.f32(), dg.f32(), states, n).ok());
    ASSERT_TRUE(d.ctx->Synchronize().ok());
  }
  const std::vector<float> got = Download<float>(d.ctx.get(), dp.data(), n);
  EXPECT_TRUE(Close(p, got, tolerance, "parameters"));
  for (int i = 0; i < cpu_opt->state_count(); ++i) {
    EXPECT_TRUE(Close(std::vector<float>(cpu_opt->state(i), cpu_opt->state(i) + n),
                      Download<float>(d.ctx.get(), states[i], n), tolerance, "moment"));
  }
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += std::memcmp(&p[i], &got[i], 4) != 0;
  ::testing::Test::RecordProperty("bitwise_mismatches", std::to_string(differ));
  std::cout << "optimizer " << spec.kind() << " (CPU " << optim::AdamImplementation()
            << "): " << differ << " of " << n << " parameters differ in some bit\n";
}

tandem::v1::OptimizerSpec Spec(tandem::v1::OptimizerKind kind) {
  tandem::v1::OptimizerSpec spec;
  spec.set_kind(kind);
  spec.set_learning_rate(1e-3f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  spec.set_weight_decay(0.01f);
  return spec;
}

TEST(CudaOptimizerTest, AdamWMatchesTheCpuStepForStep) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  // Same constants and the same fused operations: equal up to the last bit or
  // two (bitwise against the AVX-512/AVX2 CPU paths).
  CompareSteps(Spec(tandem::v1::OPTIMIZER_KIND_ADAMW), 5, 1e-6);
}

TEST(CudaOptimizerTest, AdamWithL2MatchesTheCpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CompareSteps(Spec(tandem::v1::OPTIMIZER_KIND_ADAM), 5, 1e-6);
}

TEST(CudaOptimizerTest, SgdWithNesterovMomentumMatchesTheCpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  tandem::v1::OptimizerSpec spec = Spec(tandem::v1::OPTIMIZER_KIND_SGD);
  spec.set_momentum(0.9f);
  spec.set_nesterov(true);
  CompareSteps(spec, 4, 1e-6);
}

TEST(CudaOptimizerTest, PlainSgdMatchesTheCpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  tandem::v1::OptimizerSpec spec = Spec(tandem::v1::OPTIMIZER_KIND_SGD);
  spec.set_weight_decay(0.0f);
  CompareSteps(spec, 3, 1e-6);
}

TEST(CudaOptimizerTest, FusedAdamKernelEqualsAdamUpdateOnOneStep) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t n = 4099;
  std::vector<float> p = Uniform(n, 1, -1, 1), g = Uniform(n, 2, -1, 1);
  std::vector<float> m = Uniform(n, 3, -0.1f, 0.1f), v = Uniform(n, 4, 0, 0.01f);
  const optim::AdamStep step{.lr = 3e-4f, .weight_decay = 0.1f, .decoupled = true, .t = 7};
  Buffer dp = Upload(d.ctx.get(), p), dg = Upload(d.ctx.get(), g), dm = Upload(d.ctx.get(), m),
         dv = Upload(d.ctx.get(), v);
  optim::AdamUpdate(p.data(), g.data(), m.data(), v.data(), n, step);
  ASSERT_EQ(AdamUpdate(dp.f32(), dg.f32(), dm.f32(), dv.f32(), n, step, d.ctx->stream),
            cudaSuccess);
  EXPECT_TRUE(Close(p, Download<float>(d.ctx.get(), dp.data(), n), 1e-6, "p"));
  EXPECT_TRUE(Close(m, Download<float>(d.ctx.get(), dm.data(), n), 1e-6, "m"));
  EXPECT_TRUE(Close(v, Download<float>(d.ctx.get(), dv.data(), n), 1e-6, "v"));
}

TEST(CudaOptimizerTest, SumOfSquaresMatchesTheCpuAndIsDeterministic) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3000017}}) {
    const std::vector<float> x = Uniform(n, 5, -2, 2);
    const double expected = optim::SumOfSquares(x.data(), n);
    Buffer dx = Upload(d.ctx.get(), x);
    Buffer scratch = DeviceZeros(d.ctx.get(), (kSumOfSquaresPartials + 1) * sizeof(double));
    double* result = static_cast<double*>(scratch.data());
    std::vector<double> runs;
    for (int run = 0; run < 2; ++run) {
      ASSERT_EQ(SumOfSquares(result, dx.f32(), n, result + 1, d.ctx->stream), cudaSuccess);
      runs.push_back(Download<double>(d.ctx.get(), result, 1)[0]);
    }
    EXPECT_NEAR(runs[0], expected, 1e-6 * expected) << n;
    EXPECT_EQ(runs[0], runs[1]) << n;
  }
}

}  // namespace
}  // namespace tandem::cuda
