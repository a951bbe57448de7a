// The plan executor against the planner's schedule (schedule/lower.h): for
// every plan shape of the executor's tests, a step's measured spans, resource
// by resource, against the schedule's operations. A compute stream must run
// exactly the schedule's operations in the schedule's order; a copy engine or
// the update pool exactly its operations (in the order they became ready);
// and no operation may start before a dependency the schedule gives it (of
// the same step) has ended, or started for a start-dependency.
//
// What this does not show: the executor still builds its span graph from the
// plan itself (plan_executor.cc), and where it waits longer than the schedule
// asks (it offloads a layer's activations after the next layer's forward and
// prefetches when the span two back ends) nothing here fails; see
// docs/architecture.md section 3. Where it starts work earlier than the
// schedule allows, the plan shape is listed in Departs() with the reason.
#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/exec/plan_test_util.h"
#include "schedule/lower.h"

namespace tandem {
namespace {

using exec_test::Case;
using exec_test::Cases;
using exec_test::Fixture;
using exec_test::kMlp;
using exec_test::MakeFixture;
using exec_test::RunSteps;

// What identifies an operation in a timeline: phase, layer and, for compute
// and per-micro-batch copies, the micro-batch.
using Key = std::tuple<int, int, int>;

bool PerMicroBatch(tandem::v1::TimelinePhase phase) {
  switch (phase) {
    case tandem::v1::TIMELINE_PHASE_FORWARD:
    case tandem::v1::TIMELINE_PHASE_BACKWARD:
    case tandem::v1::TIMELINE_PHASE_RECOMPUTE:
    case tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H:
    case tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D:
      return true;
    default:
      return false;
  }
}

Key KeyOf(tandem::v1::TimelinePhase phase, int layer, int micro_batch) {
  return {phase, layer, PerMicroBatch(phase) ? micro_batch : 0};
}

std::string Show(const std::vector<Key>& keys) {
  std::string out;
  for (const Key& k : keys) {
    absl::StrAppend(
        &out, " ",
        tandem::v1::TimelinePhase_Name(static_cast<tandem::v1::TimelinePhase>(std::get<0>(k)))
            .substr(15),
        std::get<1>(k), "/", std::get<2>(k));
  }
  return out;
}

// The schedule of `plan` for `model`: only the operations and their order
// matter here, so only whether a layer has parameters is filled in.
schedule::Schedule Lowered(const Model& model, const tandem::v1::Plan& plan) {
  const schedule::Decisions d = *schedule::DecisionsFromPlan(plan, model.num_layers());
  std::vector<schedule::LayerSizes> sizes(model.num_layers());
  for (int l = 0; l < model.num_layers(); ++l) {
    sizes[l].parameters = model.layer(l).ParamCount() * 4;
    sizes[l].gradients = sizes[l].parameters;
  }
  absl::StatusOr<schedule::Schedule> s = schedule::Lower(d, sizes);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : schedule::Schedule();
}

// Plan shapes the executor does not yet run as scheduled, and why.
const std::map<std::string, std::string>& Departs() {
  static const auto* departs = new std::map<std::string, std::string>{
      {"streamed_offload_recompute",
       "backward(l) reads layer l-1's output, so the executor brings an offloaded layer l-1 "
       "back before backward(l) starts; the schedule fetches it when backward(l) starts, "
       "for backward(l-1)"},
  };
  return *departs;
}

class ScheduleConformanceTest : public testing::TestWithParam<int> {};

TEST_P(ScheduleConformanceTest, EachResourceRunsTheSchedulesOperations) {
  const Fixture f = MakeFixture(kMlp);
  const Case c = Cases()[GetParam()];
  HostAllocator host;
  EmulatedAccelerator device({.capacity_bytes = 64 << 20});
  ExecutorOptions options;
  options.plan = c.plan(*f.model, f.spec.training().batch_size());
  options.optimizer = f.spec.optimizer();
  options.max_batch = f.spec.training().batch_size();
  options.host_allocator = &host;
  options.accelerator = &device;
  absl::StatusOr<std::unique_ptr<PlanExecutor>> executor = PlanExecutor::Create(*f.model, options);
  ASSERT_TRUE(executor.ok()) << executor.status();
  RunSteps(f, **executor, 4);
  const tandem::v1::Timeline measured = (*executor)->last_timeline();
  ASSERT_GT(measured.spans_size(), 0);
  const schedule::Schedule s = Lowered(*f.model, options.plan);

  std::string differences;
  for (size_t r = 0; r < s.resources.size(); ++r) {
    std::vector<Key> want;
    for (int op : s.order[r]) {
      const schedule::Op& o = s.ops[op];
      want.push_back(KeyOf(o.phase, o.layer, o.micro_batch));
    }
    std::vector<std::pair<double, Key>> spans;
    for (const tandem::v1::TimelineSpan& span : measured.spans()) {
      if (span.resource() != s.resources[r].kind) continue;
      spans.push_back(
          {span.start_seconds(), KeyOf(span.phase(), span.layer(), span.micro_batch())});
    }
    std::stable_sort(spans.begin(), spans.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Key> got;
    for (const auto& [start, key] : spans) got.push_back(key);
    if (!s.resources[r].in_order) {
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
    }
    if (want != got) {
      absl::StrAppend(&differences, tandem::v1::TimelineResource_Name(s.resources[r].kind),
                      "\n  schedule:", Show(want), "\n  executor:", Show(got), "\n");
    }
  }
  // Dependencies within the step, between operations a timeline tells apart.
  std::map<std::pair<int, Key>, int> count;
  std::map<std::pair<int, Key>, const tandem::v1::TimelineSpan*> span_of;
  for (const schedule::Op& o : s.ops) {
    ++count[{s.resources[o.resource].kind, KeyOf(o.phase, o.layer, o.micro_batch)}];
  }
  for (const tandem::v1::TimelineSpan& span : measured.spans()) {
    span_of[{span.resource(), KeyOf(span.phase(), span.layer(), span.micro_batch())}] = &span;
  }
  auto find = [&](const schedule::Op& o) -> const tandem::v1::TimelineSpan* {
    const std::pair<int, Key> k = {s.resources[o.resource].kind,
                                   KeyOf(o.phase, o.layer, o.micro_batch)};
    if (count[k] != 1 || !span_of.count(k)) return nullptr;
    return span_of[k];
  };
  for (const schedule::Op& o : s.ops) {
    const tandem::v1::TimelineSpan* span = find(o);
    if (span == nullptr) continue;
    for (const schedule::Dep& d : o.deps) {
      if (d.lag != 0) continue;
      const tandem::v1::TimelineSpan* before = find(s.ops[d.op]);
      if (before == nullptr) continue;
      const double ready = d.on_start ? before->start_seconds() : before->end_seconds();
      if (span->start_seconds() < ready) {
        absl::StrAppend(&differences, span->ShortDebugString(), "\n  started before\n",
                        before->ShortDebugString(), d.on_start ? " started\n" : " ended\n");
      }
    }
  }
  if (Departs().count(c.name)) {
    EXPECT_FALSE(differences.empty())
        << c.name << " now runs as scheduled: remove it from Departs()";
  } else {
    EXPECT_TRUE(differences.empty()) << c.name << "\n" << differences;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, ScheduleConformanceTest, testing::Range(0, 7),
                         [](const testing::TestParamInfo<int>& info) {
                           return Cases()[info.param].name;
                         });

}  // namespace
}  // namespace tandem
