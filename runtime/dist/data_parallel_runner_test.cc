// Data-parallel ranks (threads joined over Gloo's TCP transport on loopback)
// against one replica of the same job: the mlp (dropout) and the gpt (dropout,
// AdamW, clipping) on 2 and 4 ranks, replicated and ZeRO-partitioned, in one
// bucket per layer and in DDP-sized buckets, give the CPU engine's losses for
// 20 steps; every rank ends with the same weights; the partitioned ranks keep
// 1/N of the optimizer state each, and gathered it equals the replicated one.
#include "runtime/dist/data_parallel_runner.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/data/loader.h"
#include "runtime/exec/plan_test_util.h"

namespace tandem {
namespace {

using exec_test::Fixture;
using exec_test::MakeFixture;

struct RankRun {
  std::vector<double> losses;
  std::vector<float> params;
  std::vector<std::vector<float>> moments;
  int64_t optimizer_elements = 0;
  DataParallelStats stats;
};

// `steps` steps of the job on `ranks` ranks, one thread each.
std::vector<RankRun> RunRanks(const Fixture& f, int ranks, const DataParallelOptions& options,
                              int steps) {
  gloo::rendezvous::HashStore store;
  std::vector<RankRun> runs(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions copts;
      copts.timeout = absl::Seconds(60);
      auto comm = Communicator::Connect(store, "dp", r, ranks, copts);
      ASSERT_TRUE(comm.ok()) << comm.status();
      HostAllocator host;
      auto runner =
          DataParallelRunner::Create(*f.model, f.spec.optimizer(), f.spec.training().batch_size(),
                                     f.spec.training().seed(), &host, comm->get(), options);
      ASSERT_TRUE(runner.ok()) << runner.status();
      RankRun& run = runs[r];
      run.losses = exec_test::RunSteps(f, **runner, steps);
      ASSERT_TRUE((*runner)->GatherOptimizerState().ok());
      const HostStateView state = (*runner)->host_state();
      const int64_t p = f.model->parameter_elements();
      run.params.assign(state.params, state.params + p);
      for (float* m : state.moments) run.moments.emplace_back(m, m + p);
      run.optimizer_elements = (*runner)->optimizer_elements();
      run.stats = (*runner)->stats();
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

struct DpCase {
  const char* model;
  const char* yaml;
  int ranks;
  OptimizerSharding sharding;
  int64_t bucket_bytes;
};

class DataParallelTest : public testing::TestWithParam<DpCase> {};

TEST_P(DataParallelTest, TwentyStepsMatchOneReplica) {
  const DpCase& c = GetParam();
  const Fixture f = MakeFixture(c.yaml);
  const int steps = 20;
  const std::vector<double> reference = exec_test::Reference(f, steps);
  DataParallelOptions options;
  options.sharding = c.sharding;
  options.bucket_bytes = c.bucket_bytes;
  const std::vector<RankRun> runs = RunRanks(f, c.ranks, options, steps);
  const char* sharding =
      c.sharding == OptimizerSharding::kReplicated ? "replicated" : "partitioned";
  double worst = 0;
  int64_t owned = 0;
  for (int r = 0; r < c.ranks; ++r) {
    ASSERT_EQ(runs[r].losses.size(), reference.size()) << "rank " << r;
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(runs[r].losses[s], reference[s], 1e-4)
          << c.model << " " << sharding << " " << c.ranks << " ranks, rank " << r << " step " << s;
      worst = std::max(worst, std::abs(runs[r].losses[s] - reference[s]));
    }
    // Every rank holds the same model, bit for bit.
    EXPECT_EQ(0, std::memcmp(runs[r].params.data(), runs[0].params.data(),
                             runs[0].params.size() * sizeof(float)))
        << "rank " << r;
    owned += runs[r].optimizer_elements;
    EXPECT_GT(runs[r].stats.total.bytes, 0);
    EXPECT_GE(runs[r].stats.buckets, 1);
  }
  const int64_t p = f.model->parameter_elements();
  if (c.sharding == OptimizerSharding::kPartitioned) {
    // 1/N of the optimizer state each, and all of it between them.
    EXPECT_EQ(owned, p);
    for (int r = 0; r < c.ranks; ++r) EXPECT_LE(runs[r].optimizer_elements, p / c.ranks + 64);
  } else {
    EXPECT_EQ(owned, p * c.ranks);
  }
  if (c.bucket_bytes == 0) {
    EXPECT_GT(runs[0].stats.buckets, 1);
  }
  std::cout << c.model << " " << sharding << " on " << c.ranks << " ranks, "
            << runs[0].stats.buckets << " buckets: loss " << runs[0].losses.front() << " -> "
            << runs[0].losses.back() << ", one replica " << reference.front() << " -> "
            << reference.back() << ", worst difference " << worst << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, DataParallelTest,
    testing::Values(DpCase{"mlp", exec_test::kMlp, 2, OptimizerSharding::kReplicated, 0},
                    DpCase{"mlp", exec_test::kMlp, 4, OptimizerSharding::kPartitioned, 0},
                    DpCase{"gpt", exec_test::kGpt, 2, OptimizerSharding::kReplicated, 1024},
                    DpCase{"gpt", exec_test::kGpt, 4, OptimizerSharding::kReplicated, 25 << 20},
                    DpCase{"gpt", exec_test::kGpt, 2, OptimizerSharding::kPartitioned, 1024},
                    DpCase{"gpt", exec_test::kGpt, 4, OptimizerSharding::kPartitioned, 0}),
    [](const testing::TestParamInfo<DpCase>& info) {
      const DpCase& c = info.param;
      return std::string(c.model) + "_" + std::to_string(c.ranks) + "ranks_" +
             (c.sharding == OptimizerSharding::kReplicated ? "replicated" : "partitioned") +
             "_bucket" + std::to_string(c.bucket_bytes);
    });

TEST(DataParallelTest, GatheredPartitionedStateIsTheReplicatedState) {
  const Fixture f = MakeFixture(exec_test::kGpt);
  DataParallelOptions replicated;
  DataParallelOptions partitioned;
  partitioned.sharding = OptimizerSharding::kPartitioned;
  partitioned.bucket_bytes = 2048;
  const std::vector<RankRun> a = RunRanks(f, 3, replicated, 5);
  const std::vector<RankRun> b = RunRanks(f, 3, partitioned, 5);
  ASSERT_EQ(a[1].moments.size(), 2u);  // AdamW's m and v
  ASSERT_EQ(b[1].moments.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    for (size_t j = 0; j < a[1].moments[i].size(); ++j) {
      ASSERT_NEAR(b[1].moments[i][j], a[1].moments[i][j],
                  1e-5 + 1e-3 * std::abs(a[1].moments[i][j]))
          << "moment " << i << " element " << j;
    }
  }
}

TEST(DataParallelTest, EvaluationAddsUpEveryRanksShare) {
  const Fixture f = MakeFixture(exec_test::kMlp);
  HostAllocator host;
  auto cpu = *CpuRunner::Create(*f.model, f.spec.optimizer(), 32, f.spec.training().seed(), &host);
  BatchLoader loader(*f.data.train, 30, false, 0, false);
  const Batch& batch = loader.Next();
  const EvalResult want = *cpu->EvalBatch(batch);
  gloo::rendezvous::HashStore store;
  std::vector<EvalResult> got(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::Connect(store, "eval", r, 3, {});
      ASSERT_TRUE(comm.ok());
      HostAllocator mine;
      auto runner = DataParallelRunner::Create(*f.model, f.spec.optimizer(), 32,
                                               f.spec.training().seed(), &mine, comm->get(), {});
      ASSERT_TRUE(runner.ok()) << runner.status();
      auto result = (*runner)->EvalBatch(batch);
      ASSERT_TRUE(result.ok()) << result.status();
      got[r] = *result;
    });
  }
  for (auto& t : threads) t.join();
  for (const EvalResult& g : got) {
    EXPECT_NEAR(g.loss_sum, want.loss_sum, 1e-4 * std::abs(want.loss_sum));
    EXPECT_EQ(g.correct, want.correct);
    EXPECT_EQ(g.positions, want.positions);
    EXPECT_EQ(g.samples, 30);
  }
}

TEST(DataParallelTest, RefusesABatchSmallerThanTheRanks) {
  const Fixture f = MakeFixture(exec_test::kMlp);
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::Connect(store, "small", r, 2, {});
      ASSERT_TRUE(comm.ok());
      HostAllocator host;
      auto runner =
          DataParallelRunner::Create(*f.model, f.spec.optimizer(), 1, 0, &host, comm->get(), {});
      EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(runner.status().message().find("training.batch_size 1"), std::string::npos);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A restarted run: rank 0 resumed from a checkpoint (here: state written into
// its host view, as a checkpoint load does), the others hold something else;
// after SynchronizeStart every rank holds rank 0's weights and buffers and
// starts at its step. Replicated ranks take rank 0's optimizer state too;
// partitioned ranks keep their own pieces (each loads its partition of the
// checkpoint: runtime/train/partitioned_checkpoint.h).
class SynchronizeStartTest : public testing::TestWithParam<OptimizerSharding> {};

TEST_P(SynchronizeStartTest, EveryRankTakesRankZerosStateAndPosition) {
  const Fixture f = MakeFixture(exec_test::kGpt);
  const int64_t p = f.model->parameter_elements();
  const bool partitioned = GetParam() == OptimizerSharding::kPartitioned;
  gloo::rendezvous::HashStore store;
  std::vector<std::vector<float>> params(3), moments(3), pieces(3);
  std::vector<StartPoint> points(3);
  std::vector<bool> changed(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto comm = Communicator::Connect(store, "sync", r, 3, {});
      ASSERT_TRUE(comm.ok());
      HostAllocator host;
      DataParallelOptions options;
      options.sharding = GetParam();
      options.bucket_bytes = 1024;
      auto runner = DataParallelRunner::Create(*f.model, f.spec.optimizer(), 16, 4, &host,
                                               comm->get(), options);
      ASSERT_TRUE(runner.ok()) << runner.status();
      HostStateView view = (*runner)->host_state();
      for (int64_t i = 0; i < p; ++i) view.params[i] = r == 0 ? 0.001f * (i % 97) : -1.0f;
      const std::optional<StatePartition> part = (*runner)->state_partition();
      ASSERT_EQ(part.has_value(), partitioned);
      if (partitioned) {
        for (int64_t i = 0; i < part->elements; ++i) part->moments[1][i] = r + 0.001f * (i % 13);
      } else {
        for (int64_t i = 0; i < p; ++i) {
          view.moments[1][i] = r == 0 ? 0.5f + 0.001f * (i % 13) : 7.0f;
        }
      }
      ASSERT_TRUE((*runner)->StateChangedOnHost().ok());
      StartPoint point;
      if (r == 0)
        point = {.step = 40, .samples = 640, .epoch = 2, .epoch_offset = 128, .optimizer_step = 40};
      auto c = (*runner)->SynchronizeStart(&point);
      ASSERT_TRUE(c.ok()) << c.status();
      changed[r] = *c;
      points[r] = point;
      if (partitioned) pieces[r].assign(part->moments[1], part->moments[1] + part->elements);
      ASSERT_TRUE((*runner)->GatherOptimizerState().ok());
      view = (*runner)->host_state();
      params[r].assign(view.params, view.params + p);
      moments[r].assign(view.moments[1], view.moments[1] + p);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(changed[0]);
  for (int r = 1; r < 3; ++r) {
    EXPECT_TRUE(changed[r]);
    EXPECT_EQ(points[r].step, 40);
    EXPECT_EQ(points[r].samples, 640);
    EXPECT_EQ(points[r].epoch, 2);
    EXPECT_EQ(points[r].epoch_offset, 128);
    EXPECT_EQ(points[r].optimizer_step, 40);
    EXPECT_EQ(params[r], params[0]) << "rank " << r;
    EXPECT_EQ(moments[r], moments[0]) << "rank " << r;
  }
  EXPECT_FLOAT_EQ(params[2][5], 0.005f);
  if (!partitioned) {
    EXPECT_FLOAT_EQ(moments[0][14], 0.5f + 0.001f);
    return;
  }
  for (int r = 0; r < 3; ++r) {
    ASSERT_FALSE(pieces[r].empty());
    EXPECT_FLOAT_EQ(pieces[r][14], r + 0.001f) << "rank " << r << " kept its own pieces";
  }
}

INSTANTIATE_TEST_SUITE_P(Sharding, SynchronizeStartTest,
                         testing::Values(OptimizerSharding::kReplicated,
                                         OptimizerSharding::kPartitioned));

}  // namespace
}  // namespace tandem
