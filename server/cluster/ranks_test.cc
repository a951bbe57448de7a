// The coordinator's StartRank requests and the threads a rank takes on its
// node: a job that sets no threads runs each node's ranks on that node's
// cores shared among them, not on the share of the coordinator's cores its
// resolved spec carries; a job that sets them keeps them everywhere.
//
// RankHost, a peer's side, with ranks that join a real rendezvous (this
// process's Cluster service) and wait there for a rank 0 that never comes:
// ranks are their coordinator's, an earlier run's rank still stopping is
// asked to stop, and ended ranks are let go past the latest 64.
#include "server/cluster/ranks.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/store/job_store.h"
#include "spec/job_spec.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::server {
namespace {

constexpr char kSelf[] = "10.0.0.1:50051";
constexpr char kPeer[] = "10.0.0.2:50051";

// A 4-rank job with an emulated accelerator, resolved on a coordinator of 2
// cores and 2 accelerators: each of its 2 ranks there got 1 thread.
tandem::v1::JobSpec FourRankSpec() {
  tandem::v1::JobSpec spec;
  spec.mutable_distributed()->set_replicas(4);
  spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_EMULATED);
  spec.mutable_training()->set_threads(1);
  return spec;
}

TEST(StartRankRequestsTest, EachNodesRanksShareThatNodesCores) {
  // Rank 1 on the coordinator beside rank 0, ranks 2 and 3 on the peer.
  const std::vector<std::string> nodes = {kSelf, kPeer, kPeer};
  const std::vector<tandem::v1::StartRankRequest> requests =
      StartRankRequests("job-1", 1, FourRankSpec(), /*threads_shared=*/true, nodes, kSelf);
  ASSERT_EQ(requests.size(), 3u);
  for (size_t i = 0; i < requests.size(); ++i) {
    const tandem::v1::StartRankRequest& r = requests[i];
    EXPECT_EQ(r.rank(), static_cast<int>(i) + 1);
    EXPECT_EQ(r.ranks_here(), 2) << "rank " << r.rank();
    EXPECT_EQ(r.spec().training().threads(), 0) << "rank " << r.rank();
  }
  EXPECT_EQ(requests[0].accelerator_index(), 1);
  EXPECT_EQ(requests[1].accelerator_index(), 0);
  EXPECT_EQ(requests[2].accelerator_index(), 1);
  // The coordinator's rank 1 gets 1 of its 2 cores, as rank 0 does; the
  // peer's ranks share its 16 (or its --job_threads 6).
  EXPECT_EQ(RankThreads(requests[0], 0, 2), 1);
  EXPECT_EQ(RankThreads(requests[1], 0, 16), 8);
  EXPECT_EQ(RankThreads(requests[2], 6, 16), 3);
}

TEST(StartRankRequestsTest, ThreadsTheJobSetAreKeptOnEveryNode) {
  const std::vector<std::string> nodes = {kPeer, kPeer, kPeer};
  const std::vector<tandem::v1::StartRankRequest> requests =
      StartRankRequests("job-1", 1, FourRankSpec(), /*threads_shared=*/false, nodes, kSelf);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].ranks_here(), 3);
  EXPECT_EQ(requests[0].spec().training().threads(), 1);
  EXPECT_EQ(RankThreads(requests[0], 0, 16), 1);
}

TEST(RankThreadsTest, ARequestFromAnOlderCoordinatorKeepsTheOldRule) {
  tandem::v1::StartRankRequest r;
  EXPECT_EQ(RankThreads(r, 0, 16), 0);  // the trainer's default: all cores
  EXPECT_EQ(RankThreads(r, 4, 16), 4);
  r.set_ranks_here(32);
  EXPECT_EQ(RankThreads(r, 0, 16), 1);  // never below one
}

class RankHostTest : public testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TEST_TMPDIR");
    dir_ = std::string(base ? base : "/tmp") + "/rank_host_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    store_ = *JobStore::Open(dir_ + "/jobs.db");
    JobManagerOptions options{.state_dir = dir_, .data_policy = *PathPolicy::Create(dir_)};
    options.default_threads = 1;
    jobs_ = std::make_unique<JobManager>(options, store_.get(), &metrics_);
    ranks_ = std::make_unique<RankHost>(jobs_.get(), &peers_, dir_, &metrics_);
    service_ = std::make_unique<ClusterService>(Authenticator(), ranks_.get(), &table_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    // Two names of this process's rendezvous: two coordinators to the ranks.
    coordinator_ = "127.0.0.1:" + std::to_string(port);
    other_coordinator_ = "localhost:" + std::to_string(port);
  }
  void TearDown() override {
    ranks_.reset();  // stops and joins every rank
    server_->Shutdown();
  }

  // Rank `rank` of a 3-rank CPU job `job_id` of `coordinator`'s `attempt`th run.
  tandem::v1::StartRankRequest Request(const std::string& coordinator, const std::string& job_id,
                                       int attempt = 1, int rank = 1) {
    absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {mlp: {hidden_sizes: [16]}}
data: {synthetic: {sample_shape: [8], num_classes: 3, train_samples: 256}}
training: {batch_size: 16, steps: 10}
distributed: {replicas: 3, rendezvous_timeout_seconds: 120}
)",
                                                            "job.yaml");
    tandem::v1::StartRankRequest r;
    r.set_job_id(job_id);
    r.set_attempt(attempt);
    r.set_rank(rank);
    r.set_ranks(3);
    r.set_coordinator(coordinator);
    r.set_hostname("127.0.0.1");
    r.set_ranks_here(1);
    *r.mutable_spec() = *ResolveJobSpec(*spec, false);
    return r;
  }
  // Waits until the rank has ended (it was stopped, or failed on its own).
  tandem::v1::RankStatus WaitEnded(const std::string& coordinator, const std::string& job_id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (true) {
      absl::StatusOr<tandem::v1::RankStatus> s = ranks_->Get(coordinator, job_id, 1);
      EXPECT_TRUE(s.ok()) << s.status();
      if (!s.ok() || (s->state() != tandem::v1::JOB_STATE_QUEUED &&
                      s->state() != tandem::v1::JOB_STATE_RUNNING)) {
        return s.ok() ? *s : tandem::v1::RankStatus();
      }
      if (absl::Now() > deadline) {
        ADD_FAILURE() << "rank of " << job_id << " still " << s->reason();
        return *s;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
  }

  std::string dir_, coordinator_, other_coordinator_;
  ServerMetrics metrics_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
  PeerSet peers_{PeerSetOptions{.self = "127.0.0.1:1",
                                .credentials = {grpc::InsecureChannelCredentials(), ""}}};
  RendezvousTable table_;
  std::unique_ptr<RankHost> ranks_;
  std::unique_ptr<ClusterService> service_;
  std::unique_ptr<grpc::Server> server_;
};

// Job ids are each daemon's own: two coordinators' job-000001 run a rank 1
// each here, and each coordinator's stop reaches its own.
TEST_F(RankHostTest, TwoCoordinatorsJobsOfOneIdAreTwoRanks) {
  ASSERT_TRUE(ranks_->Start(Request(coordinator_, "job-000001")).ok());
  const absl::StatusOr<tandem::v1::RankStatus> second =
      ranks_->Start(Request(other_coordinator_, "job-000001"));
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(ranks_->Stop(coordinator_, "job-000001", 0, "test").ok());
  WaitEnded(coordinator_, "job-000001");
  const absl::StatusOr<tandem::v1::RankStatus> other =
      ranks_->Get(other_coordinator_, "job-000001", 1);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->state(), tandem::v1::JOB_STATE_QUEUED) << other->reason();
  EXPECT_EQ(ranks_->running(), 1);
  // An older coordinator's stop (no coordinator named) reaches the job's
  // ranks whoever coordinates them.
  ASSERT_TRUE(ranks_->Stop("", "job-000001", 0, "test").ok());
  WaitEnded(other_coordinator_, "job-000001");
  EXPECT_EQ(ranks_->running(), 0);
}

// A rank of an earlier run that never got its StopRank: the next run's start
// asks it to stop and is refused UNAVAILABLE (the coordinator retries the run),
// and starts once it has ended.
TEST_F(RankHostTest, AnEarlierRunsRankIsAskedToStopAndTheStartRetried) {
  ASSERT_TRUE(ranks_->Start(Request(coordinator_, "job-7", 1)).ok());
  const absl::StatusOr<tandem::v1::RankStatus> refused =
      ranks_->Start(Request(coordinator_, "job-7", 2));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_EQ(WaitEnded(coordinator_, "job-7").attempt(), 1);
  const absl::StatusOr<tandem::v1::RankStatus> started =
      ranks_->Start(Request(coordinator_, "job-7", 2));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->attempt(), 2);
  // The same run's rank started twice is another matter.
  EXPECT_EQ(ranks_->Start(Request(coordinator_, "job-7", 2)).status().code(),
            absl::StatusCode::kAlreadyExists);
  // Any rank of an earlier run holds the next run back, whatever its number.
  const absl::StatusOr<tandem::v1::RankStatus> behind =
      ranks_->Start(Request(coordinator_, "job-7", 3, /*rank=*/2));
  ASSERT_FALSE(behind.ok());
  EXPECT_EQ(behind.status().code(), absl::StatusCode::kUnavailable) << behind.status();
  EXPECT_NE(behind.status().message().find("rank 1 of run 2"), std::string::npos)
      << behind.status();
}

// Checkpoints a peer wrote before ranks were kept under their coordinator
// move there when the rank next starts: a partitioned job upgraded mid-run
// finds its partitions.
TEST_F(RankHostTest, CheckpointsFromBeforeCoordinatorKeysMoveUnderTheCoordinator) {
  const std::string unkeyed = dir_ + "/ranks/job-9/rank-1";
  std::filesystem::create_directories(unkeyed);
  std::ofstream(unkeyed + "/partition") << "state";
  ASSERT_TRUE(ranks_->Start(Request(coordinator_, "job-9")).ok());
  // The rank's thread moves them before it joins the others.
  ASSERT_TRUE(ranks_->Stop(coordinator_, "job-9", 1, "test").ok());
  WaitEnded(coordinator_, "job-9");
  std::string keyed = coordinator_;
  std::replace(keyed.begin(), keyed.end(), ':', '_');
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/ranks/" + keyed + "/job-9/rank-1/partition"));
  EXPECT_FALSE(std::filesystem::exists(unkeyed));
}

// Ended ranks are kept for GetRank up to the latest 64, then let go (their
// threads joined): a daemon serving many jobs' ranks does not grow forever.
TEST_F(RankHostTest, EndedRanksPastTheLatest64AreLetGo) {
  // Ranks whose coordinator is not there fail at once.
  const std::string gone = "127.0.0.1:1";
  for (int i = 0; i < 66; ++i) {
    const std::string job = "job-" + std::to_string(i);
    ASSERT_TRUE(ranks_->Start(Request(gone, job)).ok()) << i;
    EXPECT_EQ(WaitEnded(gone, job).state(), tandem::v1::JOB_STATE_FAILED);
  }
  // job-i goes when job-(i + 64)'s rank has ended, just after it says so.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (const char* job : {"job-0", "job-1"}) {
    while (ranks_->Get(gone, job, 1).ok() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_EQ(ranks_->Get(gone, job, 1).status().code(), absl::StatusCode::kNotFound) << job;
  }
  EXPECT_TRUE(ranks_->Get(gone, "job-2", 1).ok());
  EXPECT_TRUE(ranks_->Get(gone, "job-65", 1).ok());
  EXPECT_EQ(ranks_->running(), 0);
}

}  // namespace
}  // namespace tandem::server
