#include "planner/planner.h"

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/schedule.h"
#include "planner/simulator.h"
#include "planner/strategies.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// A small node where host updates matter: 20 TFLOP/s accelerator, a host
// with 20 GB/s of memory bandwidth and a 8 GB/s link.
tandem::v1::HardwareSpec SmallNode(int accelerators = 1) {
  tandem::v1::HardwareSpec spec;
  spec.set_name("small");
  tandem::v1::ProcessorSpec* host = spec.mutable_host();
  host->set_kind(tandem::v1::DEVICE_KIND_CPU);
  host->set_peak_matmul_flops_per_second(1e12);
  host->set_peak_vector_flops_per_second(2e11);
  host->set_memory_bandwidth_bytes_per_second(20e9);
  host->set_threads(8);
  host->set_memory_bytes(int64_t{256} << 30);
  for (int i = 0; i < accelerators; ++i) {
    tandem::v1::ProcessorSpec* acc = spec.add_accelerators();
    acc->set_kind(tandem::v1::DEVICE_KIND_CUDA);
    acc->set_peak_matmul_flops_per_second(20e12);
    acc->set_peak_vector_flops_per_second(5e12);
    acc->set_memory_bandwidth_bytes_per_second(900e9);
    acc->set_memory_bytes(int64_t{16} << 30);
  }
  spec.mutable_host_to_accelerator()->set_bandwidth_bytes_per_second(8e9);
  spec.mutable_host_to_accelerator()->set_latency_seconds(10e-6);
  spec.mutable_accelerator_to_host()->set_bandwidth_bytes_per_second(8e9);
  spec.mutable_accelerator_to_host()->set_latency_seconds(10e-6);
  spec.mutable_accelerator_to_accelerator()->set_bandwidth_bytes_per_second(50e9);
  return spec;
}

PlanRequest RandomRequest(std::mt19937* rng) {
  std::uniform_int_distribution<int> layers(2, 7);
  std::uniform_int_distribution<int> width(64, 3072);
  std::vector<int64_t> widths;
  const int n = layers(*rng);
  for (int i = 0; i <= n; ++i) widths.push_back(width(*rng));
  const int batch = 1 << std::uniform_int_distribution<int>(2, 8)(*rng);
  PlanRequest r;
  r.profile = testing::MlpProfile(widths, batch);
  r.hardware = SmallNode();
  r.delayed_parameter_update = ((*rng)() % 4) == 0;
  return r;
}

int64_t ModelStateBytes(const tandem::v1::Profile& p) {
  int64_t total = 0;
  for (const auto& l : p.layers()) {
    total += l.analytic_memory().parameter_bytes() + l.analytic_memory().gradient_bytes() +
             l.analytic_memory().optimizer_state_bytes();
  }
  return total;
}

const tandem::v1::Plan& PlanOf(const tandem::v1::PlanModelResponse& r, tandem::v1::Strategy s) {
  for (const tandem::v1::Plan& p : r.alternatives()) {
    if (p.strategy() == s) return p;
  }
  ADD_FAILURE() << "no plan for " << StrategyName(s);
  return r.plan();
}

TEST(SolvePlanTest, PlansNeverExceedTheBudgetAndPredictWhatTheySimulate) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    PlanRequest r = RandomRequest(&rng);
    const double fraction = std::uniform_real_distribution<double>(0.2, 1.6)(rng);
    r.accelerator_memory_bytes =
        std::max<int64_t>(kMiB, static_cast<int64_t>(fraction * ModelStateBytes(r.profile)));
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_TRUE(response.ok()) << response.status();
    ASSERT_EQ(response->alternatives_size(), 5);
    absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(r.profile, *r.hardware);
    ASSERT_TRUE(cost.ok());
    PlanSimulator sim(*cost);
    for (const tandem::v1::Plan& plan : response->alternatives()) {
      SCOPED_TRACE(StrategyName(plan.strategy()) + " trial " + std::to_string(trial));
      if (!plan.feasible()) continue;
      EXPECT_LE(plan.prediction().accelerator_peak_bytes(), r.accelerator_memory_bytes);
      // The returned Plan, simulated afresh, predicts the same.
      absl::StatusOr<SimulationResult> again = sim.Simulate(plan);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_EQ(again->prediction.accelerator_peak_bytes(),
                plan.prediction().accelerator_peak_bytes());
      EXPECT_DOUBLE_EQ(again->prediction.iteration_seconds(),
                       plan.prediction().iteration_seconds());
      EXPECT_GT(plan.timeline().spans_size(), 0);
      EXPECT_EQ(plan.layers_size(), r.profile.layers_size());
    }
  }
}

TEST(SolvePlanTest, ReuseDistanceIsNeverWorseThanZeroOffloadOrGpuOnly) {
  std::mt19937 rng(12);
  int strictly_better = 0;
  for (int trial = 0; trial < 40; ++trial) {
    PlanRequest r = RandomRequest(&rng);
    const double fraction = std::uniform_real_distribution<double>(0.3, 1.5)(rng);
    r.accelerator_memory_bytes = static_cast<int64_t>(fraction * ModelStateBytes(r.profile));
    r.compare = {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                 tandem::v1::STRATEGY_REUSE_DISTANCE};
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_TRUE(response.ok()) << response.status();
    const tandem::v1::Plan& gpu = PlanOf(*response, tandem::v1::STRATEGY_GPU_ONLY);
    const tandem::v1::Plan& zero = PlanOf(*response, tandem::v1::STRATEGY_ZERO_OFFLOAD);
    const tandem::v1::Plan& reuse = PlanOf(*response, tandem::v1::STRATEGY_REUSE_DISTANCE);
    EXPECT_EQ(reuse.feasible(), zero.feasible()) << "trial " << trial;
    if (zero.feasible()) {
      EXPECT_LE(reuse.prediction().iteration_seconds(), zero.prediction().iteration_seconds())
          << "trial " << trial;
      strictly_better += reuse.prediction().iteration_seconds() <
                         zero.prediction().iteration_seconds() * (1 - 1e-6);
    }
    if (gpu.feasible()) {
      EXPECT_LE(reuse.prediction().iteration_seconds(), gpu.prediction().iteration_seconds())
          << "trial " << trial;
    }
  }
  // The instances are drawn so that host updates matter: the search must
  // actually find something in a good share of them.
  EXPECT_GE(strictly_better, 10);
}

// End to end on small MLPs (up to 8 layers with parameters): the
// reuse_distance plan is at least as fast as the best of every placement of
// updates under zero_offload's memory settings, by exhaustive simulation.
TEST(SolvePlanTest, ReuseDistanceMatchesExhaustivePlacementOnSmallModels) {
  std::mt19937 rng(15);
  int compared = 0;
  for (int trial = 0; trial < 40; ++trial) {
    PlanRequest r = RandomRequest(&rng);
    const double fraction = std::uniform_real_distribution<double>(0.3, 1.2)(rng);
    r.accelerator_memory_bytes = static_cast<int64_t>(fraction * ModelStateBytes(r.profile));
    r.compare = {tandem::v1::STRATEGY_ZERO_OFFLOAD, tandem::v1::STRATEGY_REUSE_DISTANCE};
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_TRUE(response.ok()) << response.status();
    const tandem::v1::Plan& zero = PlanOf(*response, tandem::v1::STRATEGY_ZERO_OFFLOAD);
    const tandem::v1::Plan& reuse = PlanOf(*response, tandem::v1::STRATEGY_REUSE_DISTANCE);
    if (!zero.feasible()) continue;
    absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(r.profile, *r.hardware);
    ASSERT_TRUE(cost.ok());
    absl::StatusOr<Schedule> base = ScheduleFromPlan(zero, cost->num_layers());
    ASSERT_TRUE(base.ok()) << base.status();
    std::vector<int> eligible;
    for (int l = 0; l < cost->num_layers(); ++l) {
      if (cost->ParameterBytes(l) > 0 &&
          base->layers[l].parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) {
        eligible.push_back(l);
      }
    }
    PlanSimulator sim(*cost);
    SimulationOptions quiet;
    quiet.record_timeline = false;
    double best = HUGE_VAL;
    for (uint32_t mask = 0; mask < (1u << eligible.size()); ++mask) {
      Schedule s = *base;
      s.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
      for (size_t i = 0; i < eligible.size(); ++i) {
        s.layers[eligible[i]].update =
            (mask >> i) & 1 ? tandem::v1::PLACEMENT_ACCELERATOR : tandem::v1::PLACEMENT_HOST;
      }
      absl::StatusOr<SimulationResult> sr = sim.Simulate(s, quiet);
      ASSERT_TRUE(sr.ok()) << sr.status();
      if (sr->prediction.accelerator_peak_bytes() > r.accelerator_memory_bytes) continue;
      best = std::min(best, sr->prediction.iteration_seconds());
    }
    ASSERT_TRUE(reuse.feasible()) << trial;
    EXPECT_LE(reuse.prediction().iteration_seconds(), best * (1 + 1e-9))
        << "trial " << trial << ": " << reuse.solver().note();
    ++compared;
  }
  EXPECT_GE(compared, 20);
}

TEST(SolvePlanTest, AnInfeasibleStrategyReportsTheSmallestBudgetThatWorks) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 6; ++trial) {
    PlanRequest r = RandomRequest(&rng);
    r.accelerator_memory_bytes = kMiB;  // Nothing fits in 1 MiB.
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_TRUE(response.ok()) << response.status();
    for (const tandem::v1::Plan& plan : response->alternatives()) {
      if (plan.strategy() == tandem::v1::STRATEGY_CPU_ONLY) {
        EXPECT_TRUE(plan.feasible());
        continue;
      }
      SCOPED_TRACE(StrategyName(plan.strategy()) + " trial " + std::to_string(trial));
      ASSERT_FALSE(plan.feasible());
      const int64_t min_bytes = plan.min_accelerator_memory_bytes();
      ASSERT_GT(min_bytes, kMiB);
      EXPECT_NE(plan.solver().note().find("needs "), std::string::npos) << plan.solver().note();
      PlanRequest at = r;
      at.compare = {plan.strategy()};
      at.accelerator_memory_bytes = min_bytes;
      absl::StatusOr<tandem::v1::PlanModelResponse> fits = SolvePlan(at);
      ASSERT_TRUE(fits.ok());
      EXPECT_TRUE(fits->alternatives(0).feasible());
      EXPECT_LE(fits->alternatives(0).prediction().accelerator_peak_bytes(), min_bytes);
      at.accelerator_memory_bytes = min_bytes - kMiB;
      absl::StatusOr<tandem::v1::PlanModelResponse> short_by_one = SolvePlan(at);
      ASSERT_TRUE(short_by_one.ok());
      EXPECT_FALSE(short_by_one->alternatives(0).feasible());
    }
  }
}

TEST(SolvePlanTest, HostUpdatesThatStallMakeReuseDistanceFaster) {
  // Wide layers at a small batch: the host's Adam step over 28 bytes per
  // parameter at 11 GB/s dwarfs the accelerator's backward.
  PlanRequest r;
  r.profile = testing::MlpProfile({2048, 2048, 2048, 2048, 2048}, 16);
  r.hardware = SmallNode();
  r.accelerator_memory_bytes = ModelStateBytes(r.profile) * 3 / 4;
  r.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
  absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
  ASSERT_TRUE(response.ok()) << response.status();
  const tandem::v1::Plan& zero = PlanOf(*response, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  const tandem::v1::Plan& plan = response->plan();
  ASSERT_TRUE(plan.feasible()) << plan.solver().note();
  ASSERT_TRUE(zero.feasible());
  EXPECT_LT(plan.prediction().iteration_seconds(), 0.9 * zero.prediction().iteration_seconds());
  EXPECT_FALSE(PlanOf(*response, tandem::v1::STRATEGY_GPU_ONLY).feasible());
  // Some layer updates on the accelerator; the shortest-reuse-distance layer
  // has the least slack under zero_offload.
  int on_accelerator = 0;
  for (const tandem::v1::LayerPlan& l : plan.layers()) {
    on_accelerator += l.update() == tandem::v1::PLACEMENT_ACCELERATOR &&
                      l.accelerator_memory().parameter_bytes() > 0;
  }
  EXPECT_GT(on_accelerator, 0);
  EXPECT_LT(zero.layers(0).slack_seconds(), zero.layers(zero.layers_size() - 2).slack_seconds());
  EXPECT_GT(zero.prediction().accelerator_stall_seconds(), 0);
}

TEST(SolvePlanTest, AutoPicksTheFastestFeasiblePlan) {
  std::mt19937 rng(14);
  for (int trial = 0; trial < 5; ++trial) {
    PlanRequest r = RandomRequest(&rng);
    r.accelerator_memory_bytes = ModelStateBytes(r.profile) / 2;
    r.strategy = tandem::v1::STRATEGY_AUTO;
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_TRUE(response.ok());
    double fastest = HUGE_VAL;
    for (const tandem::v1::Plan& p : response->alternatives()) {
      if (p.feasible()) fastest = std::min(fastest, p.prediction().iteration_seconds());
    }
    ASSERT_TRUE(response->plan().feasible());
    EXPECT_EQ(response->plan().prediction().iteration_seconds(), fastest);
    EXPECT_EQ(response->plan().solver().note().rfind("auto: chose", 0), 0u);
  }
}

TEST(SolvePlanTest, WithoutAnAcceleratorOnlyCpuOnlyFits) {
  PlanRequest r;
  r.profile = testing::MlpProfile({64, 64, 10}, 8);
  r.hardware = SmallNode(/*accelerators=*/0);
  absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->plan().strategy(), tandem::v1::STRATEGY_CPU_ONLY);
  EXPECT_TRUE(response->plan().feasible());
  for (const tandem::v1::Plan& p : response->alternatives()) {
    EXPECT_EQ(p.feasible(), p.strategy() == tandem::v1::STRATEGY_CPU_ONLY);
  }
}

TEST(SolvePlanTest, BadRequestsNameTheField) {
  PlanRequest good;
  good.profile = testing::MlpProfile({64, 64, 10}, 8);
  good.hardware = SmallNode();
  ASSERT_TRUE(SolvePlan(good).ok());
  struct Case {
    std::function<void(PlanRequest*)> mutate;
    const char* field;
  };
  const Case cases[] = {
      {[](PlanRequest* r) { r->batch_size = -1; }, "batch_size"},
      {[](PlanRequest* r) { r->micro_batch_size = 3; }, "micro_batch_size"},
      {[](PlanRequest* r) { r->accelerator_memory_bytes = -5; }, "accelerator_memory_bytes"},
      {[](PlanRequest* r) { r->compare = {tandem::v1::STRATEGY_UNSPECIFIED}; }, "compare[0]"},
      {[](PlanRequest* r) { r->pipeline_devices = 4; }, "pipeline_devices"},
      {[](PlanRequest* r) { r->profile.mutable_layers(2)->set_backward_flops(-1); },
       "profile.layers[2].backward_flops"},
      {[](PlanRequest* r) {
         r->hardware->mutable_host()->set_memory_bandwidth_bytes_per_second(0);
       },
       "hardware.host.memory_bandwidth_bytes_per_second"},
  };
  for (const Case& c : cases) {
    PlanRequest r = good;
    c.mutate(&r);
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
    ASSERT_FALSE(response.ok()) << c.field;
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(response.status().message().rfind(c.field, 0), 0u) << response.status();
  }
}

TEST(SolvePlanTest, PipelineDevicesFillThePlansStages) {
  PlanRequest r;
  r.profile = testing::MlpProfile({512, 512, 512, 512, 512, 10}, 32);
  r.hardware = SmallNode(/*accelerators=*/4);
  r.pipeline_devices = 4;
  r.strategy = tandem::v1::STRATEGY_GPU_ONLY;
  absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(r);
  ASSERT_TRUE(response.ok()) << response.status();
  const tandem::v1::Plan& plan = response->plan();
  ASSERT_EQ(plan.pipeline_size(), 4);
  EXPECT_EQ(plan.pipeline(0).first_layer(), 0);
  EXPECT_EQ(plan.pipeline(3).last_layer(), r.profile.layers_size() - 1);
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(plan.pipeline(i).first_layer(), plan.pipeline(i - 1).last_layer() + 1);
  }
}

TEST(PlanRequestFromRpcTest, TakesTheJobSpecsSettings) {
  tandem::v1::PlanModelRequest rpc;
  rpc.mutable_spec()->mutable_training()->set_batch_size(64);
  rpc.mutable_spec()->mutable_placement()->set_strategy(tandem::v1::STRATEGY_ZERO_OFFLOAD);
  rpc.mutable_spec()->mutable_placement()->set_delayed_parameter_update(true);
  rpc.mutable_spec()->mutable_resources()->set_accelerator_memory_bytes(123);
  *rpc.mutable_hardware() = SmallNode();
  rpc.add_compare(tandem::v1::STRATEGY_GPU_ONLY);
  const tandem::v1::Profile model = testing::MlpProfile({64, 10}, 8);
  absl::StatusOr<PlanRequest> r = PlanRequestFromRpc(rpc, model);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->batch_size, 64);
  EXPECT_EQ(r->strategy, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  EXPECT_TRUE(r->delayed_parameter_update);
  EXPECT_EQ(r->accelerator_memory_bytes, 123);
  ASSERT_TRUE(r->hardware.has_value());
  EXPECT_EQ(r->profile.layers_size(), model.layers_size());
  ASSERT_EQ(r->compare.size(), 1u);
}

}  // namespace
}  // namespace tandem::planner
