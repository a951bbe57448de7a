// Checkpoints of ZeRO-partitioned data-parallel jobs: two ranks (threads
// joined over Gloo on loopback, each with its own checkpoint directory as on
// two nodes) write their own pieces of the Adam state, rank 0 commits the
// manifest, and a stopped job resumed from it continues the uninterrupted
// run's losses to the bit. A damaged partition, or one another run wrote,
// fails the resume on every rank, naming the rank. Ranks that run a plan on
// an emulated accelerator (ZeRO-Offload's partitioned host state, the state of
// the layers the accelerator updates kept whole in every partition) resume
// exactly too.
#include "runtime/train/partitioned_checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "base/test_dir.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/dist/data_parallel_runner.h"
#include "runtime/dist/plan_rank.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/plan_test_util.h"
#include "runtime/train/trainer.h"
#include "spec/job_spec.h"

namespace tandem {
namespace {

constexpr int kRanks = 2;

tandem::v1::JobSpec Spec(int seed) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model:
  mlp: {hidden_sizes: [32, 32]}
data:
  synthetic: {sample_shape: [12], num_classes: 4, train_samples: 200, test_samples: 64}
optimizer: {kind: OPTIMIZER_KIND_ADAM, learning_rate: 0.01}
training: {batch_size: 16, steps: 12, seed: 5, checkpoint_interval_steps: 4, threads: 1}
)",
                                                          "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_training()->set_seed(seed);
  return *spec;
}

struct RankRun {
  std::vector<double> losses;
  absl::Status status;
  std::string checkpoint_path;
  int64_t checkpoint_step = 0;
};

// Rank r of a partitioned job running a plan on its own emulated
// accelerator: the last half of the layers updated on the host (their state
// partitioned), the first half on the accelerator.
absl::StatusOr<std::unique_ptr<StepRunner>> PlanRank(const Model& model,
                                                     const tandem::v1::JobSpec& resolved,
                                                     Allocator* allocator,
                                                     std::unique_ptr<Communicator> comm,
                                                     std::unique_ptr<Communicator> control,
                                                     bool working_copies) {
  const int64_t batch = resolved.training().batch_size();
  auto device = std::make_unique<EmulatedAccelerator>(EmulatedOptions{.capacity_bytes = 64 << 20},
                                                      comm->rank());
  ExecutorOptions options;
  const int share = static_cast<int>(batch / kRanks);
  options.plan = exec_test::MakePlan(model, tandem::v1::STRATEGY_REUSE_DISTANCE, share, share,
                                     [&model](int l, tandem::v1::LayerPlan* lp) {
                                       if (l >= model.num_layers() / 2) {
                                         lp->set_update(tandem::v1::PLACEMENT_HOST);
                                       }
                                     });
  options.optimizer = resolved.optimizer();
  options.max_batch = share;
  options.init_seed = resolved.training().seed();
  options.host_allocator = allocator;
  options.accelerator = device.get();
  options.test_working_copies = working_copies;
  DataParallelOptions dp;
  dp.sharding = OptimizerSharding::kPartitioned;
  dp.bucket_bytes = 1024;
  absl::StatusOr<std::unique_ptr<PlanRankRunner>> runner = PlanRankRunner::Create(
      model, std::move(options), batch, std::move(comm), std::move(control), dp, std::move(device));
  if (!runner.ok()) return runner.status();
  return std::unique_ptr<StepRunner>(*std::move(runner));
}

// Both ranks of `spec`, rank r checkpointing in dirs[r], stopping after
// `stop_after` steps of this run (-1: to the end); rank 0 resumes, the
// others start where it does, as tandemd's ranks do. `plan`: ranks running a
// plan (PlanRank) instead of the CPU engine; `working_copies`: theirs keep
// bf16 working copies and pieces of the fp32 masters
// (ExecutorOptions::test_working_copies).
std::vector<RankRun> TrainRanks(const tandem::v1::JobSpec& spec,
                                const std::vector<std::string>& dirs, int stop_after = -1,
                                bool plan = false, bool working_copies = false) {
  gloo::rendezvous::HashStore store;
  std::vector<RankRun> runs(kRanks);
  std::vector<std::thread> threads;
  auto nodes =
      std::make_shared<std::vector<std::string>>(std::vector<std::string>{"self", "node-b:7070"});
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      TrainerOptions options;
      options.checkpoint_dir = dirs[r];
      options.resume = r == 0;
      options.threads = 1;
      if (r == 0) options.rank_nodes = nodes;
      options.make_runner =
          [&store, r, plan, working_copies](
              const Model& model, const tandem::v1::JobSpec& resolved, int64_t,
              Allocator* allocator) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
        CommunicatorOptions copts;
        copts.timeout = absl::Seconds(60);
        absl::StatusOr<std::unique_ptr<Communicator>> comm =
            Communicator::Connect(store, "ckpt", r, kRanks, copts);
        if (!comm.ok()) return comm.status();
        if (plan) {
          absl::StatusOr<std::unique_ptr<Communicator>> control =
              Communicator::Connect(store, "ckpt-control", r, kRanks, copts);
          if (!control.ok()) return control.status();
          return PlanRank(model, resolved, allocator, *std::move(comm), *std::move(control),
                          working_copies);
        }
        DataParallelOptions dp;
        dp.sharding = OptimizerSharding::kPartitioned;
        dp.bucket_bytes = 1024;
        absl::StatusOr<std::unique_ptr<DataParallelRunner>> runner = DataParallelRunner::Create(
            model, resolved.optimizer(), resolved.training().batch_size(),
            resolved.training().seed(), allocator, *std::move(comm), dp);
        if (!runner.ok()) return runner.status();
        return std::unique_ptr<StepRunner>(*std::move(runner));
      };
      RankRun& run = runs[r];
      TrainerCallbacks callbacks;
      int steps = 0;
      callbacks.on_step = [&](const tandem::v1::JobEvent::StepProgress& p) {
        run.losses.push_back(p.loss());
        ++steps;
      };
      callbacks.should_stop = [&] { return stop_after >= 0 && steps >= stop_after; };
      absl::StatusOr<std::unique_ptr<Trainer>> trainer = Trainer::Create(spec, options, callbacks);
      if (!trainer.ok()) {
        run.status = trainer.status();
        return;
      }
      run.status = (*trainer)->Run();
      run.checkpoint_path = (*trainer)->checkpoint_path();
      run.checkpoint_step = (*trainer)->checkpoint_step();
    });
  }
  for (auto& t : threads) t.join();
  return runs;
}

// A run stopped after 6 steps (`first`) and resumed (`second`) gives the
// uninterrupted run's 12 losses to the bit, on both ranks.
void ExpectResumedExactly(const std::vector<RankRun>& whole, const std::vector<RankRun>& first,
                          const std::vector<RankRun>& second) {
  for (const RankRun& r : second) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(first[0].losses.size(), 6u);
  ASSERT_EQ(second[0].losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(first[0].losses[i], whole[0].losses[i]) << i;
    EXPECT_EQ(second[0].losses[i], whole[0].losses[6 + i]) << i;
    EXPECT_EQ(second[1].losses[i], whole[0].losses[6 + i]) << i;
  }
}

std::vector<std::string> Dirs(const std::string& name) {
  std::vector<std::string> dirs;
  for (int r = 0; r < kRanks; ++r) dirs.push_back(TempDir(name + "-rank" + std::to_string(r)));
  return dirs;
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(PartitionedCheckpointTest, EachRankWritesItsPiecesAndAResumeContinuesExactly) {
  const tandem::v1::JobSpec spec = Spec(5);
  const std::vector<RankRun> whole = TrainRanks(spec, Dirs("whole"));
  for (const RankRun& r : whole) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(whole[0].losses.size(), 12u);

  const std::vector<std::string> dirs = Dirs("stopped");
  const std::vector<RankRun> first = TrainRanks(spec, dirs, /*stop_after=*/6);
  for (const RankRun& r : first) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
    EXPECT_EQ(r.checkpoint_step, 6);
  }
  // Rank 0 committed the manifest; each rank's file holds its own pieces.
  EXPECT_EQ(first[0].checkpoint_path, dirs[0] + "/ckpt-0000000006.manifest");
  absl::StatusOr<tandem::v1::CheckpointManifest> manifest = ReadManifest(first[0].checkpoint_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 6);
  ASSERT_EQ(manifest->partitions_size(), 2);
  EXPECT_EQ(manifest->partitions(0).node(), "self");
  EXPECT_EQ(manifest->partitions(1).node(), "node-b:7070");
  EXPECT_EQ(manifest->partitions(1).file(), "ckpt-0000000006.tdm");
  const int64_t rank1_bytes = std::filesystem::file_size(dirs[1] + "/ckpt-0000000006.tdm");
  EXPECT_EQ(manifest->partitions(1).bytes(), rank1_bytes);
  // Rank 1's file: its half of Adam's two moments, no weights.
  const int64_t params = 12 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4;
  EXPECT_LT(rank1_bytes, params * 4 * 2 * 3 / 4);
  EXPECT_GT(rank1_bytes, params * 4 * 2 / 4);
  EXPECT_GT(manifest->partitions(0).bytes(), params * 4);

  const std::vector<RankRun> second = TrainRanks(spec, dirs);
  ExpectResumedExactly(whole, first, second);
  // Kept: rank 0 the two newest manifests and its files of their steps; the
  // others one partition more (their newest may not have been committed).
  EXPECT_EQ(Files(dirs[0]),
            (std::vector<std::string>{"ckpt-0000000008.manifest", "ckpt-0000000008.tdm",
                                      "ckpt-0000000012.manifest", "ckpt-0000000012.tdm"}));
  EXPECT_EQ(Files(dirs[1]), (std::vector<std::string>{"ckpt-0000000006.tdm", "ckpt-0000000008.tdm",
                                                      "ckpt-0000000012.tdm"}));
}

TEST(PartitionedCheckpointTest, PlanRanksResumeExactlyFromTheirPartitions) {
  const tandem::v1::JobSpec spec = Spec(5);
  const std::vector<RankRun> whole = TrainRanks(spec, Dirs("plan-whole"), -1, /*plan=*/true);
  for (const RankRun& r : whole) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(whole[0].losses.size(), 12u);
  // In fp32 (AUTO is bf16 where the CPU has it, and the two runners round
  // different operands), the same run as the CPU engine's ranks, up to the
  // order of sums.
  tandem::v1::JobSpec fp32 = spec;
  fp32.set_precision(tandem::v1::PRECISION_FP32);
  const std::vector<RankRun> plan32 = TrainRanks(fp32, Dirs("plan-fp32"), -1, /*plan=*/true);
  const std::vector<RankRun> engine32 = TrainRanks(fp32, Dirs("engine-fp32"));
  ASSERT_EQ(plan32[0].losses.size(), 12u);
  ASSERT_EQ(engine32[0].losses.size(), 12u);
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_NEAR(plan32[0].losses[i], engine32[0].losses[i], 1e-5) << i;
  }

  const std::vector<std::string> dirs = Dirs("plan-stopped");
  const std::vector<RankRun> first = TrainRanks(spec, dirs, /*stop_after=*/6, /*plan=*/true);
  for (const RankRun& r : first) {
    EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
    EXPECT_EQ(r.checkpoint_step, 6);
  }
  absl::StatusOr<tandem::v1::CheckpointManifest> manifest = ReadManifest(first[0].checkpoint_path);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 6);
  EXPECT_NE(manifest->layout().find("plan ranks=2 host buckets="), std::string::npos)
      << manifest->layout();
  // Rank 1's file: Adam's two moments of its pieces of the host-updated
  // layers and of the accelerator-updated layers whole, less than the whole
  // state, no weights.
  const int64_t params = 12 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4;
  const int64_t rank1_bytes = std::filesystem::file_size(dirs[1] + "/ckpt-0000000006.tdm");
  EXPECT_EQ(manifest->partitions(1).bytes(), rank1_bytes);
  EXPECT_LT(rank1_bytes, params * 4 * 2);
  EXPECT_GT(rank1_bytes, params * 4 * 2 / 4);

  const std::vector<RankRun> second = TrainRanks(spec, dirs, -1, /*plan=*/true);
  ExpectResumedExactly(whole, first, second);
}

// Ranks whose fp32 master weights are partitioned with the moments (bf16
// working copies): rank 0's partition holds the whole masters, gathered
// for it, and the others' only their moments, so a resume continues the
// uninterrupted run to the bit.
TEST(PartitionedCheckpointTest, PartitionedMastersResumeExactly) {
  tandem::v1::JobSpec spec = Spec(5);
  spec.set_precision(tandem::v1::PRECISION_FP32);
  const std::vector<RankRun> whole =
      TrainRanks(spec, Dirs("masters-whole"), -1, /*plan=*/true, /*working_copies=*/true);
  for (const RankRun& r : whole) ASSERT_TRUE(r.status.ok()) << r.status;
  ASSERT_EQ(whole[0].losses.size(), 12u);
  const std::vector<std::string> dirs = Dirs("masters-stopped");
  const std::vector<RankRun> first = TrainRanks(spec, dirs, 6, true, true);
  for (const RankRun& r : first) EXPECT_EQ(r.checkpoint_step, 6);
  // Rank 1's file holds Adam's two moments of its pieces, as without
  // working copies: no masters.
  const int64_t params = 12 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4;
  EXPECT_LT(std::filesystem::file_size(dirs[1] + "/ckpt-0000000006.tdm"), params * 4 * 2);
  const std::vector<RankRun> second = TrainRanks(spec, dirs, -1, true, true);
  ExpectResumedExactly(whole, first, second);
}

// Rank 0 cannot commit the manifest of step 4 (a directory stands where its
// temporary file goes): every rank's run ends there, saying so, instead of
// rank 1 waiting in the next step's collective until its timeout.
TEST(PartitionedCheckpointTest, AManifestRankZeroCannotCommitEndsEveryRanksRun) {
  const std::vector<std::string> dirs = Dirs("uncommitted");
  std::filesystem::create_directories(
      absl::StrCat(CheckpointPath(dirs[0], 4, kManifestSuffix), ".tmp.", ::getpid()));
  const std::vector<RankRun> runs = TrainRanks(Spec(5), dirs);
  EXPECT_FALSE(runs[0].status.ok());
  EXPECT_EQ(runs[1].status.code(), absl::StatusCode::kDataLoss) << runs[1].status;
  EXPECT_NE(runs[1].status.message().find(
                "rank 0 could not commit the manifest of the checkpoint at step 4"),
            std::string::npos)
      << runs[1].status;
}

TEST(PartitionedCheckpointTest, ADamagedOrForeignPartitionFailsTheResumeNamingTheRank) {
  const std::vector<std::string> dirs = Dirs("damaged");
  const std::vector<std::string> other = Dirs("other");
  for (const RankRun& r : TrainRanks(Spec(5), dirs, /*stop_after=*/6)) {
    ASSERT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  }
  // Another run (another seed) of the same model, to step 6.
  for (const RankRun& r : TrainRanks(Spec(6), other, /*stop_after=*/6)) {
    ASSERT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  }
  const std::string part = dirs[1] + "/ckpt-0000000006.tdm";
  const std::string saved = part + ".saved";
  std::filesystem::copy_file(part, saved);
  {
    std::fstream f(part, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  std::vector<RankRun> runs = TrainRanks(Spec(5), dirs);
  EXPECT_EQ(runs[1].status.code(), absl::StatusCode::kDataLoss) << runs[1].status;
  EXPECT_NE(runs[1].status.message().find(
                "rank 1 cannot load its partition of the checkpoint at step 6: checkpoint"),
            std::string::npos)
      << runs[1].status;
  EXPECT_NE(runs[1].status.message().find("damaged"), std::string::npos) << runs[1].status;
  EXPECT_EQ(runs[0].status.code(), absl::StatusCode::kDataLoss) << runs[0].status;
  EXPECT_NE(runs[0].status.message().find("rank 1 cannot load its partition of the checkpoint "
                                          "at step 6 (its rank status says why)"),
            std::string::npos)
      << runs[0].status;

  // Intact, but written by the other run: not what the manifest committed.
  std::filesystem::copy_file(other[1] + "/ckpt-0000000006.tdm", part,
                             std::filesystem::copy_options::overwrite_existing);
  runs = TrainRanks(Spec(5), dirs);
  EXPECT_EQ(runs[1].status.code(), absl::StatusCode::kDataLoss) << runs[1].status;
  EXPECT_NE(runs[1].status.message().find("is not the partition the manifest of step 6 committed"),
            std::string::npos)
      << runs[1].status;

  // The partition back as it was: the job resumes.
  std::filesystem::copy_file(saved, part, std::filesystem::copy_options::overwrite_existing);
  runs = TrainRanks(Spec(5), dirs);
  for (const RankRun& r : runs) EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(runs[1].losses.size(), 6u);
}

// The coordinator's view: which node holds each rank's partition of the
// newest manifest.
TEST(PartitionedCheckpointTest, PartitionNodesNameTheNewestManifestsNodes) {
  const std::vector<std::string> dirs = Dirs("nodes");
  EXPECT_FALSE(PartitionNodes(dirs[0], kRanks).has_value()) << "no manifest yet";
  for (const RankRun& r : TrainRanks(Spec(5), dirs, /*stop_after=*/5)) {
    ASSERT_EQ(r.status.code(), absl::StatusCode::kCancelled) << r.status;
  }
  const std::optional<PartitionPlacement> placement = PartitionNodes(dirs[0], kRanks);
  ASSERT_TRUE(placement.has_value());
  EXPECT_EQ(placement->step, 5);
  EXPECT_EQ(placement->nodes, std::vector<std::string>{"node-b:7070"});
  EXPECT_FALSE(PartitionNodes(dirs[0], 3).has_value()) << "another rank count";
}

}  // namespace
}  // namespace tandem
