// A Schedule survives the trip through tandem.v1.Schedule for every strategy,
// and a damaged message is refused with the field named.
#include "schedule/schedule_proto.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "schedule/lower.h"
#include "schedule/testing/layer_sizes.h"

namespace tandem::schedule {
namespace {

std::vector<LayerSizes> Sizes(int layers) { return testing::UniformSizes(layers); }

// One lowered schedule per strategy and option the executor runs.
std::vector<Schedule> EveryKind() {
  std::vector<std::pair<Decisions, LowerOptions>> cases;
  auto chain = [](tandem::v1::Strategy strategy) {
    Decisions d;
    d.strategy = strategy;
    d.layers.resize(3);
    d.batch_size = 4;
    d.micro_batch_size = 2;
    return d;
  };
  cases.push_back({chain(tandem::v1::STRATEGY_GPU_ONLY), {}});
  Decisions offload = chain(tandem::v1::STRATEGY_ZERO_OFFLOAD);
  for (LayerDecisions& l : offload.layers) l.update = tandem::v1::PLACEMENT_HOST;
  offload.layers[1].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  offload.layers[2].activation = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
  offload.layers[0].activation = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
  cases.push_back({offload, {}});
  offload.delayed_parameter_update = true;
  cases.push_back({offload, {.has_accelerator = true, .clip_gradients = true}});
  Decisions cpu = chain(tandem::v1::STRATEGY_CPU_ONLY);
  for (LayerDecisions& l : cpu.layers) {
    l.compute = l.update = tandem::v1::PLACEMENT_HOST;
    l.parameter_home = tandem::v1::PARAMETER_HOME_HOST;
  }
  cases.push_back({cpu, {.has_accelerator = false}});
  Decisions hetero = chain(tandem::v1::STRATEGY_HETERO_DP);
  hetero.accelerator_batch_share = 2;
  cases.push_back({hetero, {.has_accelerator = true, .clip_gradients = true}});
  std::vector<Schedule> out;
  for (const auto& [decisions, options] : cases) {
    absl::StatusOr<Schedule> s = Lower(decisions, Sizes(3), options);
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) out.push_back(*std::move(s));
  }
  return out;
}

TEST(ScheduleProtoTest, EveryStrategyRoundTrips) {
  const std::vector<Schedule> schedules = EveryKind();
  ASSERT_EQ(schedules.size(), 5u);
  for (const Schedule& s : schedules) {
    absl::StatusOr<Schedule> back = FromProto(ToProto(s));
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << Describe(s);
    EXPECT_EQ(Describe(*back), Describe(s));
    EXPECT_TRUE(SameSchedule(*back, s));
    EXPECT_EQ(back->resident_bytes, s.resident_bytes);
    EXPECT_EQ(back->lead, s.lead);
    EXPECT_EQ(back->program_resource, s.program_resource);
    ASSERT_EQ(back->layers.size(), s.layers.size());
    for (size_t l = 0; l < s.layers.size(); ++l) {
      EXPECT_EQ(back->layers[l].weights_return, s.layers[l].weights_return);
      EXPECT_EQ(back->layers[l].host_update, s.layers[l].host_update);
    }
  }
}

TEST(ScheduleProtoTest, DifferentProgramsAreNotTheSame) {
  const std::vector<Schedule> schedules = EveryKind();
  ASSERT_EQ(schedules.size(), 5u);
  EXPECT_FALSE(SameSchedule(schedules[0], schedules[1]));
  Schedule moved = schedules[1];
  moved.ops[0].deps.push_back(Dep{1, 1, false});
  EXPECT_FALSE(SameSchedule(moved, schedules[1]));
}

void ExpectRefused(const tandem::v1::Schedule& proto, const std::string& field) {
  absl::StatusOr<Schedule> s = FromProto(proto);
  ASSERT_FALSE(s.ok()) << field;
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find(field), std::string::npos) << s.status();
}

TEST(ScheduleProtoTest, DamagedMessagesNameTheField) {
  const tandem::v1::Schedule good = ToProto(EveryKind().at(1));
  tandem::v1::Schedule bad = good;
  bad.mutable_ops(3)->mutable_deps(0)->set_op(good.ops_size());
  ExpectRefused(bad, "schedule.ops[3].deps[0].op");
  bad = good;
  bad.mutable_ops(0)->set_resource(-1);
  ExpectRefused(bad, "schedule.ops[0].resource");
  bad = good;
  bad.mutable_ops(2)->set_kind(tandem::v1::Schedule::OP_KIND_UNSPECIFIED);
  ExpectRefused(bad, "schedule.ops[2].kind");
  bad = good;
  bad.mutable_order(0)->add_ops(bad.order(0).ops(0));
  ExpectRefused(bad, "twice");
  bad = good;
  bad.mutable_order(0)->mutable_ops()->RemoveLast();
  ExpectRefused(bad, "in no resource's order");
  bad = good;
  bad.mutable_layers(1)->set_host_update(-7);
  ExpectRefused(bad, "schedule.layers[1].host_update");
  bad = good;
  bad.clear_mode();
  ExpectRefused(bad, "schedule.mode");
  bad = good;
  bad.mutable_order()->RemoveLast();
  ExpectRefused(bad, "schedule.order");
}

}  // namespace
}  // namespace tandem::schedule
