// The training loop: exact resume from a checkpoint, a diverging loss stopping
// with a clear error, damaged checkpoints, and losses that fall.
#include "runtime/train/trainer.h"

#include <filesystem>
#include <fstream>

#include "base/test_dir.h"
#include "gtest/gtest.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/train/checkpoint.h"
#include "spec/job_spec.h"

namespace tandem {
namespace {

tandem::v1::JobSpec SyntheticMlp(int steps) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model:
  mlp: {hidden_sizes: [32, 32], dropout: 0.1}
data:
  synthetic: {sample_shape: [12], num_classes: 4, train_samples: 200, test_samples: 64}
optimizer: {kind: OPTIMIZER_KIND_ADAM, learning_rate: 0.01}
training: {batch_size: 16, steps: 30, seed: 5, checkpoint_interval_steps: 4}
)",
                                                          "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_steps(steps);
  return *spec;
}

struct TrainRun {
  std::vector<double> losses;
  absl::Status status;
  int64_t checkpoint_step = 0;
};

TrainRun Train(const tandem::v1::JobSpec& spec, const std::string& dir, int stop_after = -1,
               RunnerFactory factory = nullptr) {
  TrainRun run;
  TrainerOptions options;
  options.checkpoint_dir = dir;
  options.make_runner = factory;
  TrainerCallbacks callbacks;
  int steps = 0;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
    run.losses.push_back(p.loss());
    ++steps;
  };
  callbacks.should_stop = [&] { return stop_after >= 0 && steps >= stop_after; };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
  if (!trainer.ok()) {
    run.status = trainer.status();
    return run;
  }
  run.status = (*trainer)->Run();
  run.checkpoint_step = (*trainer)->checkpoint_step();
  return run;
}

// A 30-step job stopped after 13 steps (in a fresh checkpoint directory
// named `dir_name`) and resumed gives `whole`'s 30 losses, to the bit.
void ExpectResumesExactly(const tandem::v1::JobSpec& spec, const std::vector<double>& whole,
                          const std::string& dir_name) {
  const std::string dir = TempDir(dir_name);
  const TrainRun first = Train(spec, dir, /*stop_after=*/13);
  EXPECT_EQ(first.status.code(), absl::StatusCode::kCancelled) << first.status;
  EXPECT_EQ(first.checkpoint_step, 13);
  const TrainRun second = Train(spec, dir);
  ASSERT_TRUE(second.status.ok()) << second.status;
  ASSERT_EQ(first.losses.size(), 13u);
  ASSERT_EQ(second.losses.size(), 17u);
  for (size_t i = 0; i < 13; ++i) EXPECT_EQ(first.losses[i], whole[i]) << i;
  for (size_t i = 0; i < 17; ++i) EXPECT_EQ(second.losses[i], whole[13 + i]) << i;
}

TEST(TrainerTest, ResumeContinuesTheSameLossTrajectory) {
  const tandem::v1::JobSpec spec = SyntheticMlp(30);
  const TrainRun whole = Train(spec, "");
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_EQ(whole.losses.size(), 30u);
  // Bitwise: same batches, dropout masks, parameters and Adam moments.
  ExpectResumesExactly(spec, whole.losses, "resume");
}

// Resumed at step 13 of 30 (13 batches an epoch), the job's progress says
// so before its first step: step, epoch, samples and fraction.
TEST(TrainerTest, ProgressIsTheCheckpointsPositionRightAfterAResume) {
  const tandem::v1::JobSpec spec = SyntheticMlp(30);
  const std::string dir = TempDir("resume-progress");
  ASSERT_EQ(Train(spec, dir, /*stop_after=*/13).status.code(), absl::StatusCode::kCancelled);
  TrainerOptions options;
  options.checkpoint_dir = dir;
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, {});
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const tandem::v1::JobProgress& p = (*trainer)->progress();
  EXPECT_EQ(p.step(), 13);
  EXPECT_EQ(p.epoch(), 1);
  EXPECT_EQ(p.samples(), 200);  // 12 batches of 16 and the epoch's last 8
  EXPECT_DOUBLE_EQ(p.fraction(), 13.0 / 30.0);
}

TEST(TrainerTest, Bf16JobResumesExactlyFromItsFp32MasterState) {
  tandem::v1::JobSpec spec = SyntheticMlp(30);
  spec.set_precision(tandem::v1::PRECISION_BF16);
  const TrainRun whole = Train(spec, "");
  if (whole.status.code() == absl::StatusCode::kFailedPrecondition) {
    GTEST_SKIP() << "no native bf16 on this CPU: " << whole.status;
  }
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_EQ(whole.losses.size(), 30u);
  tandem::v1::JobSpec fp32_spec = SyntheticMlp(30);
  fp32_spec.set_precision(tandem::v1::PRECISION_FP32);
  const TrainRun fp32 = Train(fp32_spec, "");
  ASSERT_TRUE(fp32.status.ok()) << fp32.status;
  EXPECT_NE(whole.losses.back(), fp32.losses.back()) << "the bf16 products did not run";
  EXPECT_NEAR(whole.losses.back(), fp32.losses.back(), 0.05 * fp32.losses.back());

  // The checkpoint holds the fp32 master weights and Adam moments; the bf16
  // copies are rounded from them again, so the trajectory is the same to the bit.
  ExpectResumesExactly(spec, whole.losses, "resume_bf16");
}

// fp16 with dynamic loss scaling, started at a scale that overflows: the
// first steps are skipped (the scale halving each time) until the scaled
// gradients fit fp16, then it trains; the skipped steps are counted, and a
// run resumed from a checkpoint carries on with the same scale, the same
// count and the same losses, to the bit.
TEST(TrainerTest, Fp16LossScalingSkipsOverflowsAndResumesExactly) {
  tandem::v1::JobSpec spec = SyntheticMlp(30);
  spec.set_precision(tandem::v1::PRECISION_FP16);
  // fp16 runs where a GPU (or the emulated one) is; the trainer's own runner
  // here is the CPU engine, whose layers compute the same fp16 products.
  spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_EMULATED);
  spec.mutable_placement()->set_strategy(tandem::v1::STRATEGY_CPU_ONLY);
  spec.mutable_training()->mutable_loss_scaling()->set_initial_scale(0x1p40);
  spec.mutable_training()->mutable_loss_scaling()->set_growth_interval_steps(8);
  std::vector<double> scales;
  TrainerOptions options;
  TrainerCallbacks callbacks;
  std::vector<double> losses;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
    losses.push_back(p.loss());
    scales.push_back(p.loss_scale());
  };
  auto trainer = Trainer::Create(spec, options, callbacks);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  const tandem::v1::JobMetrics& m = (*trainer)->metrics();
  // 2^40 down to a scale whose products fit: a handful of halvings, each a
  // skipped step, then growth every 8 clean steps.
  EXPECT_GT(m.skipped_steps(), 0);
  EXPECT_LT(m.skipped_steps(), 30);
  ASSERT_EQ(scales.size(), 30u);
  EXPECT_EQ(scales[0], 0x1p40);
  EXPECT_EQ(scales[1], 0x1p39);
  EXPECT_GT(m.loss_scale(), 0);
  EXPECT_LT(m.loss_scale(), 0x1p40);
  EXPECT_LT(losses.back(), losses[m.skipped_steps()]) << "it trains once the scale fits";
  const TrainRun whole = Train(spec, "");
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_EQ(whole.losses, losses) << "two runs of the same job";

  ExpectResumesExactly(spec, whole.losses, "resume_fp16");
}

TEST(TrainerTest, Fp16IsRefusedOnTheCpuEngine) {
  tandem::v1::JobSpec spec = SyntheticMlp(3);
  spec.set_precision(tandem::v1::PRECISION_FP16);
  const TrainRun run = Train(spec, "");
  EXPECT_EQ(run.status.code(), absl::StatusCode::kFailedPrecondition) << run.status;
  EXPECT_NE(run.status.message().find("PRECISION_FP16"), std::string::npos) << run.status;
}

// The CPU engine as a RunnerFactory, failing from its `fail_from`-th call on
// (0: never).
RunnerFactory CpuFactory(int* calls, int fail_from = 0) {
  return [calls, fail_from](const Model& model, const tandem::v1::JobSpec& resolved,
                            int64_t max_batch,
                            Allocator* host) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
    if (fail_from > 0 && ++*calls >= fail_from) return absl::ResourceExhaustedError("no memory");
    absl::StatusOr<std::unique_ptr<CpuRunner>> cpu =
        CpuRunner::Create(model, resolved.optimizer(), max_batch, resolved.training().seed(), host);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<StepRunner>(*std::move(cpu));
  };
}

// A runner switch (the closed loop's) goes on from exactly the checkpoint it
// wrote: the same losses as a run that never switched, even where that
// checkpoint is the only one (were it unreadable, the new runner must not
// start from its initial weights) or an older one exists (it must not
// rewind).
TEST(TrainerTest, ARunnerSwitchGoesOnFromTheCheckpointItWrote) {
  const tandem::v1::JobSpec spec = SyntheticMlp(12);
  const TrainRun whole = Train(spec, "");
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  for (const int at : {3, 6}) {  // before any periodic checkpoint, and after one
    const std::string dir = TempDir("switch-" + std::to_string(at));
    TrainerOptions options;
    options.checkpoint_dir = dir;
    TrainerCallbacks callbacks;
    std::vector<double> losses;
    callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
      losses.push_back(p.loss());
    };
    int calls = 0;
    callbacks.switch_runner = [&]() -> RunnerFactory {
      return static_cast<int>(losses.size()) == at ? CpuFactory(&calls) : nullptr;
    };
    absl::Status switched = absl::UnknownError("never switched");
    callbacks.on_switch = [&](const absl::Status& made) { switched = made; };
    absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Run().ok());
    EXPECT_TRUE(switched.ok()) << switched;
    ASSERT_EQ(losses, whole.losses) << "switched at step " << at;
  }
}

// A switch whose own checkpoint reads back damaged fails the run (DATA_LOSS)
// rather than going on from an older checkpoint (rewinding) or from none
// (the new runner's initial weights at the old step count).
TEST(TrainerTest, ASwitchWhoseCheckpointIsDamagedFailsTheRun) {
  const tandem::v1::JobSpec spec = SyntheticMlp(12);
  TrainerOptions options;
  options.checkpoint_dir = TempDir("switch-damaged");
  TrainerCallbacks callbacks;
  int steps = 0, calls = 0;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress&) { ++steps; };
  callbacks.on_checkpoint = [&](const tandem::v1::JobEvent::CheckpointSaved& saved) {
    if (saved.step() != 6) return;  // the switch's own
    std::fstream f(saved.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-8, std::ios::end);
    const char byte = static_cast<char>(f.get() ^ 1);  // a bit of the last tensor
    f.seekp(-8, std::ios::end);
    f.put(byte);
  };
  callbacks.switch_runner = [&]() -> RunnerFactory {
    return steps == 6 ? CpuFactory(&calls) : nullptr;
  };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const absl::Status run = (*trainer)->Run();
  EXPECT_EQ(run.code(), absl::StatusCode::kDataLoss) << run;
  EXPECT_EQ(steps, 6);
}

// A switch whose new runner cannot be made, nor the previous one again,
// fails the run with both reasons, and the trainer says it has no runner
// (the daemon then records the job without one).
TEST(TrainerTest, ASwitchThatCanMakeNoRunnerFailsTheRun) {
  const tandem::v1::JobSpec spec = SyntheticMlp(8);
  TrainerOptions options;
  options.checkpoint_dir = TempDir("switch-fails");
  int first_calls = 0, next_calls = 0;
  options.make_runner = CpuFactory(&first_calls, /*fail_from=*/2);
  TrainerCallbacks callbacks;
  int steps = 0;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress&) { ++steps; };
  callbacks.switch_runner = [&]() -> RunnerFactory {
    return steps == 4 ? CpuFactory(&next_calls, /*fail_from=*/1) : nullptr;
  };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const absl::Status run = (*trainer)->Run();
  EXPECT_EQ(run.code(), absl::StatusCode::kResourceExhausted) << run;
  EXPECT_NE(run.message().find("cannot switch runners at step 4"), std::string::npos) << run;
  EXPECT_NE(run.message().find("nor make the previous one again"), std::string::npos) << run;
  EXPECT_FALSE((*trainer)->has_runner());
}

// The step time a job reports is its steps' own, over the latest window:
// not the evaluations run between them (its throughput's window holds those).
TEST(TrainerTest, StepSecondsAreTheWindowsStepsAlone) {
  tandem::v1::JobSpec spec = SyntheticMlp(8);
  spec.mutable_training()->set_log_interval_steps(4);
  spec.mutable_training()->set_eval_interval_steps(1);
  TrainerOptions options;
  TrainerCallbacks callbacks;
  std::vector<double> steps;
  callbacks.after_step = [&](int64_t, double seconds, const StepRunner&) {
    steps.push_back(seconds);
  };
  std::vector<double> windows;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
    windows.push_back(p.window_step_seconds());
  };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Run().ok());
  ASSERT_EQ(steps.size(), 8u);
  ASSERT_EQ(windows.size(), 2u);
  const double last = (steps[4] + steps[5] + steps[6] + steps[7]) / 4;
  EXPECT_NEAR((*trainer)->metrics().step_seconds(), last, 1e-9);
  EXPECT_NEAR(windows[1], last, 1e-9);
  EXPECT_NEAR(windows[0], (steps[0] + steps[1] + steps[2] + steps[3]) / 4, 1e-9);
}

TEST(TrainerTest, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  const tandem::v1::JobSpec spec = SyntheticMlp(10);
  const std::string dir = TempDir("damaged");
  ASSERT_TRUE(Train(spec, dir, 9).status.code() == absl::StatusCode::kCancelled);
  // Checkpoints at steps 8 (interval 4) and 9 (the stop). Damage step 9's.
  std::string newest;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().string() > newest) newest = e.path().string();
  }
  {
    std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("garbage!", 8);
  }
  const TrainRun resumed = Train(spec, dir);
  ASSERT_TRUE(resumed.status.ok()) << resumed.status;
  EXPECT_EQ(resumed.losses.size(), 2u);  // Resumed from step 8.
}

// Resumed from step 8 because step 11's checkpoint is damaged, the run's next
// checkpoint (step 10, at its stop) keeps the good step 8 beside it and drops
// step 11, from the abandoned run; before, it dropped step 8.
TEST(TrainerTest, ACheckpointAfterAFallbackKeepsTheGoodOnesNotTheDamagedOne) {
  const tandem::v1::JobSpec spec = SyntheticMlp(20);
  const std::string dir = TempDir("fallback-prune");
  ASSERT_EQ(Train(spec, dir, 11).status.code(), absl::StatusCode::kCancelled);
  auto steps = [&dir] {
    std::vector<int64_t> out;
    for (const auto& [step, path] : ListCheckpoints(dir, kCheckpointSuffix)) out.push_back(step);
    return out;
  };
  ASSERT_EQ(steps(), (std::vector<int64_t>{11, 8}));
  {
    std::fstream f(CheckpointPath(dir, 11, kCheckpointSuffix),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("garbage!", 8);
  }
  const TrainRun resumed = Train(spec, dir, 2);
  ASSERT_EQ(resumed.status.code(), absl::StatusCode::kCancelled) << resumed.status;
  EXPECT_EQ(resumed.checkpoint_step, 10);
  EXPECT_EQ(steps(), (std::vector<int64_t>{10, 8}));
}

TEST(TrainerTest, NonFiniteLossFailsWithAClearError) {
  // A weight poisoned with NaN, as a diverging run ends up: the first loss is NaN.
  RunnerFactory poisoned = [](const Model& model, const tandem::v1::JobSpec& spec,
                              int64_t max_batch,
                              Allocator* allocator) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
    absl::StatusOr<std::unique_ptr<CpuRunner>> r =
        CpuRunner::Create(model, spec.optimizer(), max_batch, 1, allocator);
    if (!r.ok()) return r.status();
    // The output layer: a ReLU after a poisoned weight would turn NaN into 0.
    (*r)->host_state().params[model.param_offset(model.num_layers() - 2)] = std::nanf("");
    return std::unique_ptr<StepRunner>(std::move(*r));
  };
  const TrainRun run = Train(SyntheticMlp(5), "", -1, poisoned);
  EXPECT_EQ(run.status.code(), absl::StatusCode::kFailedPrecondition) << run.status;
  EXPECT_NE(run.status.message().find("loss became NaN at step 1"), std::string::npos)
      << run.status;
  EXPECT_NE(run.status.message().find("learning_rate"), std::string::npos) << run.status;
}

TEST(TrainerTest, GptLossFallsOnLearnableTokens) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {gpt: {n_layer: 2, n_head: 2, d_model: 32, context: 16}}
data: {synthetic: {sample_shape: [16], num_classes: 20, tokens: true, train_samples: 256}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW, learning_rate: 0.003}
training: {batch_size: 16, steps: 60, seed: 2, checkpoint_disabled: true}
)",
                                                          "gpt.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const TrainRun run = Train(*spec, "");
  ASSERT_TRUE(run.status.ok()) << run.status;
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) first += run.losses[i] / 5;
  for (int i = 55; i < 60; ++i) last += run.losses[i] / 5;
  EXPECT_NEAR(first, std::log(20.0), 0.5);
  EXPECT_LT(last, 0.5 * first);
}

TEST(TrainerTest, HostBudgetRefusalIsAClearError) {
  tandem::v1::JobSpec spec = SyntheticMlp(5);
  spec.mutable_resources()->set_host_memory_bytes(4096);
  const TrainRun run = Train(spec, "");
  EXPECT_EQ(run.status.code(), absl::StatusCode::kResourceExhausted) << run.status;
  EXPECT_NE(run.status.message().find("memory budget exceeded"), std::string::npos) << run.status;
}

}  // namespace
}  // namespace tandem
