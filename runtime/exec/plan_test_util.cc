#include "runtime/exec/plan_test_util.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "gtest/gtest.h"
#include "runtime/core/allocator.h"
#include "runtime/data/loader.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/train/job_model.h"

namespace tandem::exec_test {

using tandem::v1::Plan;

const char kMlp[] = R"(
model: {mlp: {hidden_sizes: [48, 40], dropout: 0.1}}
data: {synthetic: {sample_shape: [12], num_classes: 5, train_samples: 512}}
optimizer: {kind: OPTIMIZER_KIND_ADAM, learning_rate: 0.01}
training: {batch_size: 32, steps: 50, seed: 3}
)";

const char kGpt[] = R"(
model: {gpt: {n_layer: 2, n_head: 2, d_model: 16, context: 8, dropout: 0.1}}
data: {synthetic: {sample_shape: [8], num_classes: 12, tokens: true, train_samples: 256}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW, learning_rate: 0.01, max_grad_norm: 1.0}
training: {batch_size: 16, steps: 50, seed: 4}
)";

Fixture MakeFixture(const std::string& yaml, DType compute) {
  Fixture f;
  f.spec = *ResolveJobSpec(*ParseJobSpec(yaml, "test.yaml"), false);
  f.compute = compute;
  JobModel jm = *BuildJobModel(f.spec, nullptr, compute);
  f.model = std::move(jm.model);
  f.data = *OpenDatasets(f.spec.data(), 1, nullptr, ModelContext(f.spec));
  return f;
}

std::vector<double> RunSteps(const Fixture& f, StepRunner& runner, int steps) {
  BatchLoader loader(*f.data.train, f.spec.training().batch_size(), true, f.spec.training().seed(),
                     false);
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    StepOptions o;
    o.step = s;
    o.seed = f.spec.training().seed();
    o.learning_rate = f.spec.optimizer().learning_rate();
    o.loss_scale = f.loss_scale;
    absl::StatusOr<StepResult> r = runner.TrainStep(loader.Next(), o);
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      return losses;
    }
    losses.push_back(r->loss);
  }
  return losses;
}

std::vector<double> Reference(const Fixture& f, int steps) {
  HostAllocator host;
  auto cpu = *CpuRunner::Create(*f.model, f.spec.optimizer(), f.spec.training().batch_size(),
                                f.spec.training().seed(), &host);
  return RunSteps(f, *cpu, steps);
}

double ExpectLossesClose(const std::vector<double>& losses, const std::vector<double>& reference,
                         double rtol, const std::string& what) {
  EXPECT_EQ(losses.size(), reference.size()) << what;
  double worst = 0;
  for (size_t s = 0; s < losses.size() && s < reference.size(); ++s) {
    const double deviation = std::fabs(losses[s] - reference[s]) / std::fabs(reference[s]);
    worst = std::max(worst, deviation);
    EXPECT_LE(deviation, rtol) << what << " step " << s << ": " << losses[s] << " vs "
                               << reference[s];
  }
  return worst;
}

ExecutorOptions ExecutorOptionsFor(const Fixture& f, tandem::v1::Plan plan, int64_t max_batch,
                                   Accelerator* accelerator, Allocator* host) {
  ExecutorOptions options;
  options.plan = std::move(plan);
  options.optimizer = f.spec.optimizer();
  options.max_batch = max_batch;
  options.init_seed = f.spec.training().seed();
  options.host_allocator = host;
  options.accelerator = accelerator;
  return options;
}

Plan MakePlan(const Model& m, tandem::v1::Strategy strategy, int batch, int micro,
              const std::function<void(int, tandem::v1::LayerPlan*)>& make) {
  Plan p;
  p.set_strategy(strategy);
  p.set_batch_size(batch);
  p.set_micro_batch_size(micro);
  p.set_micro_batches(batch / micro);
  p.set_host_update_threads(1);
  for (int l = 0; l < m.num_layers(); ++l) {
    auto* lp = p.add_layers();
    lp->set_index(l);
    lp->set_compute(tandem::v1::PLACEMENT_ACCELERATOR);
    lp->set_parameter_home(tandem::v1::PARAMETER_HOME_ACCELERATOR);
    lp->set_update(tandem::v1::PLACEMENT_ACCELERATOR);
    lp->set_activation_policy(tandem::v1::ACTIVATION_POLICY_KEEP);
    make(l, lp);
  }
  return p;
}

namespace {

// The three update places: of the layers with parameters, every third from
// the first streams its optimizer state in for an accelerator update, the next
// updates on the host, the third keeps its state resident. The state comes in
// two layers ahead and the update waits one more layer's backward.
Plan StreamedStatePlan(const Model& m, int batch) {
  using namespace tandem::v1;
  int k = 0;
  Plan p = MakePlan(m, STRATEGY_REUSE_DISTANCE, batch, batch, [&m, &k](int l, LayerPlan* lp) {
    if (m.layer(l).ParamCount() == 0) return;
    if (k % 3 == 0) lp->set_stream_optimizer_state(true);
    if (k % 3 == 1) lp->set_update(PLACEMENT_HOST);
    ++k;
  });
  p.set_state_prefetch_layers(2);
  p.set_state_update_lag(1);
  return p;
}

}  // namespace

std::vector<Case> Cases() {
  using namespace tandem::v1;
  return {
      {"gpu_only",
       [](const Model& m, int b) {
         return MakePlan(m, STRATEGY_GPU_ONLY, b, b, [](int, LayerPlan*) {});
       },
       0},
      {"zero_offload",
       [](const Model& m, int b) {
         return MakePlan(m, STRATEGY_ZERO_OFFLOAD, b, b,
                         [](int, LayerPlan* lp) { lp->set_update(PLACEMENT_HOST); });
       },
       0},
      {"reuse_distance",
       [](const Model& m, int b) {
         // The first layers (shortest reuse distance) update on the device.
         return MakePlan(m, STRATEGY_REUSE_DISTANCE, b, b, [&m](int l, LayerPlan* lp) {
           if (l >= m.num_layers() / 2) lp->set_update(PLACEMENT_HOST);
         });
       },
       0},
      {"streamed_offload_recompute",
       [](const Model& m, int b) {
         return MakePlan(m, STRATEGY_REUSE_DISTANCE, b, b, [](int l, LayerPlan* lp) {
           if (l % 2 == 1) {
             lp->set_parameter_home(PARAMETER_HOME_HOST_STREAMED);
             lp->set_update(PLACEMENT_HOST);
           }
           lp->set_activation_policy(l % 3 == 0   ? ACTIVATION_POLICY_OFFLOAD
                                     : l % 3 == 1 ? ACTIVATION_POLICY_RECOMPUTE
                                                  : ACTIVATION_POLICY_KEEP);
         });
       },
       0},
      // Gradients accumulate over micro-batches: only the summation order changes.
      {"micro_batches",
       [](const Model& m, int b) {
         return MakePlan(m, STRATEGY_ZERO_OFFLOAD, b, b / 4, [](int l, LayerPlan* lp) {
           if (l % 2 == 0) lp->set_update(PLACEMENT_HOST);
           if (l % 2 == 1) lp->set_activation_policy(ACTIVATION_POLICY_RECOMPUTE);
         });
       },
       1e-5},
      {"cpu_only",
       [](const Model& m, int b) {
         return MakePlan(m, STRATEGY_CPU_ONLY, b, b, [](int, LayerPlan* lp) {
           lp->set_compute(PLACEMENT_HOST);
           lp->set_parameter_home(PARAMETER_HOME_HOST);
           lp->set_update(PLACEMENT_HOST);
         });
       },
       0},
      // Two replicas' gradients are summed: only the summation order changes.
      {"hetero_dp",
       [](const Model& m, int b) {
         Plan p = MakePlan(m, STRATEGY_HETERO_DP, b, b / 2, [](int, LayerPlan*) {});
         p.set_accelerator_batch_share(b * 5 / 8);
         p.set_micro_batch_size(b * 5 / 16);
         return p;
       },
       1e-5},
      {"streamed_state", StreamedStatePlan, 0},
  };
}

}  // namespace tandem::exec_test
