#include "schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "schedule/testing/layer_sizes.h"

namespace tandem::schedule {
namespace {

Decisions Chain(int layers, tandem::v1::Strategy strategy) {
  Decisions d;
  d.strategy = strategy;
  d.layers.resize(layers);
  d.batch_size = 4;
  d.micro_batch_size = 2;
  return d;
}

std::vector<LayerSizes> Sizes(int layers) { return testing::UniformSizes(layers); }

// cpu_only: every layer computes, keeps its state and updates on the host.
Decisions CpuChain(int layers) {
  Decisions d = Chain(layers, tandem::v1::STRATEGY_CPU_ONLY);
  for (LayerDecisions& l : d.layers) {
    l.compute = l.update = tandem::v1::PLACEMENT_HOST;
    l.parameter_home = tandem::v1::PARAMETER_HOME_HOST;
  }
  return d;
}

// Every operation is on exactly one resource's order, once, and depends within
// its iteration only on operations written before it (the executor adds them
// in that order).
void ExpectEachOpOrderedOnce(const Schedule& s) {
  for (int o = 0; o < s.num_ops(); ++o) {
    for (const Dep& d : s.ops[o].deps) {
      if (d.lag == 0) {
        EXPECT_LT(d.op, o) << "op " << o << " depends on a later op in its step";
      }
    }
  }
  std::vector<int> seen(s.num_ops(), 0);
  for (size_t r = 0; r < s.order.size(); ++r) {
    for (int op : s.order[r]) {
      ASSERT_EQ(s.ops[op].resource, static_cast<int>(r));
      ++seen[op];
    }
  }
  for (int o = 0; o < s.num_ops(); ++o) EXPECT_EQ(seen[o], 1) << "op " << o;
}

TEST(LowerTest, GpuOnlyIsForwardThenBackwardWithUpdatesOnTheComputeStream) {
  absl::StatusOr<Schedule> s = Lower(Chain(2, tandem::v1::STRATEGY_GPU_ONLY), Sizes(2));
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  const int acc = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE);
  std::vector<std::string> program;
  for (int op : s->order[acc]) {
    program.push_back(
        absl::StrCat(OpKindName(s->ops[op].kind), s->ops[op].layer, "/", s->ops[op].micro_batch));
  }
  EXPECT_EQ(program, (std::vector<std::string>{
                         "forward0/0", "forward1/0", "backward1/0", "backward0/0", "forward0/1",
                         "forward1/1", "backward1/1", "update1/1", "backward0/1", "update0/1"}));
  EXPECT_EQ(s->resident_bytes[0], 2 * (100 + 200));
}

TEST(LowerTest, HostUpdatedLayersCopyTheirGradientDownAndTheirWeightsBack) {
  Decisions d = Chain(2, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  for (LayerDecisions& l : d.layers) l.update = tandem::v1::PLACEMENT_HOST;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(2));
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  for (int l = 0; l < 2; ++l) {
    const LayerMarks& m = s->layers[l];
    ASSERT_GE(m.host_update, 0);
    ASSERT_GE(m.weights_return, 0);
    // The next iteration's first forward waits for the returned weights.
    bool waits = false;
    for (const Dep& dep : s->ops[m.first_forward].deps) {
      waits |= dep.op == m.weights_return && dep.lag == 1;
    }
    EXPECT_TRUE(waits) << "layer " << l;
  }
}

TEST(LowerTest, RejectsAStreamedLayerUpdatedOnTheAccelerator) {
  Decisions d = Chain(2, tandem::v1::STRATEGY_REUSE_DISTANCE);
  d.layers[1].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(2));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("plan.layers[1].update"), std::string::npos) << s.status();
}

TEST(SimulateTest, ResourcesRunInTheirOrderAndIterationsRepeat) {
  absl::StatusOr<Schedule> s = Lower(Chain(3, tandem::v1::STRATEGY_GPU_ONLY), Sizes(3));
  ASSERT_TRUE(s.ok());
  std::vector<double> seconds(s->num_ops(), 1.0);
  absl::StatusOr<Timing> t = Simulate(*s, seconds, 3);
  ASSERT_TRUE(t.ok()) << t.status();
  const int acc = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE);
  double last_end = 0;
  for (int i = 0; i < 3; ++i) {
    for (int op : s->order[acc]) {
      const int x = t->Index(i, op);
      EXPECT_GE(t->start[x], last_end);
      last_end = t->end[x];
    }
  }
  // 2 micro-batches x (3 forward + 3 backward) + 3 updates, back to back.
  EXPECT_DOUBLE_EQ(last_end, 3 * 15.0);
}

// Timing::started and ::ended list every operation once, in time order.
TEST(SimulateTest, StartsAndEndsAreListedInTimeOrder) {
  const int L = 4;
  Decisions d = Chain(L, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  for (LayerDecisions& l : d.layers) l.update = tandem::v1::PLACEMENT_HOST;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(L));
  ASSERT_TRUE(s.ok()) << s.status();
  // Durations that vary, some zero, so that some operations end where they
  // start and several at one instant.
  std::vector<double> seconds(s->num_ops());
  for (int o = 0; o < s->num_ops(); ++o) seconds[o] = (o * 7 % 5) * 0.5;
  const int iterations = 3;
  absl::StatusOr<Timing> t = Simulate(*s, seconds, iterations);
  ASSERT_TRUE(t.ok()) << t.status();
  const int n = iterations * s->num_ops();
  for (const std::vector<int>* listed : {&t->started, &t->ended}) {
    ASSERT_EQ(static_cast<int>(listed->size()), n);
    std::vector<int> seen(n, 0);
    for (int x : *listed) ++seen[x];
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
  }
  for (int k = 1; k < n; ++k) {
    EXPECT_LE(t->start[t->started[k - 1]], t->start[t->started[k]]) << k;
    EXPECT_LE(t->end[t->ended[k - 1]], t->end[t->ended[k]]) << k;
  }
}

// A queue starts the operations that become ready at one instant in program
// order, whichever released them first: here #3 is released (by #0's end)
// before #2 (by #1's), and #2 still runs first.
TEST(SimulateTest, AQueueStartsWhatBecomesReadyTogetherInProgramOrder) {
  Schedule s;
  s.resources = {{tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, 0, 0, true},
                 {tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, 0, 0, true},
                 {tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, 0, 0, false}};
  s.ops.resize(4);
  s.ops[0].resource = 0;
  s.ops[1].resource = 1;
  s.ops[2].resource = 2;
  s.ops[2].deps = {{1, 0, false}};
  s.ops[3].resource = 2;
  s.ops[3].deps = {{0, 0, false}};
  s.order = {{0}, {1}, {2, 3}};
  absl::StatusOr<Timing> t = Simulate(s, {1.0, 1.0, 1.0, 1.0}, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_DOUBLE_EQ(t->start[2], 1.0);
  EXPECT_DOUBLE_EQ(t->start[3], 2.0);
  // Time never runs backwards in the loop: a negative duration is refused.
  t = Simulate(s, {1.0, -1.0, 1.0, 1.0}, 1);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("seconds[1]"), std::string::npos) << t.status();
}

TEST(SimulateTest, ADependencyAgainstTheOrderDeadlocks) {
  absl::StatusOr<Schedule> s = Lower(Chain(2, tandem::v1::STRATEGY_GPU_ONLY), Sizes(2));
  ASSERT_TRUE(s.ok());
  const int acc = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE);
  // The first forward waits for the last backward of its own iteration.
  s->ops[s->order[acc].front()].deps.push_back({s->order[acc].back(), 0, false});
  absl::StatusOr<Timing> t = Simulate(*s, std::vector<double>(s->num_ops(), 1.0), 2);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInternal);
}

// The program of one resource as "kind layer/micro-batch" strings.
std::vector<std::string> Program(const Schedule& s, tandem::v1::TimelineResource kind) {
  std::vector<std::string> program;
  for (int op : s.order[s.ResourceOf(kind)]) {
    program.push_back(
        absl::StrCat(OpKindName(s.ops[op].kind), s.ops[op].layer, "/", s.ops[op].micro_batch));
  }
  return program;
}

bool DependsOn(const Schedule& s, int op, int prerequisite) {
  for (const Dep& d : s.ops[op].deps) {
    if (d.op == prerequisite && d.lag == 0) return true;
  }
  return false;
}

TEST(LowerTest, ClippingHoldsEveryUpdateBackUntilTheNormHasReadEveryGradient) {
  Decisions d = Chain(2, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  d.layers[0].update = tandem::v1::PLACEMENT_HOST;  // layer 1 updates on the accelerator
  LowerOptions options;
  options.clip_gradients = true;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(2), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE),
            (std::vector<std::string>{"forward0/0", "forward1/0", "backward1/0", "backward0/0",
                                      "forward0/1", "forward1/1", "backward1/1", "backward0/1",
                                      "gradient_norm-1/1", "update1/1"}));
  int norm = -1, d2h = -1, host_update = -1;
  for (int o = 0; o < s->num_ops(); ++o) {
    const Op& op = s->ops[o];
    if (op.kind == OpKind::kGradientNorm) norm = o;
    if (op.phase == tandem::v1::TIMELINE_PHASE_GRADIENT_D2H) d2h = o;
    if (op.kind == OpKind::kUpdate && op.replica == kHostReplica) host_update = o;
  }
  ASSERT_GE(d2h, 0);
  ASSERT_GE(host_update, 0);
  EXPECT_LT(d2h, norm);
  EXPECT_TRUE(DependsOn(*s, norm, d2h));
  EXPECT_TRUE(DependsOn(*s, host_update, norm));
  // Without clipping the accelerator update follows its backward at once.
  absl::StatusOr<Schedule> plain = Lower(d, Sizes(2));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Program(*plain, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE).at(7), "update1/1");
}

TEST(LowerTest, ClippingOnTheHostAndInHeteroDp) {
  LowerOptions options;
  options.clip_gradients = true;
  options.has_accelerator = false;
  const Decisions cpu = CpuChain(2);
  absl::StatusOr<Schedule> s = Lower(cpu, Sizes(2), options);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE).back(), "gradient_norm-1/1");
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE),
            (std::vector<std::string>{"update1/1", "update0/1"}));

  Decisions hetero = Chain(2, tandem::v1::STRATEGY_HETERO_DP);
  hetero.accelerator_batch_share = 2;
  options.has_accelerator = true;
  s = Lower(hetero, Sizes(2), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE),
            (std::vector<std::string>{"gradient_average1/0", "gradient_average0/0",
                                      "gradient_norm-1/0", "update1/0", "update0/0"}));
}

// The bucket ALL_REDUCE that sums layer l's gradient, -1 if none.
int BucketOf(const Schedule& s, int l) {
  for (int o = 0; o < s.num_ops(); ++o) {
    const Op& op = s.ops[o];
    if (op.kind == OpKind::kAllReduce && l >= op.layer && l < op.layer + op.bucket_layers) return o;
  }
  return -1;
}

TEST(LowerTest, DataParallelRanksSumEachBucketWhereItsUpdatesReadIt) {
  // Four layers: 3 and 2 update on the accelerator, 1 and 0 on the host.
  Decisions d = Chain(4, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  d.layers[0].update = d.layers[1].update = tandem::v1::PLACEMENT_HOST;
  LowerOptions options;
  options.ranks = 2;
  options.bucket_bytes = 150;  // two 100-byte gradients per bucket
  absl::StatusOr<Schedule> s = Lower(d, Sizes(4), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  const int net = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_NETWORK);
  ASSERT_GE(net, 0);
  EXPECT_TRUE(s->resources[net].in_order);
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_NETWORK),
            (std::vector<std::string>{"all_reduce2/1", "all_reduce0/1"}));
  const int device_bucket = BucketOf(*s, 3), host_bucket = BucketOf(*s, 0);
  EXPECT_EQ(s->ops[device_bucket].bucket_layers, 2);
  EXPECT_EQ(s->ops[device_bucket].bytes, 200);
  EXPECT_EQ(s->ops[device_bucket].replica, kAcceleratorReplica);
  EXPECT_EQ(s->ops[host_bucket].replica, kHostReplica);
  EXPECT_EQ(BucketOf(*s, 1), host_bucket);
  // The accelerator's updates follow the last backward, each after its bucket.
  EXPECT_EQ(
      Program(*s, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE),
      (std::vector<std::string>{
          "forward0/0", "forward1/0", "forward2/0", "forward3/0", "backward3/0", "backward2/0",
          "backward1/0", "backward0/0", "forward0/1", "forward1/1", "forward2/1", "forward3/1",
          "backward3/1", "backward2/1", "backward1/1", "backward0/1", "update3/1", "update2/1"}));
  for (int o = 0; o < s->num_ops(); ++o) {
    const Op& op = s->ops[o];
    if (op.kind == OpKind::kUpdate) {
      EXPECT_TRUE(DependsOn(*s, o, BucketOf(*s, op.layer))) << o;
    }
    // The host bucket sums the gradients once they are down.
    if (op.phase == tandem::v1::TIMELINE_PHASE_GRADIENT_D2H) {
      EXPECT_TRUE(DependsOn(*s, host_bucket, o));
    }
  }
  // The step still runs to the end under the execution rules.
  absl::StatusOr<Timing> t = Simulate(*s, std::vector<double>(s->num_ops(), 1.0), 3);
  EXPECT_TRUE(t.ok()) << t.status();
}

// The REDUCE_SCATTER (or ALL_GATHER) of the host bucket holding layer l, -1.
int HostBucketOf(const Schedule& s, int l, OpKind kind) {
  for (int o = 0; o < s.num_ops(); ++o) {
    const Op& op = s.ops[o];
    if (op.kind == kind && l >= op.layer && l < op.layer + op.bucket_layers) return o;
  }
  return -1;
}

TEST(LowerTest, PartitionedHostStateScattersTheHostBucketsAndGathersTheWeights) {
  // As above: 3 and 2 update on the accelerator, 1 and 0 on the host; layer 1
  // streams its weights, layer 0 keeps them resident.
  Decisions d = Chain(4, tandem::v1::STRATEGY_ZERO_OFFLOAD);
  d.layers[0].update = d.layers[1].update = tandem::v1::PLACEMENT_HOST;
  d.layers[1].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  LowerOptions options;
  options.ranks = 4;
  options.bucket_bytes = 0;  // a bucket per layer
  options.partition_host_state = true;
  const std::vector<LayerSizes> sizes = Sizes(4);
  absl::StatusOr<Schedule> s = Lower(d, sizes, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  // The accelerator's buckets are all-reduced; the host's scattered, then
  // gathered after every sum.
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_NETWORK),
            (std::vector<std::string>{"all_reduce3/1", "all_reduce2/1", "reduce_scatter1/1",
                                      "reduce_scatter0/1", "all_gather1/1", "all_gather0/1"}));
  for (int l : {0, 1}) {
    const int scatter = HostBucketOf(*s, l, OpKind::kReduceScatter);
    const int gather = HostBucketOf(*s, l, OpKind::kAllGather);
    ASSERT_GE(scatter, 0);
    ASSERT_GE(gather, 0);
    EXPECT_EQ(s->ops[scatter].replica, kHostReplica);
    const int update = s->layers[l].host_update;
    EXPECT_TRUE(DependsOn(*s, update, scatter)) << l;
    EXPECT_TRUE(DependsOn(*s, gather, update)) << l;
  }
  // Layer 0's weights go back once gathered; layer 1's next prefetch waits for
  // its gather one step back.
  const int back = s->layers[0].weights_return;
  ASSERT_GE(back, 0);
  EXPECT_TRUE(DependsOn(*s, back, HostBucketOf(*s, 0, OpKind::kAllGather)));
  bool prefetch_waits = false;
  for (const Op& op : s->ops) {
    if (op.layer != 1 || op.tensor != TensorKind::kWeights || !op.delivers_update) continue;
    for (const Dep& dep : op.deps) {
      prefetch_waits |= dep.lag == 1 && dep.op == HostBucketOf(*s, 1, OpKind::kAllGather);
    }
  }
  EXPECT_TRUE(prefetch_waits);
  // The host keeps a quarter of the host-updated layers' state (rounded up).
  options.partition_host_state = false;
  absl::StatusOr<Schedule> replicated = Lower(d, sizes, options);
  ASSERT_TRUE(replicated.ok());
  const int64_t state = sizes[0].optimizer_state + sizes[1].optimizer_state;
  const int64_t quarter = (sizes[0].optimizer_state + 3) / 4 + (sizes[1].optimizer_state + 3) / 4;
  EXPECT_EQ(replicated->resident_bytes[1] - s->resident_bytes[1], state - quarter);
  absl::StatusOr<Timing> t = Simulate(*s, std::vector<double>(s->num_ops(), 1.0), 3);
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(LowerTest, PartitionedCpuOnlyForwardWaitsForTheGather) {
  LowerOptions options;
  options.ranks = 2;
  options.bucket_bytes = 0;
  options.clip_gradients = true;
  options.has_accelerator = false;
  options.partition_host_state = true;
  absl::StatusOr<Schedule> s = Lower(CpuChain(2), Sizes(2), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_NETWORK),
            (std::vector<std::string>{"reduce_scatter1/1", "reduce_scatter0/1", "all_gather1/1",
                                      "all_gather0/1"}));
  for (int l : {0, 1}) {
    const int gather = HostBucketOf(*s, l, OpKind::kAllGather);
    bool waits = false;
    for (const Dep& dep : s->ops[s->layers[l].first_forward].deps) {
      waits |= dep.op == gather && dep.lag == 1;
    }
    EXPECT_TRUE(waits) << l;
    EXPECT_TRUE(
        DependsOn(*s, s->layers[l].host_update, HostBucketOf(*s, l, OpKind::kReduceScatter)));
  }
  absl::StatusOr<Timing> t = Simulate(*s, std::vector<double>(s->num_ops(), 1.0), 3);
  EXPECT_TRUE(t.ok()) << t.status();
}

TEST(LowerTest, DataParallelOnTheHostWithClippingAndRefusedForHeteroDp) {
  LowerOptions options;
  options.ranks = 4;
  options.bucket_bytes = 0;  // a bucket per layer
  options.clip_gradients = true;
  options.has_accelerator = false;
  const Decisions cpu = CpuChain(2);
  absl::StatusOr<Schedule> s = Lower(cpu, Sizes(2), options);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_NETWORK),
            (std::vector<std::string>{"all_reduce1/1", "all_reduce0/1"}));
  int norm = -1;
  for (int o = 0; o < s->num_ops(); ++o) {
    if (s->ops[o].kind == OpKind::kGradientNorm) norm = o;
  }
  ASSERT_GE(norm, 0);
  EXPECT_TRUE(DependsOn(*s, norm, BucketOf(*s, 0)));
  EXPECT_TRUE(DependsOn(*s, norm, BucketOf(*s, 1)));
  absl::StatusOr<Timing> t = Simulate(*s, std::vector<double>(s->num_ops(), 1.0), 3);
  EXPECT_TRUE(t.ok()) << t.status();

  Decisions hetero = Chain(2, tandem::v1::STRATEGY_HETERO_DP);
  hetero.accelerator_batch_share = 2;
  options.has_accelerator = true;
  s = Lower(hetero, Sizes(2), options);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("hetero_dp"), std::string::npos) << s.status();
}

// Streamed optimizer state: each layer's state comes in for its accelerator
// update and goes back after it, at most two layers' state on the device.
TEST(LowerTest, StreamedStateComesInForTheUpdateAndGoesBackTwoLayersAtATime) {
  const int L = 4;
  Decisions d = Chain(L, tandem::v1::STRATEGY_REUSE_DISTANCE);
  for (LayerDecisions& l : d.layers) l.stream_state = true;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(L));
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectEachOpOrderedOnce(*s);
  // Only the weights stay on the accelerator; the state lives on the host.
  EXPECT_EQ(s->resident_bytes[0], L * 100);
  EXPECT_EQ(s->resident_bytes[1], L * 200);
  const int h2d = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_COPY_H2D);
  const int d2h = s->ResourceOf(tandem::v1::TIMELINE_RESOURCE_COPY_D2H);
  for (int l = 0; l < L; ++l) {
    const LayerMarks& m = s->layers[l];
    ASSERT_GE(m.state_in, 0) << l;
    ASSERT_GE(m.state_out, 0) << l;
    const Op& in = s->ops[m.state_in];
    const Op& out = s->ops[m.state_out];
    EXPECT_EQ(in.resource, h2d);
    EXPECT_EQ(out.resource, d2h);
    EXPECT_EQ(in.tensor, TensorKind::kOptimizerState);
    EXPECT_EQ(in.bytes, 200);
    EXPECT_EQ(in.phase, tandem::v1::TIMELINE_PHASE_STATE_H2D);
    EXPECT_EQ(out.phase, tandem::v1::TIMELINE_PHASE_STATE_D2H);
    // The update on the compute stream waits for the state, which goes
    // back once it has run, before the next step brings it in again.
    const int u = m.reuse_start;
    EXPECT_EQ(s->ops[u].kind, OpKind::kUpdate);
    EXPECT_TRUE(DependsOn(*s, u, m.state_in)) << l;
    EXPECT_TRUE(DependsOn(*s, m.state_out, u)) << l;
    bool after_last_out = false;
    for (const Dep& dep : in.deps) after_last_out |= dep.op == m.state_out && dep.lag == 1;
    EXPECT_TRUE(after_last_out) << l;
    // No weights return and no gradient copy: the update was on the device.
    EXPECT_LT(m.weights_return, 0) << l;
  }
  // Copies ten times slower than compute: the device never holds more than
  // two layers' state (200 bytes each) at once.
  std::vector<double> seconds(s->num_ops(), 1.0);
  for (int o = 0; o < s->num_ops(); ++o) {
    if (s->ops[o].tensor == TensorKind::kOptimizerState) seconds[o] = 10.0;
  }
  absl::StatusOr<Timing> t = Simulate(*s, seconds, 3);
  ASSERT_TRUE(t.ok()) << t.status();
  std::vector<std::pair<double, int>> events;
  for (int i = 0; i < 3; ++i) {
    for (int l = 0; l < L; ++l) {
      events.push_back({t->start[t->Index(i, s->layers[l].state_in)], +1});
      events.push_back({t->end[t->Index(i, s->layers[l].state_out)], -1});
    }
  }
  std::sort(events.begin(), events.end());  // a release before a start at the same time
  int held = 0, most = 0;
  for (const auto& [time, delta] : events) most = std::max(most, held += delta);
  EXPECT_EQ(most, 2);
}

TEST(LowerTest, StreamedStateNeedsAnAcceleratorUpdateToResidentWeights) {
  Decisions d = Chain(2, tandem::v1::STRATEGY_REUSE_DISTANCE);
  d.layers[1].stream_state = true;
  d.layers[1].update = tandem::v1::PLACEMENT_HOST;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(2));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("plan.layers[1].stream_optimizer_state"), std::string::npos)
      << s.status();
  d.layers[1].update = tandem::v1::PLACEMENT_ACCELERATOR;
  d.layers[1].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  EXPECT_EQ(Lower(d, Sizes(2)).status().code(), absl::StatusCode::kInvalidArgument);
  d.layers[1].parameter_home = tandem::v1::PARAMETER_HOME_ACCELERATOR;
  EXPECT_TRUE(Lower(d, Sizes(2)).ok());
  Decisions cpu = CpuChain(2);
  cpu.layers[0].stream_state = true;
  s = Lower(cpu, Sizes(2));
  EXPECT_NE(s.status().message().find("plan.layers[0].stream_optimizer_state"), std::string::npos)
      << s.status();
}

// On a data-parallel rank a streamed update waits for its bucket's sum as
// well as for its state (no lag: every update follows the buckets), and its
// state goes back after it; the state is not partitioned with the host's.
TEST(LowerTest, AStreamedUpdateOnARankWaitsForItsBucketsSumAndItsState) {
  Decisions d = Chain(3, tandem::v1::STRATEGY_REUSE_DISTANCE);
  d.layers[1].stream_state = true;
  d.layers[2].update = tandem::v1::PLACEMENT_HOST;
  d.state_update_lag = 1;
  LowerOptions ranks;
  ranks.ranks = 2;
  ranks.partition_host_state = true;
  absl::StatusOr<Schedule> s = Lower(d, Sizes(3), ranks);
  ASSERT_TRUE(s.ok()) << s.status();
  int update = -1, state_in = -1, state_out = -1;
  for (int o = 0; o < s->num_ops(); ++o) {
    const Op& op = s->ops[o];
    if (op.layer != 1) continue;
    if (op.kind == OpKind::kUpdate) update = o;
    if (op.phase == tandem::v1::TIMELINE_PHASE_STATE_H2D) state_in = o;
    if (op.phase == tandem::v1::TIMELINE_PHASE_STATE_D2H) state_out = o;
  }
  ASSERT_GE(update, 0);
  ASSERT_GE(state_in, 0);
  ASSERT_GE(state_out, 0);
  bool after_sum = false, after_state = false;
  for (const Dep& dep : s->ops[update].deps) {
    const Op& pre = s->ops[dep.op];
    after_sum |= pre.kind == OpKind::kAllReduce && pre.layer <= 1 &&
                 1 < pre.layer + pre.bucket_layers && !dep.on_start;
    after_state |= dep.op == state_in && !dep.on_start;
  }
  EXPECT_TRUE(after_sum) << "the update waits for its bucket's ALL_REDUCE";
  EXPECT_TRUE(after_state);
  bool back_after = false;
  for (const Dep& dep : s->ops[state_out].deps) back_after |= dep.op == update;
  EXPECT_TRUE(back_after);
  // The rank's host holds the streamed layer's whole state; only the
  // host-updated layer's is cut in two.
  absl::StatusOr<Schedule> alone = Lower(d, Sizes(3), LowerOptions());
  ASSERT_TRUE(alone.ok()) << alone.status();
  auto host_bytes = [](const Schedule& x) {
    for (size_t p = 0; p < x.pools.size(); ++p) {
      if (x.pools[p].host) return x.resident_bytes[p];
    }
    return int64_t{-1};
  };
  const int64_t cut = Sizes(3)[2].optimizer_state;
  EXPECT_EQ(host_bytes(*alone) - host_bytes(*s), cut - (cut + 1) / 2);
}

// A lagged streamed update waits behind the backward of the layer `lag`
// below it, whether or not that layer has parameters; those still waiting
// when backward reaches the first layer follow it, even when it has none.
TEST(LowerTest, LaggedStreamedUpdatesRunAfterTheLaterBackwardEvenOfLayersWithoutParameters) {
  const int L = 5;
  std::vector<LayerSizes> sizes = Sizes(L);
  for (int l : {0, 2}) sizes[l] = LayerSizes{.activations = 50, .workspace = 10};
  Decisions d = Chain(L, tandem::v1::STRATEGY_REUSE_DISTANCE);
  d.micro_batch_size = d.batch_size;
  for (LayerDecisions& l : d.layers) l.stream_state = true;
  d.state_update_lag = 1;
  absl::StatusOr<Schedule> s = Lower(d, sizes);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Program(*s, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE),
            (std::vector<std::string>{"forward0/0", "forward1/0", "forward2/0", "forward3/0",
                                      "forward4/0", "backward4/0", "backward3/0", "update4/0",
                                      "backward2/0", "update3/0", "backward1/0", "backward0/0",
                                      "update1/0"}));
}

}  // namespace
}  // namespace tandem::schedule
