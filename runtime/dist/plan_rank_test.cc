// Data-parallel ranks running plans on emulated accelerators (threads joined
// over Gloo's TCP transport on loopback) against one replica of the same job on
// the CPU engine: for every plan shape a rank can run (accelerator-resident,
// ZeRO-Offload's CPU updates, reuse-distance updates split between host and
// accelerator, streamed weights with offloaded and recomputed activations,
// micro-batches, cpu_only, optimizer state streamed in for accelerator
// updates beside host and resident ones), 2 and 4 ranks give the one
// replica's losses for 20
// steps within 1e-4, and every rank ends with the same weights. The step
// program has a bucket ALL_REDUCE for the host's gradients and one for the
// accelerator's wherever the plan puts both. With ZeRO-partitioned host state
// the same holds, each rank keeping only its pieces of the host's optimizer
// state, and a partitioned checkpoint resumes to the uninterrupted run's
// losses.
#include "runtime/dist/plan_rank.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/cpu/onednn.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/plan_test_util.h"
#include "spec/precision.h"

namespace tandem {
namespace {

using exec_test::Case;
using exec_test::Cases;
using exec_test::Fixture;
using exec_test::MakeFixture;

struct RankRun {
  std::vector<double> losses;
  std::vector<float> params;
  int host_buckets = 0, device_buckets = 0, gathers = 0;
  CollectiveStats gradients;
  // The last step's collective times (DistributedStats).
  double step_gradient_seconds = 0, step_other_seconds = 0;
  // Floats per moment of optimizer state the rank's host keeps, and fp32
  // master weights.
  int64_t host_state = 0, master_weights = 0;
  int64_t peak_host_bytes = 0;
};

std::vector<RankRun> RunRanks(const Fixture& f, const Case& c, int ranks, int64_t bucket_bytes,
                              int steps,
                              OptimizerSharding sharding = OptimizerSharding::kReplicated,
                              bool working_copies = false) {
  gloo::rendezvous::HashStore store;
  std::vector<RankRun> runs(ranks);
  std::vector<std::thread> threads;
  const int64_t batch = f.spec.training().batch_size();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions copts;
      copts.timeout = absl::Seconds(120);
      auto comm = Communicator::Connect(store, "plan_dp", r, ranks, copts);
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto control = Communicator::Connect(store, "plan_dp_control", r, ranks, copts);
      ASSERT_TRUE(control.ok()) << control.status();
      HostAllocator host;
      EmulatedAccelerator device({.capacity_bytes = 64 << 20, .link_bytes_per_second = 2e9}, r);
      ExecutorOptions options;
      options.plan = c.plan(*f.model, static_cast<int>(batch / ranks));
      options.optimizer = f.spec.optimizer();
      options.max_batch = batch / ranks;
      options.init_seed = f.spec.training().seed();
      options.host_allocator = &host;
      options.accelerator = &device;
      options.test_working_copies = working_copies;
      DataParallelOptions dp;
      dp.bucket_bytes = bucket_bytes;
      dp.sharding = sharding;
      auto runner = PlanRankRunner::Create(*f.model, options, batch, *std::move(comm),
                                           *std::move(control), dp);
      ASSERT_TRUE(runner.ok()) << runner.status();
      RankRun& run = runs[r];
      run.losses = exec_test::RunSteps(f, **runner, steps);
      ASSERT_TRUE((*runner)->SyncStateToHost().ok());
      const HostStateView state = (*runner)->host_state();
      run.params.assign(state.params, state.params + f.model->parameter_elements());
      const tandem::v1::Schedule program = (*runner)->program();
      for (const auto& op : program.ops()) {
        if (op.kind() == tandem::v1::Schedule::OP_KIND_ALL_GATHER) ++run.gathers;
        if (op.kind() != tandem::v1::Schedule::OP_KIND_ALL_REDUCE &&
            op.kind() != tandem::v1::Schedule::OP_KIND_REDUCE_SCATTER) {
          continue;
        }
        ++(op.host_replica() ? run.host_buckets : run.device_buckets);
      }
      run.gradients = (*runner)->gradient_stats();
      run.step_gradient_seconds = (*runner)->distributed_stats().step_gradient_seconds();
      run.step_other_seconds = (*runner)->distributed_stats().step_other_seconds();
      run.host_state = (*runner)->distributed_stats().optimizer_elements();
      run.master_weights = (*runner)->distributed_stats().master_weight_elements();
      run.peak_host_bytes = (*runner)->peak_host_bytes();
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

struct RankCase {
  const char* model;
  const char* yaml;
  int plan;  // index into Cases()
  int ranks;
  int64_t bucket_bytes;
};

// Every rank's losses within 1e-4 of one replica's and its weights rank 0's;
// returns the largest loss difference.
double ExpectOneReplica(const RankCase& rc, const std::string& plan,
                        const std::vector<RankRun>& runs, const std::vector<double>& reference) {
  double worst = 0;
  for (int r = 0; r < rc.ranks; ++r) {
    EXPECT_EQ(runs[r].losses.size(), reference.size()) << "rank " << r;
    for (size_t s = 0; s < reference.size() && s < runs[r].losses.size(); ++s) {
      EXPECT_NEAR(runs[r].losses[s], reference[s], 1e-4)
          << rc.model << " " << plan << " on " << rc.ranks << " ranks, rank " << r << " step " << s;
      worst = std::max(worst, std::abs(runs[r].losses[s] - reference[s]));
    }
    EXPECT_EQ(0, std::memcmp(runs[r].params.data(), runs[0].params.data(),
                             runs[0].params.size() * sizeof(float)))
        << "rank " << r;
    EXPECT_GT(runs[r].gradients.bytes, 0);
    EXPECT_GE(runs[r].host_buckets + runs[r].device_buckets, 1);
  }
  return worst;
}

class PlanRankTest : public testing::TestWithParam<RankCase> {};

TEST_P(PlanRankTest, TwentyStepsMatchOneReplica) {
  const RankCase& rc = GetParam();
  const Fixture f = MakeFixture(rc.yaml);
  const Case c = Cases()[rc.plan];
  const int steps = 20;
  const std::vector<double> reference = exec_test::Reference(f, steps);
  const std::vector<RankRun> runs = RunRanks(f, c, rc.ranks, rc.bucket_bytes, steps);
  const double worst = ExpectOneReplica(rc, c.name, runs, reference);
  std::cout << rc.model << " " << c.name << " on " << rc.ranks
            << " ranks: " << runs[0].device_buckets << " accelerator and " << runs[0].host_buckets
            << " host buckets, loss " << runs[0].losses.front() << " -> " << runs[0].losses.back()
            << ", one replica " << reference.front() << " -> " << reference.back()
            << ", worst difference " << worst << "\n";
}

// Cases(): 0 gpu_only, 1 zero_offload, 2 reuse_distance (host and accelerator
// updates), 3 streamed_offload_recompute, 4 micro_batches, 5 cpu_only,
// 7 streamed_state (the three update places: state streamed in for an
// accelerator update, host, resident).
INSTANTIATE_TEST_SUITE_P(
    Plans, PlanRankTest,
    testing::Values(
        RankCase{"mlp", exec_test::kMlp, 0, 2, 0}, RankCase{"mlp", exec_test::kMlp, 1, 2, 25 << 20},
        RankCase{"mlp", exec_test::kMlp, 2, 2, 0}, RankCase{"mlp", exec_test::kMlp, 3, 2, 0},
        RankCase{"mlp", exec_test::kMlp, 4, 2, 0}, RankCase{"mlp", exec_test::kMlp, 5, 2, 0},
        RankCase{"mlp", exec_test::kMlp, 2, 4, 0}, RankCase{"gpt", exec_test::kGpt, 2, 2, 0},
        RankCase{"gpt", exec_test::kGpt, 3, 4, 25 << 20}, RankCase{"mlp", exec_test::kMlp, 7, 2, 0},
        RankCase{"gpt", exec_test::kGpt, 7, 2, 25 << 20}),
    [](const testing::TestParamInfo<RankCase>& info) {
      return std::string(info.param.model) + "_" + Cases()[info.param.plan].name + "_" +
             std::to_string(info.param.ranks) + "_ranks";
    });

// In bf16 the host-updated layers keep working copies on each rank's
// accelerator, and the host widens their bf16 gradients before the
// all-reduce (or reduce-scatter; partitioned, the copies are rounded once the
// weights are gathered): two ranks under reuse_distance (host and accelerator
// updates, clipping) follow the CPU engine in bf16 within bf16's tolerance (as
// one replica does, plan_executor_test), and end with the same weights.
class Bf16PlanRankTest : public testing::TestWithParam<OptimizerSharding> {};

TEST_P(Bf16PlanRankTest, WorkingCopiesMatchTheCpuEngineInBf16) {
  if (!NativeBf16Isa(cpu::OneDnnIsa())) {
    GTEST_SKIP() << "oneDNN runs " << cpu::OneDnnIsa() << " here: no native bf16";
  }
  const Fixture f = MakeFixture(exec_test::kGpt, DType::kBF16);
  const int steps = 20;
  const std::vector<double> reference = exec_test::Reference(f, steps);
  const std::vector<RankRun> runs = RunRanks(f, Cases()[2], 2, 0, steps, GetParam());
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(runs[r].losses.size(), reference.size()) << "rank " << r;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(runs[r].losses[s], reference[s], 8e-3 * std::abs(reference[s]))
          << "rank " << r << " step " << s;
    }
    EXPECT_EQ(0, std::memcmp(runs[r].params.data(), runs[0].params.data(),
                             runs[0].params.size() * sizeof(float)))
        << "rank " << r;
    EXPECT_GT(runs[r].host_buckets, 0);
    EXPECT_EQ(runs[r].gathers,
              GetParam() == OptimizerSharding::kPartitioned ? runs[r].host_buckets : 0);
    // Partitioned, the rank keeps the masters it keeps moments of.
    EXPECT_EQ(runs[r].master_weights, GetParam() == OptimizerSharding::kPartitioned
                                          ? runs[r].host_state
                                          : f.model->parameter_elements());
  }
}

// ZeRO-Offload's mixed precision on many ranks: each rank keeps its pieces of
// the fp32 master weights with their moments, and the ranks gather bf16
// working copies. Under zero_offload (every layer updated on the host) two
// partitioned ranks follow two replicated ones, and each holds less host
// memory by at least half the masters and half of Adam's moments, with the
// gathers moving 2 bytes a weight. The bookkeeping is precision's, not the
// products': the model computes in fp32 on widened working copies
// (ExecutorOptions::test_working_copies), so this runs where oneDNN has no
// bf16 (the bf16 model's ranks: WorkingCopiesMatchTheCpuEngineInBf16).
TEST(PlanRankTest, PartitionedWorkingCopyRanksKeepPiecesOfTheMasterWeights) {
  const Fixture f = MakeFixture(exec_test::kGpt);
  const int steps = 10;
  const std::vector<RankRun> replicated =
      RunRanks(f, Cases()[1], 2, 0, steps, OptimizerSharding::kReplicated, true);
  const std::vector<RankRun> partitioned =
      RunRanks(f, Cases()[1], 2, 0, steps, OptimizerSharding::kPartitioned, true);
  const int64_t P = f.model->parameter_elements();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(partitioned[r].losses.size(), static_cast<size_t>(steps)) << "rank " << r;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(partitioned[r].losses[s], replicated[0].losses[s],
                  1e-3 * std::abs(replicated[0].losses[s]))
          << "rank " << r << " step " << s;
    }
    EXPECT_EQ(0, std::memcmp(partitioned[r].params.data(), partitioned[0].params.data(),
                             P * sizeof(float)))
        << "rank " << r;
    const int64_t pieces = partitioned[r].host_buckets;
    EXPECT_LE(partitioned[r].master_weights, P / 2 + pieces) << "rank " << r;
    EXPECT_EQ(replicated[r].master_weights, P);
    // Masters (4 bytes) and Adam's two moments (8) of half the weights.
    EXPECT_GE(replicated[r].peak_host_bytes - partitioned[r].peak_host_bytes, 12 * (P / 2 - pieces))
        << "rank " << r;
  }
  // A step sends, per rank, (N-1)/N of: replicated an fp32 all-reduce, 8
  // bytes a weight; partitioned an fp32 reduce-scatter (4) and the bf16
  // gather (2), 3/4 of that (an fp32 gather made it as much). The
  // partitioned run's SyncStateToHost gathered the fp32 masters once (4).
  const double sent = static_cast<double>(partitioned[0].gradients.bytes) /
                      static_cast<double>(replicated[0].gradients.bytes);
  EXPECT_NEAR(sent, (6.0 * steps + 4) / (8.0 * steps), 0.01);
  std::cout << "gpt zero_offload, working copies, on 2 ranks: peak host "
            << replicated[0].peak_host_bytes << " B replicated, " << partitioned[0].peak_host_bytes
            << " B partitioned; masters " << partitioned[0].master_weights << " of " << P
            << "; bytes sent x" << sent << "; loss " << partitioned[0].losses.back() << " against "
            << replicated[0].losses.back() << "\n";
}

INSTANTIATE_TEST_SUITE_P(Shardings, Bf16PlanRankTest,
                         testing::Values(OptimizerSharding::kReplicated,
                                         OptimizerSharding::kPartitioned),
                         [](const testing::TestParamInfo<OptimizerSharding>& info) {
                           return info.param == OptimizerSharding::kPartitioned
                                      ? std::string("partitioned")
                                      : std::string("replicated");
                         });

// The weights of the layers a plan updates on the host, of those with
// weights.
int64_t HostUpdatedWeights(const Fixture& f, const tandem::v1::Plan& plan) {
  int64_t n = 0;
  for (int l = 0; l < f.model->num_layers(); ++l) {
    if (plan.strategy() == tandem::v1::STRATEGY_CPU_ONLY ||
        plan.layers(l).update() == tandem::v1::PLACEMENT_HOST) {
      n += f.model->param_slice(l);
    }
  }
  return n;
}

class PartitionedPlanRankTest : public testing::TestWithParam<RankCase> {};

// ZeRO-Offload on many ranks: the host buckets are reduce-scattered, each rank
// updates its pieces with their state alone and the ranks gather the weights.
// Same losses as one replica, same weights on every rank, and the host keeps
// 1/N of the host-updated layers' state (pieces differ by at most a float per
// bucket) plus the whole state of the layers the accelerator updates.
TEST_P(PartitionedPlanRankTest, TwentyStepsMatchOneReplicaWithAPieceOfTheState) {
  const RankCase& rc = GetParam();
  const Fixture f = MakeFixture(rc.yaml);
  const Case c = Cases()[rc.plan];
  const int steps = 20;
  const std::vector<double> reference = exec_test::Reference(f, steps);
  const std::vector<RankRun> runs =
      RunRanks(f, c, rc.ranks, rc.bucket_bytes, steps, OptimizerSharding::kPartitioned);
  const tandem::v1::Plan plan =
      c.plan(*f.model, static_cast<int>(f.spec.training().batch_size() / rc.ranks));
  const int64_t P = f.model->parameter_elements();
  const int64_t host = HostUpdatedWeights(f, plan);
  ASSERT_GT(host, 0) << c.name << " updates nothing on the host";
  const double worst = ExpectOneReplica(rc, c.name, runs, reference);
  int64_t kept = 0;
  for (int r = 0; r < rc.ranks; ++r) {
    EXPECT_GT(runs[r].host_buckets, 0);
    EXPECT_EQ(runs[r].gathers, runs[r].host_buckets) << "one ALL_GATHER per host bucket";
    // The latest step's reduce-scatters are its gradient time, its
    // all-gathers the rest: both ran; and neither holds the final
    // SyncStateToHost's gathers, which came after the step.
    EXPECT_GT(runs[r].step_gradient_seconds, 0) << "rank " << r;
    EXPECT_GT(runs[r].step_other_seconds, 0) << "rank " << r;
    EXPECT_LT(runs[r].step_gradient_seconds + runs[r].step_other_seconds, runs[r].gradients.seconds)
        << "rank " << r;
    EXPECT_LE(runs[r].host_state, P - host + host / rc.ranks + runs[r].host_buckets)
        << "rank " << r;
    EXPECT_GE(runs[r].host_state, P - host + host / rc.ranks - runs[r].host_buckets)
        << "rank " << r;
    kept += runs[r].host_state - (P - host);
  }
  EXPECT_EQ(kept, host) << "the pieces cover the host's state once";
  std::cout << rc.model << " " << c.name << " on " << rc.ranks
            << " ranks, partitioned: " << runs[0].host_buckets << " host buckets; rank 0 keeps "
            << runs[0].host_state << " of " << P << " floats per moment (" << host
            << " updated on the host); loss " << runs[0].losses.front() << " -> "
            << runs[0].losses.back() << ", one replica " << reference.front() << " -> "
            << reference.back() << ", worst difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(Plans, PartitionedPlanRankTest,
                         testing::Values(RankCase{"mlp", exec_test::kMlp, 1, 2, 25 << 20},
                                         RankCase{"mlp", exec_test::kMlp, 2, 4, 0},
                                         RankCase{"mlp", exec_test::kMlp, 3, 2, 0},
                                         RankCase{"mlp", exec_test::kMlp, 4, 2, 0},
                                         RankCase{"mlp", exec_test::kMlp, 5, 2, 0},
                                         RankCase{"gpt", exec_test::kGpt, 1, 2, 0},
                                         RankCase{"gpt", exec_test::kGpt, 3, 4, 25 << 20},
                                         RankCase{"mlp", exec_test::kMlp, 7, 2, 0},
                                         RankCase{"gpt", exec_test::kGpt, 7, 4, 0}),
                         [](const testing::TestParamInfo<RankCase>& info) {
                           return std::string(info.param.model) + "_" +
                                  Cases()[info.param.plan].name + "_" +
                                  std::to_string(info.param.ranks) + "_ranks";
                         });

// Delayed parameter updates (weights one update old): the partitioned ranks'
// gathers and copies back interleave with the next step as the replicated
// ranks' updates do, and give the same losses.
TEST(PlanRankTest, DelayedUpdatesPartitionedFollowReplicated) {
  const Fixture f = MakeFixture(exec_test::kMlp);
  const Case c{"zero_offload_delayed",
               [](const Model& m, int b) {
                 tandem::v1::Plan plan = Cases()[1].plan(m, b);
                 plan.set_delayed_parameter_update(true);
                 return plan;
               },
               0};
  const int steps = 20;
  const std::vector<RankRun> replicated =
      RunRanks(f, c, 2, 0, steps, OptimizerSharding::kReplicated);
  const std::vector<RankRun> partitioned =
      RunRanks(f, c, 2, 0, steps, OptimizerSharding::kPartitioned);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(partitioned[r].losses.size(), static_cast<size_t>(steps)) << "rank " << r;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(partitioned[r].losses[s], replicated[0].losses[s], 1e-5)
          << "rank " << r << " step " << s;
    }
    EXPECT_EQ(0, std::memcmp(partitioned[r].params.data(), partitioned[0].params.data(),
                             partitioned[0].params.size() * sizeof(float)))
        << "rank " << r;
    EXPECT_GT(partitioned[r].gathers, 0);
  }
}

TEST(PlanRankTest, RefusesWhatItCannotRun) {
  const Fixture f = MakeFixture(exec_test::kMlp);
  gloo::rendezvous::HashStore store;
  auto comm = Communicator::Connect(store, "one", 0, 1, CommunicatorOptions());
  ASSERT_TRUE(comm.ok());
  HostAllocator host;
  EmulatedAccelerator device({.capacity_bytes = 64 << 20});
  ExecutorOptions options;
  options.plan = Cases()[6].plan(*f.model, 32);  // hetero_dp
  options.optimizer = f.spec.optimizer();
  options.max_batch = 32;
  options.host_allocator = &host;
  options.accelerator = &device;
  auto hetero = PlanRankRunner::Create(*f.model, options, 32, *std::move(comm),
                                       *Communicator::Connect(store, "one-c", 0, 1, {}), {});
  EXPECT_EQ(hetero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(hetero.status().message().find("hetero_dp"), std::string::npos);
  // A 16-bit layer streaming its optimizer state: its gradient would be
  // summed as fp32.
  options.plan = Cases()[7].plan(*f.model, 32);  // streamed_state
  options.test_working_copies = true;
  auto bf16 =
      PlanRankRunner::Create(*f.model, options, 32, *Communicator::Connect(store, "two", 0, 1, {}),
                             *Communicator::Connect(store, "two-c", 0, 1, {}), {});
  EXPECT_EQ(bf16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bf16.status().message().find("stream_optimizer_state"), std::string::npos)
      << bf16.status();
}

}  // namespace
}  // namespace tandem
