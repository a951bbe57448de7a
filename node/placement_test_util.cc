#include "node/placement_test_util.h"

#include "gtest/gtest.h"
#include "runtime/train/job_model.h"
#include "runtime/train/trainer.h"

namespace tandem::node::placement_testing {

using tandem::v1::JobSpec;
using tandem::v1::Strategy;

NodeOffer TestNode() {
  NodeOffer node;
  node.host.set_kind(tandem::v1::DEVICE_KIND_CPU);
  node.host.set_name("test host");
  node.host.set_threads(2);
  node.host.set_peak_matmul_flops_per_second(100e9);
  node.host.set_peak_vector_flops_per_second(100e9);
  node.host.set_memory_bandwidth_bytes_per_second(20e9);
  node.host.set_memory_bytes(int64_t{16} << 30);
  return node;
}

JobSpec Spec(const std::string& yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

namespace {

// `steps` steps with one evaluation at the end, under `strategy` with an
// accelerator of `capacity` bytes, in fp32 (what these tests size and
// predict; auto would be bf16 on a CPU that computes it natively, and bf16
// plans have tests of their own).
JobSpec Planned(JobSpec spec, Strategy strategy, int64_t capacity, int steps) {
  spec.set_precision(tandem::v1::PRECISION_FP32);
  spec.mutable_training()->set_steps(steps);
  spec.mutable_training()->set_eval_interval_steps(steps);
  spec.mutable_placement()->set_strategy(strategy);
  spec.mutable_resources()->set_accelerator_memory_bytes(capacity);
  return spec;
}

}  // namespace

JobSpec Gpt(Strategy strategy, int64_t capacity, int steps) {
  return Planned(Spec(R"(
model: {gpt: {n_layer: 6, n_head: 4, d_model: 128, context: 8, dropout: 0.1}}
data: {synthetic: {sample_shape: [8], num_classes: 40, tokens: true, train_samples: 64, test_samples: 8}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW, learning_rate: 0.003}
training: {batch_size: 4, seed: 3, checkpoint_disabled: true}
placement: {accelerator: ACCELERATOR_KIND_EMULATED}
)"),
                 strategy, capacity, steps);
}

JobSpec Mlp(Strategy strategy, int64_t capacity, int steps) {
  return Planned(Spec(R"(
model: {mlp: {hidden_sizes: [384, 384, 384], dropout: 0.1}}
data: {synthetic: {sample_shape: [192], num_classes: 10, train_samples: 256, test_samples: 32}}
optimizer: {kind: OPTIMIZER_KIND_ADAM, learning_rate: 0.001}
training: {batch_size: 8, seed: 4, checkpoint_disabled: true}
placement: {accelerator: ACCELERATOR_KIND_EMULATED}
)"),
                 strategy, capacity, steps);
}

TrainRun Train(const JobSpec& spec, RunnerFactory factory) {
  TrainRun run;
  TrainerOptions options;
  options.make_runner = std::move(factory);
  TrainerCallbacks callbacks;
  callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
    run.losses.push_back(p.loss());
    run.step_seconds.push_back(p.step_seconds());
  };
  callbacks.on_eval = [&](const tandem::v1::JobEvent::EvalResult& e) { run.eval_loss = e.loss(); };
  absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
  if (!trainer.ok()) {
    run.status = trainer.status();
    return run;
  }
  run.status = (*trainer)->Run();
  run.metrics = (*trainer)->metrics();
  run.plan = (*trainer)->runner().plan();
  return run;
}

int64_t ModelStateBytes(const JobSpec& spec) {
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  EXPECT_TRUE(jm.ok()) << jm.status();
  return jm->model->parameter_elements() * 4 * 4;
}

}  // namespace tandem::node::placement_testing
