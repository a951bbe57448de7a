// The planner's predicted step time against the step time measured when the
// plan runs, for every strategy on the emulated accelerator, at budgets that
// keep the model resident and budgets that make it stream weights and offload
// activations, planned for this machine as tandemd plans (its host measured:
// GEMM rate and memory bandwidth). The test times steps, so it runs alone
// (tag exclusive), and prints the table of errors.
//
// The band, kBand (measured within 10x of predicted, either way), is the one
// this planner can defend today, and it is wide: on this 2-core machine the
// cost model prices every GEMM at the rate of one large GEMM and every span
// at zero fixed cost, so plans that split the batch into micro-batches of one
// or two samples run up to 7x slower than predicted (the gpt rows of the table
// this test prints), and the emulated accelerator, its copy engines and the
// host's update pool share the two cores the planner assumes are free for
// each. Closed-loop planning (re-solving from measured spans) is what will
// narrow it; until then an error past 10x is a unit slip, a cost left out or a
// resource serialised that the simulator overlaps, and fails here.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "node/placement.h"
#include "node/placement_test_util.h"
#include "spec/job_spec.h"

namespace tandem::node {
namespace {

using placement_testing::ModelStateBytes;
using placement_testing::Spec;
using placement_testing::Train;
using placement_testing::TrainRun;
using tandem::v1::JobSpec;
using tandem::v1::Strategy;

constexpr double kBand = 10.0;
// Plans whose micro-batches hold one sample: every GEMM is a sliver of the
// 1024^3 one whose rate prices it. On an AMX Xeon whose 2 threads measured
// 350 GFLOP/s on that GEMM, the gpt's one-sample micro-batches ran 10.2-10.9x
// slower than predicted (4.5-7.2x on the EPYC this band was set on). A 10x
// slip in the GEMM rate still fails: the mlp's full micro-batches sit at
// 1.2-2.2x.
constexpr double kOneSampleBand = 16.0;
constexpr int kSteps = 14;
// Steps left out of the median: oneDNN builds its primitives in the first.
constexpr int kWarmupSteps = 4;

// Large enough that compute, not the executor's per-span overhead, dominates.
JobSpec Gpt() {
  return Spec(R"(
model: {gpt: {n_layer: 4, n_head: 4, d_model: 128, context: 64}}
data: {synthetic: {sample_shape: [64], num_classes: 64, tokens: true, train_samples: 512, test_samples: 8}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW, learning_rate: 0.001}
training: {batch_size: 8, seed: 3, checkpoint_disabled: true, log_interval_steps: 1}
placement: {accelerator: ACCELERATOR_KIND_EMULATED}
)");
}

JobSpec Mlp() {
  return Spec(R"(
model: {mlp: {hidden_sizes: [1024, 1024]}}
data: {synthetic: {sample_shape: [784], num_classes: 10, train_samples: 2048, test_samples: 8}}
optimizer: {kind: OPTIMIZER_KIND_ADAM, learning_rate: 0.001}
training: {batch_size: 64, seed: 4, checkpoint_disabled: true, log_interval_steps: 1}
placement: {accelerator: ACCELERATOR_KIND_EMULATED}
)");
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Case {
  Strategy strategy;
  // The accelerator's capacity, as a fraction of the model state: 2 keeps
  // everything resident; below 1 weights must stream or activations offload.
  double state_fraction;
};

// `tight`: a fraction of the model state at which the model's plans must move
// weights or activations during the step.
void PredictionsWithinTheBand(const char* model, JobSpec (*make)(), double tight) {
  const NodeOffer node = DetectNodeOffer(0);
  const Case cases[] = {
      {tandem::v1::STRATEGY_GPU_ONLY, 2},           {tandem::v1::STRATEGY_ZERO_OFFLOAD, 2},
      {tandem::v1::STRATEGY_ZERO_OFFLOAD, tight},   {tandem::v1::STRATEGY_REUSE_DISTANCE, 2},
      {tandem::v1::STRATEGY_REUSE_DISTANCE, tight}, {tandem::v1::STRATEGY_HETERO_DP, 2},
      {tandem::v1::STRATEGY_CPU_ONLY, 2},
  };
  std::printf("host: %s, GEMM %.0f GFLOP/s, memory %.1f GB/s (measured now)\n",
              node.host.name().c_str(), node.host.peak_matmul_flops_per_second() / 1e9,
              node.host.memory_bandwidth_bytes_per_second() / 1e9);
  std::printf("%-4s %-16s %6s %-7s %10s %10s %9s\n", "", "strategy", "budget", "mb", "pred ms",
              "meas ms", "meas/pred");
  for (const Case& c : cases) {
    JobSpec spec = make();
    const std::string name = absl::StrCat(model, " ", tandem::v1::Strategy_Name(c.strategy), " at ",
                                          c.state_fraction, " of the state");
    SCOPED_TRACE(name);
    // fp32, whatever auto would choose here: bf16 plans are predicted from a
    // GEMM rate their layers do not reach (docs/planning.md, "Mixed precision").
    spec.set_precision(tandem::v1::PRECISION_FP32);
    spec.mutable_training()->set_steps(kSteps);
    spec.mutable_training()->set_eval_interval_steps(kSteps);
    spec.mutable_placement()->set_strategy(c.strategy);
    spec.mutable_resources()->set_accelerator_memory_bytes(
        static_cast<int64_t>(ModelStateBytes(spec) * c.state_fraction));
    const TrainRun run = Train(spec, MakeRunnerFactory(node));
    ASSERT_TRUE(run.status.ok()) << run.status;
    ASSERT_EQ(run.step_seconds.size(), size_t{kSteps});
    const double measured = Median(
        std::vector<double>(run.step_seconds.begin() + kWarmupSteps, run.step_seconds.end()));
    const double predicted = run.metrics.predicted_step_seconds();
    std::printf("%-4s %-16s %5.2fx %-7s %10.2f %10.2f %9.2f\n", model,
                tandem::v1::Strategy_Name(c.strategy).c_str() + 9, c.state_fraction,
                absl::StrCat(run.plan.micro_batch_size(), "x", run.plan.micro_batches()).c_str(),
                predicted * 1e3, measured * 1e3, measured / predicted);
    ASSERT_GT(predicted, 0);
    if (c.state_fraction < 1) {
      // The case is only what it claims if the plan moves weights or
      // activations during the step.
      int moved = 0;
      for (const tandem::v1::LayerPlan& l : run.plan.layers()) {
        moved += l.parameter_home() == tandem::v1::PARAMETER_HOME_HOST_STREAMED ||
                 l.activation_policy() == tandem::v1::ACTIVATION_POLICY_OFFLOAD;
      }
      EXPECT_GT(moved, 0) << "the plan at " << c.state_fraction << " of the state keeps everything";
    }
    const double band = run.plan.micro_batch_size() == 1 ? kOneSampleBand : kBand;
    EXPECT_LE(measured / predicted, band);
    EXPECT_GE(measured / predicted, 1 / band);
  }
}

TEST(PredictionTest, GptEveryStrategyWithinTheBand) { PredictionsWithinTheBand("gpt", Gpt, 0.75); }

// Weights and gradients are half the state: below it they must stream.
TEST(PredictionTest, MlpEveryStrategyWithinTheBand) { PredictionsWithinTheBand("mlp", Mlp, 0.45); }

}  // namespace
}  // namespace tandem::node
