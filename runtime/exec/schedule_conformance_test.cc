// The plan executor runs the schedule (schedule/lower.h), and only it: with
// a recording hook on every span, for every plan shape of the executor's
// tests (every strategy; with and without gradient clipping; with delayed
// updates), each resource ran exactly the schedule's operations of every
// step: a compute stream in the schedule's order, a copy engine or the update
// pool the same operations (in the order they became ready), and no
// operation started before a dependency the schedule gives it (of the same
// step or steps before) had ended, or started for a start-dependency.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/exec/plan_test_util.h"
#include "schedule/lower.h"
#include "schedule/schedule_proto.h"

namespace tandem {
namespace {

using exec_test::Case;
using exec_test::Cases;
using exec_test::Fixture;
using exec_test::MakeFixture;
using exec_test::RunSteps;

struct Ran {
  int64_t iteration;
  int op;
  double start, end;
};

// What the hook saw, thread-safe.
class Recorder {
 public:
  void Record(const SpanRecord& r) {
    std::lock_guard<std::mutex> lock(mu_);
    ran_.push_back({r.info.iteration, r.info.op, r.start, r.end});
  }
  std::vector<Ran> ran() {
    std::lock_guard<std::mutex> lock(mu_);
    return ran_;
  }

 private:
  std::mutex mu_;
  std::vector<Ran> ran_;
};

std::string Show(const schedule::Schedule& s, const std::vector<int>& ops) {
  std::string out;
  for (int o : ops) {
    const schedule::Op& op = s.ops[o];
    absl::StrAppend(&out, " ", schedule::OpKindName(op.kind), "/",
                    tandem::v1::TimelinePhase_Name(op.phase).substr(15), op.layer, ".",
                    op.micro_batch);
  }
  return out;
}

// The program's shape, resource by resource: what Lower gives for the plan
// with the model's layers, independently of the executor's bytes.
std::vector<std::string> Shape(const schedule::Schedule& s) {
  std::vector<std::string> shape;
  for (const std::vector<int>& order : s.order) shape.push_back(Show(s, order));
  return shape;
}

struct Variant {
  std::string name;
  const char* job;
  int plan;
  bool delayed;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  const std::vector<Case> cases = Cases();
  for (int c = 0; c < static_cast<int>(cases.size()); ++c) {
    v.push_back({cases[c].name, exec_test::kMlp, c, false});
    // The GPT job clips gradients: a GRADIENT_NORM every update waits for.
    v.push_back({cases[c].name + "_clipped", exec_test::kGpt, c, false});
  }
  v.push_back({"zero_offload_delayed", exec_test::kMlp, 1, true});
  v.push_back({"reuse_distance_delayed_clipped", exec_test::kGpt, 2, true});
  return v;
}

class ScheduleConformanceTest : public testing::TestWithParam<int> {};

TEST_P(ScheduleConformanceTest, EachResourceRunsExactlyTheSchedulesOperationsInOrder) {
  const Variant v = Variants()[GetParam()];
  const Fixture f = MakeFixture(v.job);
  const int batch = f.spec.training().batch_size();
  HostAllocator host;
  EmulatedAccelerator device({.capacity_bytes = 64 << 20});
  Recorder recorder;
  ExecutorOptions options;
  options.plan = Cases()[v.plan].plan(*f.model, batch);
  options.plan.set_delayed_parameter_update(v.delayed);
  options.optimizer = f.spec.optimizer();
  options.max_batch = batch;
  options.host_allocator = &host;
  options.accelerator = &device;
  options.span_jitter_seconds = 100e-6;
  options.span_recorder = [&recorder](const SpanRecord& r) { recorder.Record(r); };
  absl::StatusOr<std::unique_ptr<PlanExecutor>> executor = PlanExecutor::Create(*f.model, options);
  ASSERT_TRUE(executor.ok()) << executor.status();
  constexpr int kSteps = 4;
  ASSERT_EQ(RunSteps(f, **executor, kSteps).size(), static_cast<size_t>(kSteps));
  ASSERT_TRUE((*executor)->SyncStateToHost().ok());  // every span has ended
  const schedule::Schedule& s = (*executor)->schedule();

  // The executor's program is the plan's, lowered.
  schedule::Decisions d = *schedule::DecisionsFromPlan(options.plan, f.model->num_layers());
  if (d.strategy == tandem::v1::STRATEGY_HETERO_DP) d.micro_batch_size = batch * 5 / 16;
  std::vector<schedule::LayerSizes> sizes(f.model->num_layers());
  for (int l = 0; l < f.model->num_layers(); ++l) {
    sizes[l].parameters = sizes[l].gradients = f.model->layer(l).ParamCount() * 4;
  }
  schedule::LowerOptions lower;
  lower.clip_gradients = f.spec.optimizer().max_grad_norm() > 0;
  absl::StatusOr<schedule::Schedule> expected = schedule::Lower(d, sizes, lower);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(Shape(s), Shape(*expected));
  // And exactly what LowerStepProgram gives, which tandemd stores with a job.
  absl::StatusOr<schedule::Schedule> stored =
      LowerStepProgram(*f.model, options.plan, options.optimizer, batch);
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_TRUE(schedule::SameSchedule(*stored, s));

  // When each operation of each step ran.
  std::map<std::pair<int64_t, int>, Ran> when;
  for (const Ran& r : recorder.ran()) {
    ASSERT_GE(r.op, 0);
    ASSERT_LT(r.op, s.num_ops());
    EXPECT_TRUE(when.insert({{r.iteration, r.op}, r}).second)
        << "step " << r.iteration << " ran" << Show(s, {r.op}) << " twice";
  }
  for (int64_t k = 0; k < kSteps; ++k) {
    for (size_t r = 0; r < s.resources.size(); ++r) {
      std::vector<int> want = s.order[r], got;
      for (int o : want) {
        // With delayed updates the last step's weights go back with the next step.
        const bool deferred = v.delayed && k == kSteps - 1 && s.ops[o].layer >= 0 &&
                              o == s.layers[s.ops[o].layer].weights_return;
        if (!deferred && !when.count({k, o}))
          ADD_FAILURE() << "step " << k << " never ran" << Show(s, {o});
      }
      for (const auto& [key, ran] : when) {
        if (key.first == k && s.ops[key.second].resource == static_cast<int>(r))
          got.push_back(key.second);
      }
      std::sort(got.begin(), got.end(), [&](int a, int b) {
        return when.at({k, a}).start < when.at({k, b}).start;
      });
      if (s.resources[r].in_order) {
        EXPECT_EQ(got, want) << tandem::v1::TimelineResource_Name(s.resources[r].kind) << " step "
                             << k << "\n  schedule:" << Show(s, want)
                             << "\n  executor:" << Show(s, got);
      } else {
        std::sort(got.begin(), got.end());
        std::sort(want.begin(), want.end());
        for (int o : got) EXPECT_TRUE(std::binary_search(want.begin(), want.end(), o));
      }
    }
    // No operation before its dependencies.
    for (int o = 0; o < s.num_ops(); ++o) {
      auto ran = when.find({k, o});
      if (ran == when.end()) continue;
      for (const schedule::Dep& dep : s.ops[o].deps) {
        auto before = when.find({k - dep.lag, dep.op});
        if (before == when.end()) continue;  // before the first step
        const double ready = dep.on_start ? before->second.start : before->second.end;
        EXPECT_GE(ran->second.start, ready)
            << "step " << k << ":" << Show(s, {o}) << " started before" << Show(s, {dep.op})
            << " of step " << k - dep.lag << (dep.on_start ? " started" : " ended");
      }
    }
  }
}

// A job record's program (Job.schedule) is what the executor runs: given it,
// the executor takes it as its program and trains as it would have lowered it.
TEST_P(ScheduleConformanceTest, AStoredProgramIsTheProgramThatRuns) {
  const Variant v = Variants()[GetParam()];
  const Fixture f = MakeFixture(v.job);
  const int batch = f.spec.training().batch_size();
  ExecutorOptions options;
  options.plan = Cases()[v.plan].plan(*f.model, batch);
  options.plan.set_delayed_parameter_update(v.delayed);
  options.optimizer = f.spec.optimizer();
  options.max_batch = batch;
  absl::StatusOr<schedule::Schedule> lowered =
      LowerStepProgram(*f.model, options.plan, options.optimizer, batch);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  std::vector<double> losses[2];
  for (int stored = 0; stored < 2; ++stored) {
    HostAllocator host;
    EmulatedAccelerator device({.capacity_bytes = 64 << 20});
    options.host_allocator = &host;
    options.accelerator = &device;
    options.schedule = stored ? schedule::ToProto(*lowered) : tandem::v1::Schedule();
    absl::StatusOr<std::unique_ptr<PlanExecutor>> executor =
        PlanExecutor::Create(*f.model, options);
    ASSERT_TRUE(executor.ok()) << executor.status();
    EXPECT_TRUE(schedule::SameSchedule((*executor)->schedule(), *lowered));
    EXPECT_EQ((*executor)->program().SerializeAsString(),
              schedule::ToProto(*lowered).SerializeAsString());
    losses[stored] = RunSteps(f, **executor, 3);
  }
  ASSERT_EQ(losses[1].size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(losses[1][k], losses[0][k], 1e-5 * std::abs(losses[0][k])) << "step " << k;
  }
}

// A stored program that is not the plan's lowering (another plan's, or a
// damaged record) never runs: the executor lowers the plan instead, and its
// program() shows the replacement.
TEST(StoredProgramTest, OneThatIsNotThePlansLoweringIsReplaced) {
  const Fixture f = MakeFixture(exec_test::kMlp);
  const int batch = f.spec.training().batch_size();
  const std::vector<Case> cases = Cases();
  ExecutorOptions options;
  options.optimizer = f.spec.optimizer();
  options.max_batch = batch;
  const tandem::v1::Plan gpu_only = cases[0].plan(*f.model, batch);
  tandem::v1::Plan other;
  for (const Case& c : cases) {
    other = c.plan(*f.model, batch);
    if (other.strategy() == tandem::v1::STRATEGY_CPU_ONLY) break;
  }
  ASSERT_EQ(other.strategy(), tandem::v1::STRATEGY_CPU_ONLY);
  absl::StatusOr<schedule::Schedule> lowered =
      LowerStepProgram(*f.model, gpu_only, options.optimizer, batch);
  absl::StatusOr<schedule::Schedule> foreign =
      LowerStepProgram(*f.model, other, options.optimizer, batch);
  ASSERT_TRUE(lowered.ok() && foreign.ok());
  tandem::v1::Schedule damaged = schedule::ToProto(*lowered);
  damaged.mutable_ops(1)->add_deps()->set_op(damaged.ops_size() + 3);
  tandem::v1::Schedule extra_dep = schedule::ToProto(*lowered);
  extra_dep.mutable_ops(1)->add_deps()->set_op(0);  // well-formed, but not the lowering
  for (const tandem::v1::Schedule& stored : {schedule::ToProto(*foreign), damaged, extra_dep}) {
    HostAllocator host;
    EmulatedAccelerator device({.capacity_bytes = 64 << 20});
    options.host_allocator = &host;
    options.accelerator = &device;
    options.plan = gpu_only;
    options.schedule = stored;
    absl::StatusOr<std::unique_ptr<PlanExecutor>> e = PlanExecutor::Create(*f.model, options);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(schedule::SameSchedule((*e)->schedule(), *lowered));
    EXPECT_NE((*e)->program().SerializeAsString(), stored.SerializeAsString());
    EXPECT_EQ(RunSteps(f, **e, 2).size(), 2u);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, ScheduleConformanceTest,
                         testing::Range(0, static_cast<int>(Variants().size())),
                         [](const testing::TestParamInfo<int>& info) {
                           return Variants()[info.param].name;
                         });

}  // namespace
}  // namespace tandem
