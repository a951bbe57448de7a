// Closed-loop planning's pieces on synthetic measurements: the check against a
// plan's prediction, the layer profile built from measured spans (and what it
// fills in), the loop's decisions (re-calibrate, switch, switch back, stop)
// and the measured-profile cache (reused; another node's or a damaged file
// ignored). The whole loop on a running job, and a throttled link re-planned,
// are tests/e2e/closed_loop_test.py.
#include "node/closed_loop.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "node/placement_test_util.h"
#include "planner/cost_model.h"
#include "runtime/train/job_model.h"
#include "spec/job_spec.h"

namespace tandem::node {
namespace {

using placement_testing::Mlp;
using placement_testing::ModelStateBytes;
using placement_testing::TestNode;
using tandem::v1::JobSpec;
using tandem::v1::Plan;
using tandem::v1::Timeline;

constexpr auto kAccel = tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
constexpr auto kH2D = tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
constexpr auto kD2H = tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
constexpr auto kHostUpdate = tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE;

void AddSpan(Timeline& t, tandem::v1::TimelineResource resource, int layer,
             tandem::v1::TimelinePhase phase, double start, double seconds, int64_t bytes = 0) {
  auto* s = t.add_spans();
  s->set_resource(resource);
  s->set_layer(layer);
  s->set_phase(phase);
  s->set_start_seconds(start);
  s->set_end_seconds(start + seconds);
  s->set_bytes(bytes);
}

// Every span of `t` `factor` times as long.
Timeline Scaled(const Timeline& t, double factor) {
  Timeline out = t;
  for (auto& s : *out.mutable_spans()) {
    s.set_start_seconds(s.start_seconds() * factor);
    s.set_end_seconds(s.end_seconds() * factor);
  }
  return out;
}

Plan PredictedPlan(double step, double accel_busy) {
  Plan plan;
  plan.mutable_prediction()->set_iteration_seconds(step);
  AddSpan(*plan.mutable_timeline(), kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, accel_busy);
  return plan;
}

TEST(CheckPlanTest, StepTimeWithinAndOffTheThreshold) {
  const Plan plan = PredictedPlan(0.100, 0.080);
  Timeline measured;
  AddSpan(measured, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.082);
  PlanCheck ok = CheckPlan(plan, {0.104, 0.108, 0.101}, {measured}, 0.10);
  EXPECT_EQ(ok.off, tandem::v1::REPLAN_REASON_UNSPECIFIED) << ok.because;
  EXPECT_DOUBLE_EQ(ok.measured_step_seconds, 0.104);  // the median
  PlanCheck slow = CheckPlan(plan, {0.115, 0.12, 0.2}, {measured}, 0.10);
  EXPECT_EQ(slow.off, tandem::v1::REPLAN_REASON_STEP_TIME);
  EXPECT_NE(slow.because.find("120.0 ms measured, 100.0 ms predicted (+20.0%)"), std::string::npos)
      << slow.because;
  PlanCheck fast = CheckPlan(plan, {0.085}, {measured}, 0.10);
  EXPECT_EQ(fast.off, tandem::v1::REPLAN_REASON_STEP_TIME);
  // A wider threshold accepts it; a negative one compares with its size.
  EXPECT_EQ(CheckPlan(plan, {0.085}, {measured}, 0.2).off, tandem::v1::REPLAN_REASON_UNSPECIFIED);
  EXPECT_EQ(CheckPlan(plan, {0.085}, {measured}, -0.1).off, tandem::v1::REPLAN_REASON_STEP_TIME);
}

TEST(CheckPlanTest, AResourceBusierThanPredictedWhileTheStepIsRight) {
  const Plan plan = PredictedPlan(0.100, 0.080);
  Timeline measured;
  AddSpan(measured, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.081);
  AddSpan(measured, kH2D, 0, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, 0, 0.030, 1 << 20);
  PlanCheck check = CheckPlan(plan, {0.1}, {measured}, 0.10);
  EXPECT_EQ(check.off, tandem::v1::REPLAN_REASON_RESOURCE_BUSY);
  EXPECT_NE(check.because.find("copy_h2d busy 30.0 ms"), std::string::npos) << check.because;
  ASSERT_EQ(check.resources.size(), 2u);
}

TEST(CheckPlanTest, OneStalledStepDoesNotMakeAResourceBusy) {
  const Plan plan = PredictedPlan(0.100, 0.080);
  Timeline usual, stalled;
  AddSpan(usual, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.081);
  AddSpan(stalled, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.400);
  // The window's median step is as predicted, and so is the accelerator's
  // median busy time: the one step that stalled is left out of both.
  PlanCheck check =
      CheckPlan(plan, {0.1, 0.1, 0.45, 0.1, 0.1}, {usual, usual, stalled, usual, usual}, 0.10);
  EXPECT_EQ(check.off, tandem::v1::REPLAN_REASON_UNSPECIFIED) << check.because;
  ASSERT_EQ(check.resources.size(), 1u);
  EXPECT_NEAR(check.resources[0].measured_seconds, 0.081, 1e-12);
  // Busy in most steps: still busy. A copy engine idle in most steps: not.
  Timeline copying = usual;
  AddSpan(copying, kH2D, 0, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, 0, 0.030, 1 << 20);
  check = CheckPlan(plan, {0.1, 0.1, 0.1}, {copying, copying, usual}, 0.10);
  EXPECT_EQ(check.off, tandem::v1::REPLAN_REASON_RESOURCE_BUSY);
  check = CheckPlan(plan, {0.1, 0.1, 0.1}, {usual, copying, usual}, 0.10);
  EXPECT_EQ(check.off, tandem::v1::REPLAN_REASON_UNSPECIFIED) << check.because;
}

TEST(SamePlacementTest, EveryDecisionCounts) {
  JobSpec spec = Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE, 0);
  spec.mutable_resources()->set_accelerator_memory_bytes(ModelStateBytes(spec) / 2);
  absl::StatusOr<JobModel> jm = BuildJobModel(spec, nullptr);
  ASSERT_TRUE(jm.ok()) << jm.status();
  absl::StatusOr<Plan> plan = PlanJob(*jm->model, spec, TestNode());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(SamePlacement(*plan, *plan));
  Plan other = *plan;
  other.mutable_prediction()->set_iteration_seconds(123);  // predictions do not count
  EXPECT_TRUE(SamePlacement(*plan, other));
  other = *plan;
  other.set_micro_batch_size(plan->micro_batch_size() + 1);
  EXPECT_FALSE(SamePlacement(*plan, other));
  other = *plan;
  other.mutable_layers(1)->set_update(other.layers(1).update() == tandem::v1::PLACEMENT_HOST
                                          ? tandem::v1::PLACEMENT_ACCELERATOR
                                          : tandem::v1::PLACEMENT_HOST);
  EXPECT_FALSE(SamePlacement(*plan, other));
  other = *plan;
  other.mutable_layers(1)->set_update(tandem::v1::PLACEMENT_ACCELERATOR);
  other.mutable_layers(1)->set_stream_optimizer_state(!plan->layers(1).stream_optimizer_state());
  EXPECT_FALSE(SamePlacement(*plan, other));
  other = *plan;
  other.set_state_update_lag(plan->state_update_lag() + 1);
  EXPECT_FALSE(SamePlacement(*plan, other));
  other = *plan;
  other.set_state_prefetch_layers(std::max(1, plan->state_prefetch_layers()) + 1);
  EXPECT_FALSE(SamePlacement(*plan, other));
  other = *plan;
  other.mutable_layers(0)->set_activation_policy(tandem::v1::ACTIVATION_POLICY_RECOMPUTE);
  EXPECT_EQ(SamePlacement(*plan, other),
            plan->layers(0).activation_policy() == tandem::v1::ACTIVATION_POLICY_RECOMPUTE);
}

// An MLP planned on the test node, and timelines of its steps with known
// span durations.
class MeasuredProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE, 0);
    spec_.mutable_resources()->set_accelerator_memory_bytes(ModelStateBytes(spec_) / 2);
    absl::StatusOr<JobModel> jm = BuildJobModel(spec_, nullptr);
    ASSERT_TRUE(jm.ok()) << jm.status();
    jm_ = *std::move(jm);
    absl::StatusOr<Plan> plan = PlanJob(*jm_.model, spec_, TestNode());
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
  }
  // Every layer's forward 2 ms and backward 3 ms on the accelerator, layer
  // 1's update on the host 5 ms; copies of 1 and 3 MB at 1 GB/s + 0.1 ms.
  Timeline Step() const {
    Timeline t;
    for (int l = 0; l < jm_.model->num_layers(); ++l) {
      AddSpan(t, kAccel, l, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.002);
      AddSpan(t, kAccel, l, tandem::v1::TIMELINE_PHASE_BACKWARD, 0, 0.003);
    }
    AddSpan(t, kHostUpdate, 1, tandem::v1::TIMELINE_PHASE_UPDATE, 0, 0.005);
    for (int64_t mb : {1, 3}) {
      AddSpan(t, kH2D, -1, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, 0, 1e-4 + mb * 1e-3,
              mb * 1000000);
      AddSpan(t, kD2H, -1, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H, 0, 1e-4 + mb * 2e-3,
              mb * 1000000);
    }
    return t;
  }
  JobSpec spec_;
  JobModel jm_;
  Plan plan_;
};

TEST_F(MeasuredProfileTest, MeasuredSpansBecomeTheCostModel) {
  std::string summary;
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {Step(), Step()}, &summary);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->provenance().source(), "measured");
  EXPECT_EQ(profile->batch_size(), plan_.micro_batch_size());
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::FromMeasuredProfile(*profile);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const int m = plan_.micro_batch_size();
  for (int l = 0; l < jm_.model->num_layers(); ++l) {
    EXPECT_NEAR(cost->ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m), 0.002, 1e-12);
    EXPECT_NEAR(cost->BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m), 0.003, 1e-12);
  }
  const int threads = std::max(1, plan_.host_update_threads());
  EXPECT_NEAR(cost->UpdateSeconds(1, tandem::v1::PLACEMENT_HOST, threads), 0.005, 1e-9);
  // The links fitted exactly: latency 0.1 ms, 1 GB/s up and 0.5 GB/s down.
  EXPECT_NEAR(cost->CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, 2000000), 0.0021, 1e-9);
  EXPECT_NEAR(cost->CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, 2000000), 0.0041, 1e-9);
  EXPECT_NE(summary.find("H2D 1.00 GB/s (4 copies)"), std::string::npos) << summary;
}

// hetero_dp's host replica runs its whole share of the batch in one pass, the
// accelerator micro-batches: the profile (at the micro-batch) holds each
// device's spans as at that size, so the planner, scaling to the host's share
// again, predicts the host pass that was measured.
TEST_F(MeasuredProfileTest, HeteroDpHostSpansAreMeasuredAtTheHostsShare) {
  Plan hetero = plan_;
  hetero.set_strategy(tandem::v1::STRATEGY_HETERO_DP);
  const int batch = static_cast<int>(spec_.training().batch_size());
  hetero.set_batch_size(batch);
  hetero.set_micro_batch_size(batch / 8);
  hetero.set_accelerator_batch_share(batch / 4);
  const int host_share = batch - batch / 4;
  Timeline t = Step();
  for (int l = 0; l < jm_.model->num_layers(); ++l) {
    AddSpan(t, tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, l, tandem::v1::TIMELINE_PHASE_FORWARD, 0,
            0.030);
    AddSpan(t, tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, l, tandem::v1::TIMELINE_PHASE_BACKWARD,
            0, 0.060);
  }
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), hetero, {t}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->batch_size(), batch / 8);
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::FromMeasuredProfile(*profile);
  ASSERT_TRUE(cost.ok()) << cost.status();
  for (int l = 0; l < jm_.model->num_layers(); ++l) {
    EXPECT_NEAR(cost->ForwardSeconds(l, tandem::v1::PLACEMENT_HOST, host_share), 0.030, 1e-9);
    EXPECT_NEAR(cost->BackwardSeconds(l, tandem::v1::PLACEMENT_HOST, host_share), 0.060, 1e-9);
    // The accelerator's spans ran at the micro-batch: as measured.
    EXPECT_NEAR(cost->ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, batch / 8), 0.002,
                1e-12);
  }
}

TEST_F(MeasuredProfileTest, PlannerAddsUpMeansSoStallsInEveryStepCount) {
  // Layer 0's forward stalls once in five calls (12 ms instead of 2 ms): the
  // step takes the sum, 5 x the mean (4 ms), not 5 x the median (2 ms).
  Timeline t = Step();
  for (int i = 0; i < 3; ++i) {
    AddSpan(t, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.002);
  }
  AddSpan(t, kAccel, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.012);
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {t}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  EXPECT_EQ(profile->provenance().planning_statistic(), tandem::v1::TIMING_STATISTIC_MEAN);
  const tandem::v1::TimingStats& forward = profile->layers(0).devices(1).forward().timing();
  EXPECT_EQ(forward.samples(), 5);
  EXPECT_NEAR(forward.median_seconds(), 0.002, 1e-12);
  EXPECT_NEAR(forward.mean_seconds(), 0.004, 1e-12);
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::FromMeasuredProfile(*profile);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const int m = plan_.micro_batch_size();
  EXPECT_NEAR(cost->ForwardSeconds(0, tandem::v1::PLACEMENT_ACCELERATOR, m), 0.004, 1e-12);
  // The same profile read as medians (a ProfileModel profile) takes 2 ms.
  tandem::v1::Profile as_median = *profile;
  as_median.mutable_provenance()->clear_planning_statistic();
  cost = planner::CostModel::FromMeasuredProfile(as_median);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_NEAR(cost->ForwardSeconds(0, tandem::v1::PLACEMENT_ACCELERATOR, m), 0.002, 1e-12);

  // A window of five such steps, one of which stalled on every call (50 ms):
  // the stall that recurs in each step counts, the one-off step does not,
  // as the window's median step leaves it out.
  Timeline stalled = t;
  for (auto& span : *stalled.mutable_spans()) {
    if (span.layer() == 0 && span.phase() == tandem::v1::TIMELINE_PHASE_FORWARD) {
      span.set_end_seconds(span.start_seconds() + 0.050);
    }
  }
  profile =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {t, t, stalled, t, t}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  const tandem::v1::TimingStats& window = profile->layers(0).devices(1).forward().timing();
  EXPECT_EQ(window.samples(), 25);
  EXPECT_NEAR(window.mean_seconds(), 0.004, 1e-12);
}

TEST_F(MeasuredProfileTest, UnmeasuredPhasesTakeTheRooflineScaledByTheirDevice) {
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {Step()}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  // No host forward ran: the host's forward is the roofline, scaled by 1 (no
  // host forward measured), and marked as such.
  const auto& host = profile->layers(0).devices(0);
  ASSERT_EQ(host.device_id(), "cpu");
  ASSERT_EQ(host.forward().counters_size(), 1);
  EXPECT_EQ(host.forward().counters(0).name(), "roofline_scaled_by");
  EXPECT_DOUBLE_EQ(host.forward().counters(0).value(), 1.0);
  EXPECT_GT(host.forward().timing().median_seconds(), 0);
  // Layer 0's host update was not measured, layer 1's was: layer 0's is its
  // roofline times layer 1's measured / roofline.
  const auto& accel = profile->layers(1).devices(1);
  EXPECT_EQ(accel.forward().counters_size(), 0);  // measured
  EXPECT_EQ(profile->layers(0).devices(0).update().counters_size(), 1);
}

TEST_F(MeasuredProfileTest, PlanModelPlansFromAMeasuredProfileAndSaysSo) {
  absl::StatusOr<tandem::v1::Profile> measured =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {Step(), Step()}, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_NE(measured->provenance().note().find("layer phases measured"), std::string::npos)
      << measured->provenance().note();
  tandem::v1::PlanModelRequest request;
  *request.mutable_spec() = spec_;
  int lookups = 0;
  PlanModelContext context;
  context.measured = [&](const Model& model, const JobSpec& resolved) {
    ++lookups;
    EXPECT_EQ(model.num_layers(), jm_.model->num_layers());
    EXPECT_EQ(resolved.training().batch_size(), spec_.training().batch_size());
    return std::optional<tandem::v1::Profile>(*measured);
  };
  absl::StatusOr<tandem::v1::PlanModelResponse> from_measured =
      PlanModel(request, TestNode(), context);
  ASSERT_TRUE(from_measured.ok()) << from_measured.status();
  EXPECT_EQ(lookups, 1);
  EXPECT_NE(from_measured->cost_source().find("measured here"), std::string::npos)
      << from_measured->cost_source();
  EXPECT_NE(from_measured->cost_source().find(measured->provenance().note()), std::string::npos);
  // The same plan PlanJob solves from that profile.
  absl::StatusOr<Plan> job_plan = PlanJob(*jm_.model, spec_, TestNode(), &*measured);
  ASSERT_TRUE(job_plan.ok()) << job_plan.status();
  EXPECT_TRUE(SamePlacement(from_measured->plan(), *job_plan));
  EXPECT_DOUBLE_EQ(from_measured->plan().prediction().iteration_seconds(),
                   job_plan->prediction().iteration_seconds());

  // No profile cached: the analytic one, and a different prediction.
  context.measured = [](const Model&, const JobSpec&) {
    return std::optional<tandem::v1::Profile>();
  };
  absl::StatusOr<tandem::v1::PlanModelResponse> analytic = PlanModel(request, TestNode(), context);
  ASSERT_TRUE(analytic.ok()) << analytic.status();
  EXPECT_NE(analytic->cost_source().find("analytic profile"), std::string::npos);
  EXPECT_NE(analytic->plan().prediction().iteration_seconds(),
            from_measured->plan().prediction().iteration_seconds());
}

// A pipeline spec planned on the server from a profile measured on one of
// the node's accelerators: the stages each on an accelerator like it, within
// each stage's room for its transients, as PlanJob plans the job (until
// 2026-11-29 it answered INVALID_ARGUMENT, 2 stages exceeding the profile's
// one accelerator, and planned without the stages' inputs in flight).
TEST_F(MeasuredProfileTest, PlanModelPlansAPipelineAsPlanJobDoes) {
  absl::StatusOr<tandem::v1::Profile> measured =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {Step(), Step()}, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  JobSpec piped = spec_;
  piped.mutable_placement()->set_strategy(tandem::v1::STRATEGY_UNSPECIFIED);
  piped.mutable_placement()->mutable_pipeline()->set_stages(2);
  piped.mutable_placement()->mutable_pipeline()->set_schedule(tandem::v1::PIPELINE_SCHEDULE_GPIPE);
  NodeOffer node = TestNode();
  node.emulated_accelerators = 2;
  tandem::v1::PlanModelRequest request;
  *request.mutable_spec() = piped;
  PlanModelContext context;
  context.measured = [&](const Model&, const JobSpec&) {
    return std::optional<tandem::v1::Profile>(*measured);
  };
  absl::StatusOr<tandem::v1::PlanModelResponse> answer = PlanModel(request, node, context);
  ASSERT_TRUE(answer.ok()) << answer.status();
  absl::StatusOr<JobSpec> resolved = ResolveJobSpec(piped, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<Plan> job_plan = PlanJob(*jm_.model, *resolved, node, &*measured);
  ASSERT_TRUE(job_plan.ok()) << job_plan.status();
  const Plan plan = answer->plan();  // a copy: the answer is asked again below
  ASSERT_EQ(plan.pipeline_size(), 2) << plan.solver().note();
  ASSERT_EQ(job_plan->pipeline_size(), 2);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(plan.pipeline(k).last_layer(), job_plan->pipeline(k).last_layer()) << k;
    EXPECT_EQ(plan.pipeline(k).memory_bytes(), job_plan->pipeline(k).memory_bytes()) << k;
    EXPECT_EQ(plan.pipeline(k).offload_optimizer(), job_plan->pipeline(k).offload_optimizer());
  }
  EXPECT_NE(plan.solver().note().find("kept for each stage's transient buffers"), std::string::npos)
      << plan.solver().note();
  // The same room per stage (the capacity less the stage's margin), the
  // same micro-batches, and the same step.
  EXPECT_EQ(plan.accelerator_memory_budget_bytes(), job_plan->accelerator_memory_budget_bytes());
  EXPECT_EQ(plan.micro_batch_size(), job_plan->micro_batch_size());
  EXPECT_EQ(plan.micro_batches(), job_plan->micro_batches());
  EXPECT_DOUBLE_EQ(plan.prediction().iteration_seconds(),
                   job_plan->prediction().iteration_seconds());
  // With the factors an earlier run of the pipeline measured, as a
  // submission plans with them.
  PipelineCorrections corrections;
  corrections.compute_scale.assign(jm_.model->num_layers(), 1.0);
  corrections.compute_scale[0] = 3.0;
  corrections.update_scale.assign(jm_.model->num_layers(), 2.0);
  corrections.note = "corrected by what job job-000007's stages measured";
  const tandem::v1::Profile* asked_base = nullptr;
  context.pipeline_corrections = [&](const Model&, const JobSpec&,
                                     const tandem::v1::Profile* base) {
    asked_base = base;
    return std::optional<PipelineCorrections>(corrections);
  };
  answer = PlanModel(request, node, context);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_NE(asked_base, nullptr) << "the measured profile the factors are over";
  job_plan = PlanJob(*jm_.model, *resolved, node, &*measured, &corrections);
  ASSERT_TRUE(job_plan.ok()) << job_plan.status();
  EXPECT_DOUBLE_EQ(answer->plan().prediction().iteration_seconds(),
                   job_plan->prediction().iteration_seconds());
  EXPECT_GT(answer->plan().prediction().iteration_seconds(), plan.prediction().iteration_seconds());
  EXPECT_NE(answer->cost_source().find(corrections.note), std::string::npos)
      << answer->cost_source();
  // More stages than the node has accelerators: refused, as a submission is.
  request.mutable_spec()->mutable_placement()->mutable_pipeline()->set_stages(3);
  const absl::StatusOr<tandem::v1::PlanModelResponse> three = PlanModel(request, node, context);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument) << three.status();
  // pipeline_auto: its 2-stage candidate keeps each stage's room (1F1B's
  // inputs in flight), the one-accelerator plan the executor's.
  tandem::v1::PlanModelRequest automatic;
  *automatic.mutable_spec() = spec_;
  automatic.set_pipeline_auto(true);
  context.pipeline_corrections = nullptr;
  const absl::StatusOr<tandem::v1::PlanModelResponse> chosen = PlanModel(automatic, node, context);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  std::vector<Plan> all(chosen->alternatives().begin(), chosen->alternatives().end());
  all.push_back(chosen->plan());
  const int64_t capacity = spec_.resources().accelerator_memory_bytes();
  int pipelines = 0;
  for (const Plan& p : all) {
    if (p.pipeline_size() != 2) continue;
    ++pipelines;
    EXPECT_EQ(p.accelerator_memory_budget_bytes(),
              capacity - PipelineStageMargin(*jm_.model, p.micro_batch_size(),
                                             std::min(2, p.micro_batches())));
    EXPECT_NE(p.solver().note().find("kept for each stage's"), std::string::npos)
        << p.solver().note();
  }
  EXPECT_EQ(pipelines, 1);
}

// The executor's per-call dispatch the loop measured is folded into the
// layer profile's compute phases and said in its provenance; a plan solved
// from that profile (the next job's, from the cache) says what its
// prediction charges per call, so that its window check counts it as idle
// time as the loop that measured it does (until 2026-11-29 only that loop
// knew it).
TEST_F(MeasuredProfileTest, AProfilesDispatchChargeTravelsWithThePlansSolvedFromIt) {
  absl::StatusOr<tandem::v1::Profile> measured =
      MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {Step(), Step()}, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  absl::StatusOr<Plan> plain = PlanJob(*jm_.model, spec_, TestNode(), &*measured);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(DispatchOf(plain->prediction()).empty());
  tandem::v1::Profile charged = *measured;
  const std::map<tandem::v1::TimelineResource, double> dispatch = {
      {tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, 50e-6}};
  AddDispatch(dispatch, charged);
  EXPECT_DOUBLE_EQ(charged.provenance().accelerator_dispatch_seconds(), 50e-6);
  EXPECT_EQ(charged.provenance().host_dispatch_seconds(), 0);
  EXPECT_DOUBLE_EQ(charged.layers(1).devices(1).forward().timing().median_seconds(),
                   measured->layers(1).devices(1).forward().timing().median_seconds() + 50e-6);
  absl::StatusOr<Plan> solved = PlanJob(*jm_.model, spec_, TestNode(), &charged);
  ASSERT_TRUE(solved.ok()) << solved.status();
  EXPECT_EQ(DispatchOf(solved->prediction()), dispatch);
  EXPECT_GT(solved->prediction().iteration_seconds(), plain->prediction().iteration_seconds());
  // And back: what SetDispatch writes, DispatchOf reads.
  tandem::v1::PlanPrediction p;
  SetDispatch({{tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, 7e-6}}, &p);
  EXPECT_EQ(p.accelerator_dispatch_seconds(), 0);
  EXPECT_EQ(DispatchOf(p), (std::map<tandem::v1::TimelineResource, double>{
                               {tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, 7e-6}}));
}

TEST_F(MeasuredProfileTest, NoComputeSpansIsAnError) {
  Timeline copies_only;
  AddSpan(copies_only, kH2D, -1, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, 0, 0.001, 1000);
  EXPECT_EQ(MeasuredLayerProfile(*jm_.model, spec_, TestNode(), plan_, {copies_only}, nullptr)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

// The loop on synthetic steps: everything 2x slower than the plan said.
TEST_F(MeasuredProfileTest, LoopRecalibratesThenStopsWhenTheStepAgrees) {
  PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 2, .window_steps = 3};
  PlanLoop loop(*jm_.model, spec_, TestNode(), plan_, options);
  const double predicted = plan_.prediction().iteration_seconds();
  ASSERT_GT(plan_.timeline().spans_size(), 0);
  const Timeline slow = Scaled(plan_.timeline(), 2);
  // Warm-up and the window's first steps decide nothing.
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(loop.AfterStep(2 * predicted, slow).check);
  PlanLoop::Outcome out = loop.AfterStep(2 * predicted, slow);
  ASSERT_TRUE(out.check);
  EXPECT_EQ(out.check->off, tandem::v1::REPLAN_REASON_STEP_TIME);
  ASSERT_TRUE(out.decision) << out.log;
  EXPECT_EQ(out.decision->reason, tandem::v1::REPLAN_REASON_STEP_TIME);
  ASSERT_TRUE(out.decision->measured_profile);
  const double next = out.decision->plan.prediction().iteration_seconds();
  // Everything twice as long: re-timed, the plan predicts about twice the step.
  EXPECT_GT(next, 1.5 * predicted);
  EXPECT_LT(next, 2.5 * predicted);
  const Timeline as_predicted = out.decision->plan.timeline();
  EXPECT_EQ(loop.plan_measured_steps(), options.window_steps);
  EXPECT_DOUBLE_EQ(loop.plan_measured_seconds(), 2 * predicted);
  loop.Adopt(*out.decision);
  EXPECT_EQ(loop.plan_measured_steps(), 0);  // a new plan's steps from its warm-up on
  // Steps as the new plan predicts: the next window agrees and the loop stops.
  // Warm-up again either way, then the window.
  const int until_window = options.warmup_steps + options.window_steps;
  for (int i = 0; i < until_window - 1; ++i) {
    EXPECT_FALSE(loop.AfterStep(next, as_predicted).check);
  }
  out = loop.AfterStep(next, as_predicted);
  ASSERT_TRUE(out.check);
  EXPECT_EQ(out.check->off, tandem::v1::REPLAN_REASON_UNSPECIFIED) << out.log;
  EXPECT_FALSE(out.decision);
  EXPECT_TRUE(loop.done());
  EXPECT_NE(out.log.find("within the 10% threshold"), std::string::npos) << out.log;
  // Settled: the plan's measured step is every later step's median, not the
  // window's alone.
  for (int i = 0; i < 2 * options.window_steps; ++i) loop.AfterStep(1.2 * next, Timeline());
  EXPECT_EQ(loop.plan_measured_steps(), 3 * options.window_steps);
  EXPECT_DOUBLE_EQ(loop.plan_measured_seconds(), 1.2 * next);
}

TEST_F(MeasuredProfileTest, LoopSwitchesBackFromASlowerPlanAndStops) {
  PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 0, .window_steps = 1};
  PlanLoop loop(*jm_.model, spec_, TestNode(), plan_, options);
  PlanLoop::Decision switched;
  switched.plan = plan_;
  switched.plan.set_micro_batch_size(plan_.micro_batch_size() / 2);
  switched.placement_changed = true;
  switched.reason = tandem::v1::REPLAN_REASON_STEP_TIME;
  switched.check.measured_step_seconds = 0.100;
  loop.Adopt(switched);
  switched.plan.mutable_prediction()->set_iteration_seconds(0.150);
  PlanLoop::Outcome out = loop.AfterStep(0.150, Step());  // slower than the 100 ms before
  ASSERT_TRUE(out.decision) << out.log;
  EXPECT_EQ(out.decision->reason, tandem::v1::REPLAN_REASON_SLOWER);
  EXPECT_TRUE(SamePlacement(out.decision->plan, plan_));
  loop.Adopt(*out.decision);
  EXPECT_TRUE(loop.done());
  EXPECT_FALSE(loop.AfterStep(1.0, Step()).check);
}

// A rank of a distributed job too: rank 0 switching alone to a one-device
// runner would leave the others waiting in their collectives.
TEST_F(MeasuredProfileTest, NegativeThresholdForcedPlanOrDistributedComparesButNeverReplans) {
  JobSpec forced = spec_;
  *forced.mutable_placement()->mutable_plan() = plan_;
  JobSpec distributed = spec_;
  distributed.mutable_distributed()->set_replicas(2);
  for (const JobSpec& spec : {spec_, forced, distributed}) {
    PlanLoopOptions options{
        .threshold =
            spec.distributed().replicas() > 1 || spec.placement().has_plan() ? 0.10 : -0.10,
        .warmup_steps = 0,
        .window_steps = 1};
    PlanLoop loop(*jm_.model, spec, TestNode(), plan_, options);
    PlanLoop::Outcome out = loop.AfterStep(3 * plan_.prediction().iteration_seconds(), Step());
    ASSERT_TRUE(out.check);
    EXPECT_EQ(out.check->off, tandem::v1::REPLAN_REASON_STEP_TIME);
    EXPECT_FALSE(out.decision);
    EXPECT_NE(out.log.find("not re-planning"), std::string::npos) << out.log;
    EXPECT_TRUE(loop.done());
  }
}

// Rank 0 of a 2-rank job: off the prediction, its rank plan is re-timed from
// what it measured, collectives included (all-reduces at 2 GB/s + 0.1 ms),
// never replaced; still off after that, the loop stops.
TEST_F(MeasuredProfileTest, ADistributedJobsRankPlanIsReTimedWithItsMeasuredCollectives) {
  JobSpec distributed = spec_;
  distributed.mutable_distributed()->set_replicas(2);
  distributed.mutable_distributed()->set_bucket_bytes(1 << 20);
  // Layer 1 updates on the host (Step() times it), not with its state
  // streamed in.
  distributed.mutable_placement()->set_no_streamed_optimizer_state(true);
  absl::StatusOr<Plan> rank_plan = RankPlan(*jm_.model, distributed, TestNode(), 2);
  ASSERT_TRUE(rank_plan.ok()) << rank_plan.status();
  PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 0, .window_steps = 2};
  PlanLoop loop(*jm_.model, distributed, TestNode(), *rank_plan, options);
  Timeline step = Step();
  for (int64_t mb : {1, 4}) {
    AddSpan(step, tandem::v1::TIMELINE_RESOURCE_NETWORK, -1, tandem::v1::TIMELINE_PHASE_ALL_REDUCE,
            0, 1e-4 + mb * 5e-4, mb * 1000000);
  }
  const double slow = 3 * rank_plan->prediction().iteration_seconds();
  EXPECT_FALSE(loop.AfterStep(slow, step).check);
  PlanLoop::Outcome out = loop.AfterStep(slow, step);
  ASSERT_TRUE(out.check);
  ASSERT_TRUE(out.decision) << out.log;
  EXPECT_FALSE(out.decision->placement_changed);
  // A rank's profile, for its share of the batch: the next such job's rank
  // plan is solved from it.
  ASSERT_TRUE(out.decision->measured_profile);
  EXPECT_EQ(out.decision->measured_profile->batch_size(), rank_plan->batch_size());
  // The window's collectives, for the next submission of as many ranks.
  ASSERT_TRUE(out.collectives);
  ASSERT_EQ(out.collectives->fits_size(), 1);
  EXPECT_EQ(out.collectives->fits(0).phase(), tandem::v1::TIMELINE_PHASE_ALL_REDUCE);
  EXPECT_NEAR(out.collectives->fits(0).bytes_per_second(), 2e9, 1e3);
  EXPECT_NEAR(out.collectives->fits(0).latency_seconds(), 1e-4, 1e-12);
  EXPECT_EQ(out.collectives->fits(0).calls(), 4);
  EXPECT_TRUE(SamePlacement(out.decision->plan, *rank_plan));
  EXPECT_NE(out.decision->cost_source.find("4 ALL_REDUCE at 2.00 GB/s + 100 us"), std::string::npos)
      << out.decision->cost_source;
  int collectives = 0;
  for (const auto& span : out.decision->plan.timeline().spans()) {
    collectives += span.resource() == tandem::v1::TIMELINE_RESOURCE_NETWORK;
  }
  EXPECT_GT(collectives, 0);
  // The same measured figures on one device: the rank's step is longer by
  // what its collectives leave exposed, never shorter.
  absl::StatusOr<tandem::v1::Profile> measured =
      MeasuredLayerProfile(*jm_.model, distributed, TestNode(), *rank_plan, {step, step}, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  absl::StatusOr<planner::CostModel> cost = planner::CostModel::FromMeasuredProfile(*measured);
  ASSERT_TRUE(cost.ok()) << cost.status();
  absl::StatusOr<planner::SimulationResult> alone =
      planner::PlanSimulator(*cost).Simulate(*rank_plan);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_GT(out.decision->plan.prediction().iteration_seconds(),
            alone->prediction.iteration_seconds());
  loop.Adopt(*out.decision);
  loop.AfterStep(10 * slow, step);
  out = loop.AfterStep(10 * slow, step);
  ASSERT_TRUE(out.check);
  EXPECT_FALSE(out.decision);
  EXPECT_NE(out.log.find("still off after re-timing the rank plan"), std::string::npos) << out.log;
  EXPECT_TRUE(loop.done());

  // Partitioned, rank 0's host update of layer 1 (5 ms) stepped its piece of
  // the layer: the re-timed plan's rank steps that piece in the same 5 ms,
  // not half of it (the simulator divides by the ranks itself).
  distributed.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_PARTITIONED);
  PlanLoop partitioned(*jm_.model, distributed, TestNode(), *rank_plan, options);
  partitioned.AfterStep(slow, step);
  out = partitioned.AfterStep(slow, step);
  ASSERT_TRUE(out.decision) << out.log;
  double host_update = 0;
  for (const auto& span : out.decision->plan.timeline().spans()) {
    if (span.resource() == kHostUpdate && span.phase() == tandem::v1::TIMELINE_PHASE_UPDATE &&
        span.layer() == 1) {
      host_update = span.end_seconds() - span.start_seconds();
    }
  }
  EXPECT_NEAR(host_update, 0.005, 1e-9);
}

// A 2-stage 1F1B pipeline of the MLP on two emulated accelerators, and its
// stages' figures as the runner reports them.
class PipelineLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    JobSpec spec = Mlp(tandem::v1::STRATEGY_UNSPECIFIED, int64_t{64} << 20);
    spec.mutable_placement()->set_strategy(tandem::v1::STRATEGY_UNSPECIFIED);
    spec.mutable_placement()->mutable_pipeline()->set_stages(2);
    spec.mutable_placement()->mutable_pipeline()->set_schedule(
        tandem::v1::PIPELINE_SCHEDULE_ONE_F_ONE_B);
    absl::StatusOr<JobSpec> resolved = ResolveJobSpec(spec, false);
    ASSERT_TRUE(resolved.ok()) << resolved.status();
    spec_ = *std::move(resolved);
    absl::StatusOr<JobModel> jm = BuildJobModel(spec_, nullptr);
    ASSERT_TRUE(jm.ok()) << jm.status();
    jm_ = *std::move(jm);
    node_ = TestNode();
    node_.emulated_accelerators = 2;
    absl::StatusOr<Plan> plan = PlanJob(*jm_.model, spec_, node_);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
    ASSERT_EQ(plan_.pipeline_size(), 2) << plan_.solver().note();
  }
  // Each stage's compute (busy plus copies) and update per step: `scale[k]`
  // times what the plan predicts for stage k.
  std::vector<tandem::v1::PipelineStageStats> Stages(const std::vector<double>& scale) const {
    std::vector<tandem::v1::PipelineStageStats> out;
    for (int k = 0; k < plan_.pipeline_size(); ++k) {
      const tandem::v1::PipelineStage& st = plan_.pipeline(k);
      tandem::v1::PipelineStageStats& s = out.emplace_back();
      s.set_stage(k);
      s.set_first_layer(st.first_layer());
      s.set_last_layer(st.last_layer());
      const double busy = scale[k] * plan_.micro_batches() * st.compute_seconds();
      s.set_busy_seconds(0.9 * busy);
      s.set_copy_seconds(0.1 * busy);
      s.set_update_seconds(scale[k] * st.update_seconds());
    }
    return out;
  }
  // A window of two steps at three times the prediction, stage 0 three
  // times its own and stage 1 as predicted: the outcome of its check.
  PlanLoop::Outcome SlowFirstStage(PlanLoop& loop) const {
    const double predicted = plan_.prediction().iteration_seconds();
    loop.AfterStep(3 * predicted, Timeline(), Stages({3, 1}));
    return loop.AfterStep(3 * predicted, Timeline(), Stages({3, 1}));
  }
  JobSpec spec_;
  JobModel jm_;
  NodeOffer node_;
  Plan plan_;
};

TEST_F(PipelineLoopTest, ASlowStageMovesTheSplitAndAnEvenSlowdownRecalibrates) {
  const PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 0, .window_steps = 2};
  const double predicted = plan_.prediction().iteration_seconds();
  const int cut = plan_.pipeline(0).last_layer();
  {
    // Stage 0 three times its prediction: the split gives it fewer layers.
    PlanLoop loop(*jm_.model, spec_, node_, plan_, options);
    EXPECT_TRUE(loop.pipeline());
    EXPECT_FALSE(loop.AfterStep(3 * predicted, Timeline(), Stages({3, 1})).check);
    PlanLoop::Outcome out = loop.AfterStep(3 * predicted, Timeline(), Stages({3, 1}));
    ASSERT_TRUE(out.check);
    EXPECT_EQ(out.check->off, tandem::v1::REPLAN_REASON_STEP_TIME);
    ASSERT_TRUE(out.decision) << out.log;
    ASSERT_TRUE(out.decision->corrections);
    EXPECT_NEAR(out.decision->corrections->compute_scale[0], 3, 1e-9);
    EXPECT_NEAR(out.decision->corrections->compute_scale[cut + 1], 1, 1e-9);
    EXPECT_NEAR(out.decision->corrections->update_scale[0], 3, 1e-9);
    ASSERT_TRUE(out.decision->replaced_timed);
    // The running split re-timed: stage 0's slots three times as long.
    EXPECT_GT(out.decision->replaced_timed->prediction().iteration_seconds(), 2 * predicted);
    EXPECT_TRUE(out.decision->placement_changed) << out.log;
    EXPECT_LT(out.decision->plan.pipeline(0).last_layer(), cut) << out.log;
    EXPECT_LT(out.decision->plan.prediction().iteration_seconds(),
              0.95 * out.decision->replaced_timed->prediction().iteration_seconds());
    EXPECT_FALSE(SamePlacement(out.decision->plan, plan_));
    EXPECT_NE(out.log.find("re-planned from measured figures: a new placement"), std::string::npos)
        << out.log;
    EXPECT_NE(out.decision->cost_source.find("stage 0 compute"), std::string::npos)
        << out.decision->cost_source;
    // The new split measures slower than the old one did: switched back, and
    // the corrections that chose it are not kept, however long it runs.
    loop.Adopt(*out.decision);
    loop.AfterStep(4 * predicted, Timeline(), Stages({4, 4}));
    out = loop.AfterStep(4 * predicted, Timeline(), Stages({4, 4}));
    ASSERT_TRUE(out.decision) << out.log;
    EXPECT_EQ(out.decision->reason, tandem::v1::REPLAN_REASON_SLOWER) << out.log;
    loop.Adopt(*out.decision);
    for (int i = 0; i < 2 * kSettledCorrectionSteps; ++i) loop.AfterStep(predicted, Timeline());
    EXPECT_FALSE(loop.TakeSettledCorrections());
  }
  {
    // Every stage 1.5 times its prediction: the same split, re-timed.
    PlanLoop loop(*jm_.model, spec_, node_, plan_, options);
    loop.AfterStep(1.5 * predicted, Timeline(), Stages({1.5, 1.5}));
    PlanLoop::Outcome out = loop.AfterStep(1.5 * predicted, Timeline(), Stages({1.5, 1.5}));
    ASSERT_TRUE(out.decision) << out.log;
    EXPECT_FALSE(out.decision->placement_changed) << out.log;
    EXPECT_TRUE(SamePlacement(out.decision->plan, plan_));
    const double next = out.decision->plan.prediction().iteration_seconds();
    EXPECT_GT(next, 1.3 * predicted) << out.log;
    EXPECT_LT(next, 1.7 * predicted) << out.log;
    EXPECT_FALSE(loop.TakeSettledCorrections());  // not adopted yet
    loop.Adopt(*out.decision);
    EXPECT_FALSE(loop.TakeSettledCorrections());  // no step under it yet
    // Steps as re-timed: the next window agrees and the loop stops.
    loop.AfterStep(next, Timeline(), Stages({1.5, 1.5}));
    out = loop.AfterStep(next, Timeline(), Stages({1.5, 1.5}));
    ASSERT_TRUE(out.check);
    EXPECT_EQ(out.check->off, tandem::v1::REPLAN_REASON_UNSPECIFIED) << out.log;
    EXPECT_TRUE(loop.done());
    // The factors as the steps under them bear out, once kSettledCorrection
    // Steps have run: 1.5, here at 0.9 of the re-timed prediction over the
    // plan's steps (two at 1, the rest at 0.9).
    while (loop.plan_measured_steps() < kSettledCorrectionSteps - 1) {
      loop.AfterStep(0.9 * next, Timeline());
    }
    EXPECT_FALSE(loop.TakeSettledCorrections());
    loop.AfterStep(0.9 * next, Timeline());
    double ratio = 0;
    std::string source;
    std::optional<PipelineCorrections> settled = loop.TakeSettledCorrections(&ratio, &source);
    ASSERT_TRUE(settled);
    EXPECT_FALSE(loop.TakeSettledCorrections()) << "once";
    EXPECT_NE(source.find("stage 0 compute"), std::string::npos) << source;
    EXPECT_NEAR(ratio, 0.9, 1e-9);
    EXPECT_TRUE(settled->stages.empty());
    EXPECT_NEAR(settled->compute_scale[0], 1.5 * 0.9, 1e-9);
    EXPECT_NEAR(settled->update_scale.back(), 1.5 * 0.9, 1e-9);
  }
  // A split or a schedule of its own is another placement.
  Plan other = plan_;
  other.mutable_pipeline(0)->set_last_layer(cut - 1);
  other.mutable_pipeline(1)->set_first_layer(cut);
  EXPECT_FALSE(SamePlacement(plan_, other));
  other = plan_;
  other.set_pipeline_schedule(tandem::v1::PIPELINE_SCHEDULE_GPIPE);
  EXPECT_FALSE(SamePlacement(plan_, other));
  other = plan_;
  other.mutable_pipeline(1)->set_offload_optimizer(!plan_.pipeline(1).offload_optimizer());
  EXPECT_FALSE(SamePlacement(plan_, other));
}

// Under PipeDream a layer's gradients are as stale as its stage makes them:
// a slow stage is re-timed, and its split kept, saying why.
TEST_F(PipelineLoopTest, APipeDreamSplitIsReTimedNotMoved) {
  spec_.mutable_placement()->mutable_pipeline()->set_schedule(
      tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM);
  absl::StatusOr<Plan> plan = PlanJob(*jm_.model, spec_, node_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  plan_ = *std::move(plan);
  ASSERT_EQ(plan_.pipeline_schedule(), tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM);
  const PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 0, .window_steps = 2};
  const double predicted = plan_.prediction().iteration_seconds();
  PlanLoop loop(*jm_.model, spec_, node_, plan_, options);
  const PlanLoop::Outcome out = SlowFirstStage(loop);
  ASSERT_TRUE(out.decision) << out.log;
  EXPECT_FALSE(out.decision->placement_changed) << out.log;
  EXPECT_TRUE(SamePlacement(out.decision->plan, plan_));
  // Re-timed with the stages' figures.
  EXPECT_NE(out.decision->plan.prediction().iteration_seconds(), predicted) << out.log;
  EXPECT_NE(out.decision->cost_source.find("not taken: under PipeDream"), std::string::npos)
      << out.decision->cost_source;
}

// What a pipeline's stages measured, kept: the next job of the same pipeline
// here is planned with the factors, which is the split the plan check solved
// from them; another stage count, another cost source or a damaged file is
// a miss.
TEST_F(PipelineLoopTest, StageCorrectionsAreKeptForTheNextPipeline) {
  const std::string dir =
      ::testing::TempDir() + "/pipeline_corrections_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  PipelineCorrectionCache cache(dir);
  EXPECT_EQ(PipelineCorrectionCache::Key(*jm_.model, spec_, node_, nullptr), "");  // no profile
  node_.profile.emplace();
  node_.profile->set_fingerprint("node A");
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_, nullptr));
  const PlanLoopOptions options{.threshold = 0.10, .warmup_steps = 0, .window_steps = 2};
  PlanLoop loop(*jm_.model, spec_, node_, plan_, options);
  const PlanLoop::Outcome out = SlowFirstStage(loop);
  ASSERT_TRUE(out.decision) << out.log;
  ASSERT_TRUE(out.decision->corrections);
  ASSERT_TRUE(out.decision->placement_changed) << out.log;
  tandem::v1::PipelineCorrectionProfile kept = CorrectionProfileOf(*out.decision->corrections);
  kept.set_job_id("job-7");
  ASSERT_TRUE(cache.Store(*jm_.model, spec_, node_, nullptr, kept).ok());
  std::optional<tandem::v1::PipelineCorrectionProfile> loaded =
      cache.Load(*jm_.model, spec_, node_, nullptr);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->job_id(), "job-7");
  const PipelineCorrections c = CorrectionsOf(*loaded);
  absl::StatusOr<Plan> next = PlanPipelineJob(*jm_.model, spec_, node_, nullptr, &c);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(SamePlacement(*next, out.decision->plan));
  EXPECT_DOUBLE_EQ(next->prediction().iteration_seconds(),
                   out.decision->plan.prediction().iteration_seconds());
  // Planned from a measured layer profile, or as a 4-stage pipeline: the
  // factors are over other figures.
  tandem::v1::Profile base;
  base.mutable_provenance()->set_cache_key("a layer profile");
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_, &base));
  JobSpec four = spec_;
  four.mutable_placement()->mutable_pipeline()->set_stages(4);
  EXPECT_FALSE(cache.Load(*jm_.model, four, node_, nullptr));
  // A split they chose measured slower: forgotten.
  cache.Forget(*jm_.model, spec_, node_, nullptr);
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_, nullptr));
  ASSERT_TRUE(cache.Store(*jm_.model, spec_, node_, nullptr, kept).ok());
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::ofstream(f.path(), std::ios::trunc) << "not corrections \xff";
  }
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_, nullptr));
  std::filesystem::remove_all(dir);
}

class LayerProfileCacheTest : public MeasuredProfileTest {
 protected:
  void SetUp() override {
    MeasuredProfileTest::SetUp();
    dir_ = ::testing::TempDir() + "/layer_profiles_" + std::to_string(::getpid());
    std::filesystem::remove_all(dir_);
    node_ = TestNode();
    node_.profile.emplace();
    node_.profile->set_fingerprint("node A");
  }
  std::string dir_;
  NodeOffer node_;
};

TEST_F(LayerProfileCacheTest, StoredProfileIsReusedForTheSameModelAndNode) {
  LayerProfileCache cache(dir_);
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_));
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, node_, plan_, {Step()}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_TRUE(cache.Store(*jm_.model, spec_, node_, *profile).ok());
  std::optional<tandem::v1::Profile> loaded = cache.Load(*jm_.model, spec_, node_);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->layers_size(), profile->layers_size());
  EXPECT_EQ(loaded->layers(0).devices(1).forward().timing().median_seconds(), 0.002);
  // Planned from it, the plan's figures are the measured ones.
  absl::StatusOr<Plan> planned = PlanJob(*jm_.model, spec_, node_, &*loaded);
  ASSERT_TRUE(planned.ok()) << planned.status();
  EXPECT_GT(planned->prediction().iteration_seconds(), 0);
  // Another batch size is another key.
  JobSpec other = spec_;
  other.mutable_training()->set_batch_size(spec_.training().batch_size() / 2);
  EXPECT_FALSE(cache.Load(*jm_.model, other, node_));
}

TEST_F(LayerProfileCacheTest, AnotherNodesOrADamagedFileIsIgnored) {
  LayerProfileCache cache(dir_);
  absl::StatusOr<tandem::v1::Profile> profile =
      MeasuredLayerProfile(*jm_.model, spec_, node_, plan_, {Step()}, nullptr);
  ASSERT_TRUE(profile.ok()) << profile.status();
  ASSERT_TRUE(cache.Store(*jm_.model, spec_, node_, *profile).ok());
  // The same file presented as node B's (copied under B's key): its
  // provenance says node A, so it is not used.
  NodeOffer node_b = node_;
  node_b.profile->set_fingerprint("node B");
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_b));
  std::filesystem::copy_file(cache.PathOf(LayerProfileCache::Key(*jm_.model, spec_, node_)),
                             cache.PathOf(LayerProfileCache::Key(*jm_.model, spec_, node_b)));
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_b));
  // A damaged file reads as no profile, never a crash.
  const std::string path = cache.PathOf(LayerProfileCache::Key(*jm_.model, spec_, node_));
  std::ofstream(path, std::ios::trunc) << "not a profile \xff\xfe";
  EXPECT_FALSE(cache.Load(*jm_.model, spec_, node_));
  // A node without a profile has nothing to tie figures to: no key.
  EXPECT_EQ(LayerProfileCache::Key(*jm_.model, spec_, TestNode()), "");
  std::filesystem::remove_all(dir_);
}

// A distributed job's measured collectives kept for the next submission of
// as many ranks: loaded under the same key only, and a rank plan timed with
// them is the rank plan with its collectives (the same placement, slower by
// what they leave exposed, NETWORK spans at the fitted seconds).
TEST_F(LayerProfileCacheTest, CollectivesAreKeptAndTimeTheNextRankPlan) {
  CollectiveProfileCache cache(dir_);
  JobSpec distributed = spec_;
  distributed.mutable_distributed()->set_replicas(2);
  distributed.mutable_distributed()->set_bucket_bytes(1 << 20);
  EXPECT_EQ(CollectiveProfileCache::Key(spec_, node_), "");             // one rank
  EXPECT_EQ(CollectiveProfileCache::Key(distributed, TestNode()), "");  // no node profile
  EXPECT_FALSE(cache.Load(distributed, node_));
  Timeline step;
  for (int64_t mb : {1, 4}) {
    AddSpan(step, tandem::v1::TIMELINE_RESOURCE_NETWORK, -1, tandem::v1::TIMELINE_PHASE_ALL_REDUCE,
            0, 1e-4 + mb * 5e-4, mb * 1000000);
  }
  EXPECT_FALSE(FitCollectives({Step()}).ok());  // none measured
  absl::StatusOr<tandem::v1::CollectiveProfile> fits = FitCollectives({step});
  ASSERT_TRUE(fits.ok()) << fits.status();
  fits->set_job_id("job-1");
  ASSERT_TRUE(cache.Store(distributed, node_, *fits).ok());
  std::optional<tandem::v1::CollectiveProfile> loaded = cache.Load(distributed, node_);
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->job_id(), "job-1");
  EXPECT_EQ(loaded->ranks(), 2);
  EXPECT_EQ(DescribeCollectives(*loaded), "2 ALL_REDUCE at 2.00 GB/s + 100 us");
  // An all-reduce of 2 MB at the fit; a phase, never measured, half of it.
  const auto seconds = CollectiveSeconds(*loaded);
  EXPECT_NEAR(seconds(schedule::OpKind::kAllReduce, 2000000), 1.1e-3, 1e-12);
  EXPECT_NEAR(seconds(schedule::OpKind::kAllGather, 2000000), 0.55e-3, 1e-12);
  // Other ranks, another node: other keys.
  JobSpec four = distributed;
  four.mutable_distributed()->set_replicas(4);
  EXPECT_FALSE(cache.Load(four, node_));
  NodeOffer node_b = node_;
  node_b.profile->set_fingerprint("node B");
  EXPECT_FALSE(cache.Load(distributed, node_b));

  absl::StatusOr<Plan> rank_plan = RankPlan(*jm_.model, distributed, node_, 2);
  ASSERT_TRUE(rank_plan.ok()) << rank_plan.status();
  absl::StatusOr<Plan> timed =
      TimeAsRank(*jm_.model, distributed, node_, *rank_plan, RankSimulation(distributed, *loaded));
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_TRUE(SamePlacement(*timed, *rank_plan));
  EXPECT_GT(timed->prediction().iteration_seconds(), rank_plan->prediction().iteration_seconds());
  int collectives = 0;
  for (const auto& span : timed->timeline().spans()) {
    if (span.resource() != tandem::v1::TIMELINE_RESOURCE_NETWORK) continue;
    ++collectives;
    EXPECT_NEAR(span.end_seconds() - span.start_seconds(),
                seconds(schedule::OpKind::kAllReduce, span.bytes()), 1e-9);
  }
  EXPECT_GT(collectives, 0);
  // With the collectives free the rank still runs its own program (updates
  // wait for their buckets' sums): no faster than the plan alone, no slower
  // than with its collectives.
  planner::SimulationOptions free = RankSimulation(distributed, {});
  EXPECT_EQ(free.collective_seconds(schedule::OpKind::kAllReduce, 1 << 20), 0.0);
  absl::StatusOr<Plan> alone = TimeAsRank(*jm_.model, distributed, node_, *rank_plan, free);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_GE(alone->prediction().iteration_seconds(), rank_plan->prediction().iteration_seconds());
  EXPECT_LT(alone->prediction().iteration_seconds(), timed->prediction().iteration_seconds());
  EXPECT_FALSE(TimeAsRank(*jm_.model, spec_, node_, *rank_plan, {}).ok());
  // A fit of a kind this build does not know, or without a rate, is a miss;
  // described, it says its number.
  tandem::v1::CollectiveProfile odd = *loaded;
  odd.mutable_fits(0)->set_phase(static_cast<tandem::v1::TimelinePhase>(99));
  EXPECT_EQ(DescribeCollectives(odd), "2 phase 99 at 2.00 GB/s + 100 us");
  ASSERT_TRUE(cache.Store(distributed, node_, odd).ok());
  EXPECT_FALSE(cache.Load(distributed, node_));
  odd = *loaded;
  odd.mutable_fits(0)->set_bytes_per_second(0);
  ASSERT_TRUE(cache.Store(distributed, node_, odd).ok());
  EXPECT_FALSE(cache.Load(distributed, node_));
  // A damaged file is a miss.
  for (const auto& f : std::filesystem::directory_iterator(dir_)) {
    std::ofstream(f.path(), std::ios::trunc) << "not collectives \xff\xfe";
  }
  EXPECT_FALSE(cache.Load(distributed, node_));
  std::filesystem::remove_all(dir_);
}

}  // namespace
}  // namespace tandem::node
