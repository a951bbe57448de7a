// Planning a job for this node and running it under the plan: every strategy
// on the emulated accelerator at a quarter of the model state trains to the
// CPU engine's losses within rounding and never exceeds the device's budget;
// gpu_only, which cannot fit there, is refused with the capacity it needs; bad
// placements are refused naming the field; the PlanModel entry point compares
// strategies for this node and for a machine described by a HardwareSpec.
#include "node/placement.h"

#include <cmath>
#include <functional>

#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "node/placement_test_util.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/train/job_model.h"
#include "runtime/train/trainer.h"

namespace tandem::node {
namespace {

using placement_testing::Gpt;
using placement_testing::Mlp;
using placement_testing::ModelStateBytes;
using placement_testing::TestNode;
using placement_testing::Train;
using placement_testing::TrainRun;
using tandem::v1::JobSpec;
using tandem::v1::Strategy;

// The smallest capacity the planner accepts for the spec's strategy.
int64_t MinimumCapacity(const JobSpec& spec, const NodeOffer& node) {
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
  EXPECT_TRUE(resolved.ok());
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  EXPECT_TRUE(jm.ok());
  const int64_t capacity = resolved->resources().accelerator_memory_bytes();
  planner::PlanRequest request;
  request.profile = profile::AnalyticProfile(*jm->model, resolved->optimizer(),
                                             resolved->training().batch_size());
  absl::StatusOr<tandem::v1::HardwareSpec> hw = NodeHardware(*resolved, node, capacity);
  EXPECT_TRUE(hw.ok());
  request.hardware = *hw;
  request.strategy = resolved->placement().strategy();
  request.compare = {request.strategy};
  absl::StatusOr<tandem::v1::PlanModelResponse> answer =
      SolveForExecutor(*jm->model, request, capacity);
  EXPECT_TRUE(answer.ok()) << answer.status();
  return answer.ok() ? answer->plan().min_accelerator_memory_bytes() : 0;
}

// Each strategy at a quarter of the model state, 50 steps, against the CPU
// engine. A strategy whose plans cannot fit there (gpu_only keeps everything
// on the device) must be refused with the capacity it needs, and then run at
// that capacity.
void EveryStrategyAtAQuarter(JobSpec (*make)(Strategy, int64_t, int)) {
  constexpr int kSteps = 50;
  const int64_t capacity = ModelStateBytes(make(tandem::v1::STRATEGY_AUTO, 1, kSteps)) / 4;
  JobSpec cpu_spec = make(tandem::v1::STRATEGY_CPU_ONLY, 0, kSteps);
  cpu_spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_NONE);
  const TrainRun reference = Train(cpu_spec, nullptr);
  ASSERT_TRUE(reference.status.ok()) << reference.status;
  ASSERT_EQ(reference.losses.size(), size_t{kSteps});

  const NodeOffer node = TestNode();
  for (Strategy s : {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                     tandem::v1::STRATEGY_REUSE_DISTANCE, tandem::v1::STRATEGY_HETERO_DP,
                     tandem::v1::STRATEGY_CPU_ONLY, tandem::v1::STRATEGY_AUTO}) {
    SCOPED_TRACE(tandem::v1::Strategy_Name(s));
    JobSpec spec = make(s, capacity, kSteps);
    TrainRun run = Train(spec, MakeRunnerFactory(node));
    std::printf("%-24s at %lld bytes (25%% of the state): %s\n",
                tandem::v1::Strategy_Name(s).c_str(), static_cast<long long>(capacity),
                run.status.ok() ? "trains" : std::string(run.status.message()).c_str());
    if (!run.status.ok()) {
      ASSERT_EQ(run.status.code(), absl::StatusCode::kResourceExhausted) << run.status;
      EXPECT_NE(run.status.message().find("it needs at least"), std::string::npos) << run.status;
      const int64_t needed = MinimumCapacity(spec, node);
      ASSERT_GT(needed, capacity);
      spec.mutable_resources()->set_accelerator_memory_bytes(needed);
      run = Train(spec, MakeRunnerFactory(node));
      std::printf("%-24s at %lld bytes (its minimum): %s\n", tandem::v1::Strategy_Name(s).c_str(),
                  static_cast<long long>(needed), run.status.ok() ? "trains" : "refused");
      ASSERT_TRUE(run.status.ok()) << run.status;
    }
    const int64_t budget = spec.resources().accelerator_memory_bytes();
    ASSERT_EQ(run.losses.size(), reference.losses.size());
    // Equal up to the order of sums. hetero_dp splits every batch between
    // the host and the accelerator and adds the two halves' gradients, the
    // most reordering of all: 1.07e-5 by step 49 of the gpt on an AVX2 EPYC
    // (oneDNN avx2 kernels), within 1e-5 on AVX-512 machines.
    const double rtol = s == tandem::v1::STRATEGY_HETERO_DP ? 3e-5 : 1e-5;
    for (size_t i = 0; i < run.losses.size(); ++i) {
      ASSERT_NEAR(run.losses[i], reference.losses[i], rtol * std::abs(reference.losses[i]))
          << "step " << i;
    }
    EXPECT_NEAR(run.eval_loss, reference.eval_loss, rtol * std::abs(reference.eval_loss));
    EXPECT_TRUE(run.plan.feasible());
    EXPECT_LE(run.metrics.peak_accelerator_bytes(), budget);
    if (s != tandem::v1::STRATEGY_AUTO) {
      EXPECT_EQ(run.plan.strategy(), s);
    }
    if (run.plan.strategy() != tandem::v1::STRATEGY_CPU_ONLY) {
      EXPECT_GT(run.metrics.peak_accelerator_bytes(), 0);
      EXPECT_GT(run.metrics.predicted_step_seconds(), 0);
    }
  }
}

TEST(PlacementTest, GptEveryStrategyAtAQuarterOfTheStateMatchesTheCpuEngine) {
  EveryStrategyAtAQuarter(Gpt);
}

TEST(PlacementTest, MlpEveryStrategyAtAQuarterOfTheStateMatchesTheCpuEngine) {
  EveryStrategyAtAQuarter(Mlp);
}

// The largest activations (output and saved tensors) of a layer the plan
// offloads, or 0: what a copy out that runs longer or shorter than the cost
// model says keeps on the device longer or shorter.
int64_t InFlightBytes(const Model& model, const tandem::v1::Plan& plan, int64_t micro_batch) {
  int64_t most = 0;
  for (const tandem::v1::LayerPlan& l : plan.layers()) {
    if (l.activation_policy() != tandem::v1::ACTIVATION_POLICY_OFFLOAD) continue;
    const tandem::Layer& layer = model.layer(l.index());
    most = std::max(most, layer.OutputBytes(micro_batch) + layer.SavedBytes(micro_batch));
  }
  return most;
}

// With memory to spare, the executor's own peak under a plan is the planner's
// predicted peak plus what the executor holds outside the plan's accounting
// (plan_executor.h): for plans that keep activations exactly its transient
// buffers, whatever the timing; for plans that offload, the executor runs the
// planner's schedule, but a copy out that takes longer (or shorter) than the
// cost model says holds a layer's activations longer (or shorter), so the
// peak is within one offloaded layer's activations below, and the margin the
// planner reserves above. So an over-prediction fails the lower bound, and a
// leak fails the upper one: any leak where activations are kept; where they
// are offloaded, one larger than the margin's room for copies in flight
// (printed).
TEST(PlacementTest, TheExecutorsPeakIsThePlannersPlusItsOwnBuffers) {
  const NodeOffer node = TestNode();
  struct Case {
    JobSpec (*make)(Strategy, int64_t, int);
    Strategy strategy;
    double state_fraction;  // of the model state, the planner's budget
  };
  const Case cases[] = {
      {Gpt, tandem::v1::STRATEGY_GPU_ONLY, 2},
      {Gpt, tandem::v1::STRATEGY_ZERO_OFFLOAD, 0.5},
      {Gpt, tandem::v1::STRATEGY_REUSE_DISTANCE, 0.5},
      {Gpt, tandem::v1::STRATEGY_REUSE_DISTANCE, 1},
      {Mlp, tandem::v1::STRATEGY_GPU_ONLY, 2},
      {Mlp, tandem::v1::STRATEGY_ZERO_OFFLOAD, 0.5},
      {Mlp, tandem::v1::STRATEGY_REUSE_DISTANCE, 0.5},
      {Mlp, tandem::v1::STRATEGY_REUSE_DISTANCE, 1},
  };
  for (const Case& c : cases) {
    JobSpec spec = c.make(c.strategy, 0, 3);
    const std::string name = absl::StrCat(spec.model().has_gpt() ? "gpt " : "mlp ",
                                          tandem::v1::Strategy_Name(c.strategy), " at ",
                                          c.state_fraction, " of the state");
    SCOPED_TRACE(name);
    spec.mutable_placement()->set_micro_batch_size(1);
    const int64_t budget = static_cast<int64_t>(ModelStateBytes(spec) * c.state_fraction);
    spec.mutable_resources()->set_accelerator_memory_bytes(budget);
    absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
    ASSERT_TRUE(resolved.ok());
    absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
    ASSERT_TRUE(jm.ok());
    absl::StatusOr<tandem::v1::Plan> plan = PlanJob(*jm->model, *resolved, node);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const int64_t predicted = plan->prediction().accelerator_peak_bytes();
    const int64_t transient = ExecutorTransientBytes(*jm->model, 1);
    const int64_t in_flight = InFlightBytes(*jm->model, *plan, 1);
    const int64_t margin = ExecutorMemoryMargin(*jm->model, 1);
    // The same plan, forced, on a device ten times larger.
    *spec.mutable_placement()->mutable_plan() = *plan;
    spec.mutable_resources()->set_accelerator_memory_bytes(budget * 10);
    const TrainRun run = Train(spec, MakeRunnerFactory(node));
    ASSERT_TRUE(run.status.ok()) << run.status;
    const int64_t peak = run.metrics.peak_accelerator_bytes();
    // The planner counts tensors in bytes, the executor's allocator in
    // 64-byte slices: under 64 bytes either way for each tensor live at the
    // peak (a layer's output each, the input, targets and two gradients).
    const int64_t rounding = 64 * (jm->model->num_layers() + 4);
    std::printf(
        "%-44s predicted %9lld + transient %6lld = %9lld (copy in flight %6lld); "
        "executor peak %9lld; a leak over %lld bytes fails\n",
        name.c_str(), static_cast<long long>(predicted), static_cast<long long>(transient),
        static_cast<long long>(predicted + transient), static_cast<long long>(in_flight),
        static_cast<long long>(peak),
        static_cast<long long>(in_flight > 0 ? predicted + margin - peak
                                             : predicted + transient + rounding - peak));
    EXPECT_GE(peak, predicted + transient - in_flight - rounding);
    if (in_flight == 0) {
      EXPECT_NEAR(peak, predicted + transient, rounding);
    } else {
      EXPECT_LE(peak, predicted + margin);
    }
  }
}

// A job runs the plan it was admitted with; only when its capacity has since
// shrunk below what that plan needs (tandemd restarted with a smaller budget)
// is it planned again, for the capacity it has now.
TEST(PlacementTest, AStoredPlanRunsAsItIsUnlessItNoLongerFits) {
  const NodeOffer node = TestNode();
  JobSpec spec = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, 0, 3);
  const int64_t state = ModelStateBytes(spec);
  spec.mutable_resources()->set_accelerator_memory_bytes(2 * state);
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok());
  absl::StatusOr<tandem::v1::Plan> stored = PlanJob(*jm->model, *resolved, node);
  ASSERT_TRUE(stored.ok()) << stored.status();

  const TrainRun same = Train(spec, MakeRunnerFactory(node, *stored));
  ASSERT_TRUE(same.status.ok()) << same.status;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(same.plan, *stored));

  spec.mutable_resources()->set_accelerator_memory_bytes(state / 2);
  const TrainRun smaller = Train(spec, MakeRunnerFactory(node, *stored));
  ASSERT_TRUE(smaller.status.ok()) << smaller.status;
  EXPECT_FALSE(google::protobuf::util::MessageDifferencer::Equals(smaller.plan, *stored));
  EXPECT_LT(smaller.plan.prediction().accelerator_peak_bytes(),
            stored->prediction().accelerator_peak_bytes());
  EXPECT_LE(smaller.metrics.peak_accelerator_bytes(), state / 2);
}

TEST(PlacementTest, GpuOnlyThatCannotFitIsRefusedWithTheCapacityItNeeds) {
  const int64_t capacity = ModelStateBytes(Gpt(tandem::v1::STRATEGY_AUTO, 1)) / 4;
  const TrainRun run =
      Train(Gpt(tandem::v1::STRATEGY_GPU_ONLY, capacity), MakeRunnerFactory(TestNode()));
  ASSERT_EQ(run.status.code(), absl::StatusCode::kResourceExhausted) << run.status;
  EXPECT_NE(run.status.message().find("placement.strategy: no gpu_only plan fits"),
            std::string::npos)
      << run.status;
  EXPECT_NE(run.status.message().find("it needs at least"), std::string::npos) << run.status;

  // With what it asked for, it plans and trains.
  absl::StatusOr<JobSpec> resolved =
      ResolveJobSpec(Gpt(tandem::v1::STRATEGY_GPU_ONLY, capacity), false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok());
  const NodeOffer node = TestNode();
  absl::StatusOr<tandem::v1::Plan> refused = PlanJob(*jm->model, *resolved, node);
  ASSERT_FALSE(refused.ok());
  planner::PlanRequest request;
  request.profile = profile::AnalyticProfile(*jm->model, resolved->optimizer(), 8);
  absl::StatusOr<tandem::v1::HardwareSpec> hw = NodeHardware(*resolved, node, capacity);
  ASSERT_TRUE(hw.ok());
  request.hardware = *hw;
  request.strategy = tandem::v1::STRATEGY_GPU_ONLY;
  request.compare = {tandem::v1::STRATEGY_GPU_ONLY};
  absl::StatusOr<tandem::v1::PlanModelResponse> answer =
      SolveForExecutor(*jm->model, request, capacity);
  ASSERT_TRUE(answer.ok()) << answer.status();
  const int64_t needed = answer->plan().min_accelerator_memory_bytes();
  ASSERT_GT(needed, capacity);
  const TrainRun enough =
      Train(Gpt(tandem::v1::STRATEGY_GPU_ONLY, needed), MakeRunnerFactory(node));
  ASSERT_TRUE(enough.status.ok()) << enough.status;
  EXPECT_LE(enough.metrics.peak_accelerator_bytes(), needed);
}

TEST(PlacementTest, BadPlacementsNameTheField) {
  NodeOffer node = TestNode();
  JobSpec no_capacity = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, 0);
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(no_capacity, false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<int64_t> capacity = AcceleratorCapacity(*resolved, node);
  EXPECT_EQ(capacity.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(capacity.status().message().find("resources.accelerator_memory_bytes"),
            std::string::npos);
  node.accelerator_memory_budget_bytes = int64_t{64} << 20;
  capacity = AcceleratorCapacity(*resolved, node);
  ASSERT_TRUE(capacity.ok());
  EXPECT_EQ(*capacity, int64_t{64} << 20);

  JobSpec cuda = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, 0);
  cuda.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_CUDA);
  resolved = ResolveJobSpec(cuda, false);
  ASSERT_TRUE(resolved.ok());
  capacity = AcceleratorCapacity(*resolved, TestNode());
  EXPECT_EQ(capacity.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(capacity.status().message().find("placement.accelerator"), std::string::npos);

  // A forced plan for another model.
  JobSpec forced = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{64} << 20);
  forced.mutable_placement()->mutable_plan()->add_layers();
  resolved = ResolveJobSpec(forced, false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok());
  absl::StatusOr<tandem::v1::Plan> plan = PlanJob(*jm->model, *resolved, TestNode());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("placement.plan.layers"), std::string::npos);
}

TEST(PlacementTest, AForcedPlanIsCheckedFieldByFieldBeforeTheJobIsAccepted) {
  const JobSpec spec = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{64} << 20);
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok());
  absl::StatusOr<tandem::v1::Plan> solved = PlanJob(*jm->model, *resolved, TestNode());
  ASSERT_TRUE(solved.ok()) << solved.status();
  auto plan_with = [&](const std::function<void(tandem::v1::Plan&)>& edit) {
    JobSpec forced = *resolved;
    tandem::v1::Plan* p = forced.mutable_placement()->mutable_plan();
    *p = *solved;
    edit(*p);
    return PlanJob(*jm->model, forced, TestNode()).status();
  };
  EXPECT_TRUE(plan_with([](tandem::v1::Plan&) {}).ok());
  const std::vector<std::pair<std::function<void(tandem::v1::Plan&)>, std::string>> cases = {
      {[](auto& p) { p.set_strategy(static_cast<tandem::v1::Strategy>(77)); }, "plan.strategy"},
      {[](auto& p) { p.set_strategy(tandem::v1::STRATEGY_AUTO); }, "plan.strategy"},
      {[](auto& p) { p.set_micro_batch_size(0); }, "plan.micro_batch_size"},
      {[](auto& p) { p.set_micro_batch_size(1 << 30); }, "plan.micro_batch_size"},
      {[](auto& p) { p.set_batch_size(3); }, "plan.batch_size"},
      {[](auto& p) { p.set_host_update_threads(1000000); }, "plan.host_update_threads"},
      {[](auto& p) { p.set_accelerator_batch_share(-1); }, "plan.accelerator_batch_share"},
      {[](auto& p) { p.set_accelerator(static_cast<tandem::v1::DeviceKind>(9)); },
       "plan.accelerator"},
      {[](auto& p) { p.add_pipeline(); }, "plan.pipeline"},
      {[](auto& p) { p.mutable_layers(1)->set_compute(static_cast<tandem::v1::Placement>(5)); },
       "plan.layers[1].compute"},
      {[](auto& p) { p.mutable_layers(2)->set_update(tandem::v1::PLACEMENT_UNSPECIFIED); },
       "plan.layers[2].update"},
      {[](auto& p) {
         p.mutable_layers(0)->set_parameter_home(tandem::v1::PARAMETER_HOME_UNSPECIFIED);
       },
       "plan.layers[0].parameter_home"},
      {[](auto& p) {
         p.mutable_layers(0)->set_activation_policy(static_cast<tandem::v1::ActivationPolicy>(40));
       },
       "plan.layers[0].activation_policy"},
  };
  for (const auto& [edit, field] : cases) {
    const absl::Status s = plan_with(edit);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field << ": " << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  }
  // An accelerator plan for a job without an accelerator.
  JobSpec cpu = *resolved;
  *cpu.mutable_placement()->mutable_plan() = *solved;
  cpu.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_NONE);
  const absl::Status s = PlanJob(*jm->model, cpu, TestNode()).status();
  EXPECT_NE(s.message().find("needs placement.accelerator"), std::string::npos) << s;
}

// Two ranks of a job on one node with two emulated accelerators share its two
// cores: each plans its host work (and its accelerator's compute) on one, and
// so predicts a slower step than a rank alone on such a node.
TEST(PlacementTest, RanksSharingANodePlanOnTheirPartOfItsCores) {
  JobSpec spec = Gpt(tandem::v1::STRATEGY_ZERO_OFFLOAD, int64_t{64} << 20);
  spec.mutable_distributed()->set_replicas(2);
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok()) << jm.status();
  NodeOffer alone = TestNode(), shared = TestNode();
  shared.emulated_accelerators = 2;
  EXPECT_EQ(RanksSharingHost(*resolved, alone), 1);
  EXPECT_EQ(RanksSharingHost(*resolved, shared), 2);
  absl::StatusOr<tandem::v1::Plan> a = RankPlan(*jm->model, *resolved, alone, 2);
  absl::StatusOr<tandem::v1::Plan> b = RankPlan(*jm->model, *resolved, shared, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->host_update_threads(), 2);
  EXPECT_EQ(b->host_update_threads(), 1);
  EXPECT_GT(b->timeline().iteration_seconds(), 1.2 * a->timeline().iteration_seconds());
  // On the CPU engine a rank has a node to itself.
  JobSpec cpu = *resolved;
  cpu.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_NONE);
  EXPECT_EQ(RanksSharingHost(cpu, shared), 1);
  // Half a processor: half its threads, and the rates those reach.
  const tandem::v1::ProcessorSpec half = OnThreads(alone.host, 1);
  EXPECT_EQ(half.threads(), 1);
  EXPECT_LT(half.peak_matmul_flops_per_second(), alone.host.peak_matmul_flops_per_second());
  EXPECT_EQ(OnThreads(alone.host, 0).SerializeAsString(), alone.host.SerializeAsString());
}

TEST(PlacementTest, CpuJobsRunOnThePlainEngine) {
  JobSpec spec = Gpt(tandem::v1::STRATEGY_UNSPECIFIED, 0);
  spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_NONE);
  const TrainRun run = Train(spec, MakeRunnerFactory(TestNode()));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.plan.layers_size(), 0);
  EXPECT_EQ(run.metrics.peak_accelerator_bytes(), 0);
}

// With a node profile, the planner's figures are the measured ones: the
// host's GEMM and triad rates, Adam's rate as the optimizer efficiency, the
// emulated link at the measured memcpy rate, a CUDA link at its measured
// pinned bandwidth and latency (not the 50 GB/s assumed for Hopper).
TEST(PlacementTest, ANodeProfilesMeasuredFiguresReplaceTheAssumedOnes) {
  tandem::v1::NodeProfile profile;
  tandem::v1::DeviceProfile* cpu = profile.add_devices();
  cpu->set_id("cpu");
  cpu->set_kind(tandem::v1::DEVICE_KIND_CPU);
  cpu->set_threads(2);
  cpu->set_memory_bytes(int64_t{24} << 30);
  cpu->set_gemm_flops_per_second(200e9);
  cpu->set_bf16_gemm_flops_per_second(450e9);
  cpu->set_single_thread_gemm_flops_per_second(125e9);
  cpu->set_memory_bandwidth_bytes_per_second(28e9);
  profile.set_host_memcpy_bytes_per_second(7e9);
  profile.set_host_adam_parameters_per_second(0.5e9);  // 14 GB/s of Adam traffic
  for (auto [direction, bandwidth] : {std::pair{tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, 40e9},
                                      std::pair{tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, 30e9}}) {
    for (bool pinned : {true, false}) {
      tandem::v1::LinkProfile* link = profile.add_links();
      link->set_direction(direction);
      link->set_pinned(pinned);
      link->set_from_device_id(direction == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE ? "cpu"
                                                                                      : "cuda:0");
      link->set_to_device_id(direction == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE ? "cuda:0"
                                                                                    : "cpu");
      link->set_bandwidth_bytes_per_second(pinned ? bandwidth : bandwidth / 5);
      link->set_latency_seconds(pinned ? 12e-6 : 40e-6);
    }
  }
  const cuda::CudaDeviceInfo h100{0, "NVIDIA H100 80GB HBM3", int64_t{80} << 30, 132, 9, 0};
  const NodeOffer node = NodeOfferFromProfile(profile, 0, {h100});
  EXPECT_EQ(node.host.peak_matmul_flops_per_second(), 200e9);
  // bf16 products (a bf16 job's, planner/precision.h MatmulPeak) at the
  // measured bf16 rate, also on the emulated accelerator made of the host.
  EXPECT_EQ(node.host.peak_bf16_matmul_flops_per_second(), 450e9);
  EXPECT_NE(node.host.name().find("bf16 GEMM 450 GFLOP/s"), std::string::npos) << node.host.name();
  EXPECT_EQ(node.host.memory_bandwidth_bytes_per_second(), 28e9);
  EXPECT_DOUBLE_EQ(node.host.efficiency().at("optimizer"), 0.5);

  JobSpec emulated = Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE, 64 << 20);
  absl::StatusOr<tandem::v1::HardwareSpec> hw = NodeHardware(emulated, node, 64 << 20);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->host_to_accelerator().bandwidth_bytes_per_second(), 7e9);
  EXPECT_EQ(hw->accelerators(0).peak_bf16_matmul_flops_per_second(), 450e9);
  EXPECT_EQ(hw->accelerators(0).threads(), 2);
  // A job of one thread: its emulated accelerator computes at one thread's
  // rate (2 threads reach 1.6 times it), its bandwidth taken alike.
  EXPECT_EQ(node.host.single_thread_matmul_flops_per_second(), 125e9);
  JobSpec one_thread = emulated;
  one_thread.mutable_training()->set_threads(1);
  hw = NodeHardware(one_thread, node, 64 << 20);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->accelerators(0).threads(), 1);
  EXPECT_DOUBLE_EQ(hw->accelerators(0).peak_matmul_flops_per_second(), 125e9);
  EXPECT_DOUBLE_EQ(hw->accelerators(0).memory_bandwidth_bytes_per_second(), 28e9 / 1.6);
  EXPECT_DOUBLE_EQ(hw->host().peak_matmul_flops_per_second(), 200e9);

  JobSpec on_gpu = emulated;
  on_gpu.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_CUDA);
  hw = NodeHardware(on_gpu, node, int64_t{40} << 30);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->host_to_accelerator().bandwidth_bytes_per_second(), 40e9);
  EXPECT_EQ(hw->accelerator_to_host().bandwidth_bytes_per_second(), 30e9);
  EXPECT_EQ(hw->host_to_accelerator().latency_seconds(), 12e-6);
  // Without a profile: the assumed Hopper link.
  NodeOffer assumed = node;
  assumed.profile.reset();
  hw = NodeHardware(on_gpu, assumed, int64_t{40} << 30);
  ASSERT_TRUE(hw.ok()) << hw.status();
  EXPECT_EQ(hw->host_to_accelerator().bandwidth_bytes_per_second(), 50e9);
}

// `tandem plan` resolves a spec without threads as tandemd resolves the
// job (ResolveUnsetThreads): planned and looked up in the measured-profile
// cache on --job_threads, or on all cores without it.
TEST(PlacementTest, PlanModelResolvesUnsetThreadsAsTheJobWouldRun) {
  tandem::v1::PlanModelRequest here;
  *here.mutable_spec() = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{1} << 20);
  here.mutable_spec()->mutable_training()->clear_threads();
  int looked_up = -1;
  PlanModelContext context;
  context.measured = [&](const Model&, const tandem::v1::JobSpec& resolved) {
    looked_up = resolved.training().threads();
    return std::optional<tandem::v1::Profile>();
  };
  context.job_threads = 1;
  ASSERT_TRUE(PlanModel(here, TestNode(), context).ok());
  EXPECT_EQ(looked_up, 1);
  context.job_threads = 0;
  ASSERT_TRUE(PlanModel(here, TestNode(), context).ok());
  EXPECT_EQ(looked_up, 0);
  here.mutable_spec()->mutable_training()->set_threads(2);
  context.job_threads = 1;
  ASSERT_TRUE(PlanModel(here, TestNode(), context).ok());
  EXPECT_EQ(looked_up, 2);
  JobSpec spec;
  ResolveUnsetThreads(3, spec);
  EXPECT_EQ(spec.training().threads(), 3);
  ResolveUnsetThreads(5, spec);
  EXPECT_EQ(spec.training().threads(), 3);
}

TEST(PlacementTest, PlanModelComparesStrategiesHereAndForADescribedMachine) {
  tandem::v1::PlanModelRequest here;
  *here.mutable_spec() = Gpt(tandem::v1::STRATEGY_AUTO, int64_t{1} << 20);
  absl::StatusOr<tandem::v1::PlanModelResponse> local = PlanModel(here, TestNode());
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->alternatives_size(), 5);
  EXPECT_TRUE(local->plan().feasible());
  EXPECT_NE(local->plan().solver().note().find("auto: chose"), std::string::npos);

  // An 80 GiB GPU machine: everything fits, gpu_only among the feasible.
  tandem::v1::PlanModelRequest remote;
  *remote.mutable_spec() = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, 0);
  remote.mutable_spec()->mutable_placement()->clear_accelerator();
  tandem::v1::HardwareSpec* hw = remote.mutable_hardware();
  *hw->mutable_host() = TestNode().host;
  cuda::CudaDeviceInfo h100{0, "NVIDIA H100 80GB HBM3", int64_t{80} << 30, 132, 9, 0};
  *hw->add_accelerators() = AcceleratorSpec(h100);
  hw->mutable_host_to_accelerator()->set_bandwidth_bytes_per_second(50e9);
  hw->mutable_accelerator_to_host()->set_bandwidth_bytes_per_second(50e9);
  absl::StatusOr<tandem::v1::PlanModelResponse> answer = PlanModel(remote, TestNode());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->plan().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
  for (const auto& p : answer->alternatives()) {
    EXPECT_TRUE(p.feasible()) << tandem::v1::Strategy_Name(p.strategy());
  }
  EXPECT_EQ(AcceleratorSpec(h100).peak_matmul_flops_per_second(), 494.7e12);

  tandem::v1::PlanModelRequest bad = here;
  bad.mutable_spec()->mutable_training()->set_batch_size(0);
  answer = PlanModel(bad, TestNode());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answer.status().message().find("spec.training.batch_size"), std::string::npos)
      << answer.status();

  // A profile of another model (one layer fewer than the spec's).
  tandem::v1::PlanModelRequest other = here;
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(here.spec(), false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved);
  ASSERT_TRUE(jm.ok()) << jm.status();
  tandem::v1::Profile profile = profile::AnalyticProfile(*jm->model, resolved->optimizer(),
                                                         resolved->training().batch_size());
  profile.mutable_layers()->RemoveLast();
  *other.mutable_profile() = profile;
  answer = PlanModel(other, TestNode());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answer.status().message().find("profile.layers: "), std::string::npos)
      << answer.status();
  EXPECT_NE(answer.status().message().find("a profile of another model"), std::string::npos)
      << answer.status();
}

// Planned for this node in bf16, a model is laid out as a bf16 job runs here:
// fp32 tensors between layers, bf16 working copies of weights and gradients,
// and in each layer's workspace its bf16 operand copies and the fp32 staging
// of its weights and gradient (8 bytes per parameter, whatever the
// micro-batch). Where this CPU has no native bf16 the request is refused as
// such a job would be.
TEST(PlacementTest, PlanModelHereInBf16PlansTheLayoutABf16JobRuns) {
  tandem::v1::PlanModelRequest fp32;
  *fp32.mutable_spec() = Gpt(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{1} << 20);
  fp32.mutable_spec()->set_precision(tandem::v1::PRECISION_FP32);
  tandem::v1::PlanModelRequest bf16 = fp32;
  bf16.mutable_spec()->set_precision(tandem::v1::PRECISION_BF16);
  absl::StatusOr<tandem::v1::PlanModelResponse> a = PlanModel(fp32, TestNode());
  absl::StatusOr<tandem::v1::PlanModelResponse> b = PlanModel(bf16, TestNode());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->precision(), tandem::v1::PRECISION_FP32);
  const LocalCompute here = LocalComputeFor(bf16.spec());
  if (!NativeBf16Isa(here.onednn_isa)) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    EXPECT_NE(b.status().message().find("spec.precision: "), std::string::npos) << b.status();
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->precision(), tandem::v1::PRECISION_BF16);
  EXPECT_NE(b->precision_reason().find("Planned as it runs here"), std::string::npos)
      << b->precision_reason();
  EXPECT_NE(b->precision_reason().find("bf16 working copies"), std::string::npos)
      << b->precision_reason();
  ASSERT_EQ(b->plan().layers_size(), a->plan().layers_size());
  int with_weights = 0;
  int64_t activations16 = 0, activations32 = 0;
  for (int l = 0; l < a->plan().layers_size(); ++l) {
    activations16 += b->plan().layers(l).accelerator_memory().activation_bytes();
    activations32 += a->plan().layers(l).accelerator_memory().activation_bytes();
    const tandem::v1::LayerMemory& m32 = a->plan().layers(l).accelerator_memory();
    const tandem::v1::LayerMemory& m16 = b->plan().layers(l).accelerator_memory();
    if (m32.parameter_bytes() == 0) continue;
    ++with_weights;
    EXPECT_EQ(2 * m16.parameter_bytes(), m32.parameter_bytes()) << l;
    EXPECT_EQ(2 * m16.gradient_bytes(), m32.gradient_bytes()) << l;
    EXPECT_GE(m16.workspace_bytes(), m32.workspace_bytes() + 2 * m32.parameter_bytes()) << l;
  }
  EXPECT_GT(with_weights, 0);
  // bf16 layers save their products' inputs in bf16 (transformer blocks keep
  // them in place of fp32 activations).
  EXPECT_LT(activations16, activations32);
}

}  // namespace
}  // namespace tandem::node
