// The daemon's components without gRPC: authentication, path confinement, the
// event log, and the job manager running real (small, synthetic) jobs on a real
// store: idempotency, validation, admission, priorities, cancellation, graceful
// stop and recovery; jobs on the emulated accelerator planned at submission and
// run through the plan executor, with their per-layer timings exported.
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/work_counters.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "server/auth.h"
#include "server/event_log.h"
#include "server/job_manager.h"
#include "server/path_policy.h"
#include "spec/job_spec.h"

namespace tandem::server {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/server_test/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(AuthTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-token-longer"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
}

TEST(AuthTest, BearerHeaderChecks) {
  Authenticator none;
  EXPECT_TRUE(none.CheckHeader("", false).ok());
  Authenticator a = Authenticator::WithToken("0123456789abcdef");
  EXPECT_EQ(a.CheckHeader("", false).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(a.CheckHeader("Basic abc", true).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(a.CheckHeader("Bearer wrong", true).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(a.CheckHeader("Bearer 0123456789abcdef", true).ok());
}

TEST(AuthTest, ShortTokenFileIsRefused) {
  const std::string path = TempDir("auth") + "/token";
  std::ofstream(path) << "short\n";
  EXPECT_EQ(Authenticator::FromFile(path).status().code(), absl::StatusCode::kInvalidArgument);
  std::ofstream(path) << "  0123456789abcdef0123  \n";
  absl::StatusOr<Authenticator> a = Authenticator::FromFile(path);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->CheckHeader("Bearer 0123456789abcdef0123", true).ok());
}

TEST(PathPolicyTest, ConfinesToTheRoot) {
  const std::string root = TempDir("paths");
  fs::create_directories(root + "/data");
  std::ofstream(root + "/data/a.txt") << "x";
  fs::create_symlink("/etc", root + "/data/escape");
  PathPolicy policy = *PathPolicy::Create(root + "/data");
  EXPECT_TRUE(policy.Resolve("f", "a.txt").ok());
  EXPECT_TRUE(policy.Resolve("f", root + "/data/a.txt").ok());
  EXPECT_TRUE(policy.Resolve("f", "not/yet/there").ok());
  for (const std::string bad : {"../x", "/etc/passwd", "escape/passwd", "a/../../x"}) {
    const absl::Status s = policy.Resolve("data.text.path", bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("data.text.path"), std::string::npos) << s;
  }
  EXPECT_FALSE(policy.Resolve("f", std::string("a\0b", 3)).ok());
}

TEST(EventLogTest, MemoryHoldsOnlyTheNewestEvents) {
  EventLog log("job-000001", 0, /*max_in_memory=*/8);
  for (int i = 0; i < 20; ++i) log.Append(tandem::v1::JobEvent());
  uint64_t first = 0;
  const std::vector<tandem::v1::JobEvent> read = log.Read(1, 100, &first);
  // The reader learns that 1..12 are in the store only.
  EXPECT_EQ(first, 13u);
  ASSERT_EQ(read.size(), 8u);
  EXPECT_EQ(read.front().sequence(), 13u);
  EXPECT_EQ(read.back().sequence(), 20u);
  EXPECT_EQ(log.last_sequence(), 20u);
}

TEST(EventLogTest, ReservesNumbersInBlocksBeforeHandingThemOut) {
  std::vector<uint64_t> reserved;
  EventLog log("job-000001", 7, EventLog::kMaxInMemory,
               [&](uint64_t through) { reserved.push_back(through); });
  const uint64_t block = EventLog::kReserveBlock;
  EXPECT_EQ(log.Append(tandem::v1::JobEvent()).sequence(), 8u);
  EXPECT_EQ(reserved, (std::vector<uint64_t>{7 + block}));
  for (uint64_t i = 1; i < block; ++i) log.Append(tandem::v1::JobEvent());
  EXPECT_EQ(reserved.size(), 1u);  // 8 .. 7 + block: one reservation
  EXPECT_EQ(log.Append(tandem::v1::JobEvent()).sequence(), 8 + block);
  EXPECT_EQ(reserved, (std::vector<uint64_t>{7 + block, 7 + 2 * block}));
}

TEST(EventLogTest, NumbersEventsAndWakesWaiters) {
  EventLog log("job-000001", 0);
  tandem::v1::JobEvent e;
  e.mutable_log()->set_message("one");
  EXPECT_EQ(log.Append(e).sequence(), 1u);
  uint64_t first = 0;
  EXPECT_EQ(log.Read(1, 10, &first).size(), 1u);
  EXPECT_EQ(first, 1u);
  // Already satisfied: nothing is registered.
  EXPECT_EQ(log.WaitFor(1, [] {}), 0);
  int woken = 0;
  EXPECT_NE(log.WaitFor(2, [&] { ++woken; }), 0);
  log.Append(e);
  EXPECT_EQ(woken, 1);
  const int64_t h = log.WaitFor(3, [&] { ++woken; });
  log.CancelWait(h);
  log.Append(e);
  EXPECT_EQ(woken, 1);
  EXPECT_NE(log.WaitFor(4, [&] { ++woken; }), 0);
  log.Close();
  EXPECT_EQ(woken, 2);
  EXPECT_TRUE(log.closed());
  EXPECT_EQ(log.last_sequence(), 3u);
}

tandem::v1::JobSpec Spec(int steps, int priority = 0, int batch = 16) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {mlp: {hidden_sizes: [16]}}
data: {synthetic: {sample_shape: [8], num_classes: 3, train_samples: 256}}
training: {batch_size: 16, steps: 10, checkpoint_interval_steps: 5}
)",
                                                          "job.yaml");
  spec->mutable_training()->set_steps(steps);
  spec->mutable_training()->set_batch_size(batch);
  spec->set_priority(priority);
  return *spec;
}

class JobManagerTest : public testing::Test {
 protected:
  void Open(const std::string& name, int64_t host_budget = int64_t{1} << 32, bool fresh = true,
            std::optional<node::NodeOffer> node = std::nullopt,
            const std::function<void(JobManagerOptions&)>& customize = nullptr) {
    dir_ = fresh ? TempDir(name) : dir_;
    store_ = *JobStore::Open(dir_ + "/jobs.db");
    JobManagerOptions options{.state_dir = dir_, .data_policy = *PathPolicy::Create(dir_)};
    options.host_memory_budget_bytes = host_budget;
    options.default_threads = 1;
    options.node = std::move(node);
    if (customize) customize(options);
    jobs_ = std::make_unique<JobManager>(options, store_.get(), &metrics_);
  }
  // A daemon whose distributed jobs' runs all end as rank 0's `factory` says
  // (it stands for the ranks' start and rendezvous), started.
  void OpenDistributed(const std::string& name, RunnerFactory factory) {
    Open(name, int64_t{1} << 32, true, std::nullopt, [&](JobManagerOptions& options) {
      options.admit_distributed = [](const tandem::v1::JobSpec&) { return absl::OkStatus(); };
      options.begin_distributed = [factory](const tandem::v1::Job&, const std::string&) {
        DistributedRun run;
        run.vote = std::make_shared<StopVote>();
        run.nodes = std::make_shared<std::vector<std::string>>();
        run.factory = factory;
        return run;
      };
    });
    ASSERT_TRUE(jobs_->Recover().ok());
    jobs_->Start();
  }
  void Close() {
    jobs_.reset();
    store_.reset();
  }
  std::string RecoverWithoutItsImages(const std::function<void(JobManagerOptions&)>& customize,
                                      std::string* images);
  // What kill -9 of a running job leaves behind: its stored record says
  // RUNNING, whatever the daemon has in memory.
  void StoreAsRunning(const std::string& id) {
    tandem::v1::Job record = *store_->GetJob(id).value();
    record.set_state(tandem::v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(store_->UpdateJob(record).ok());
  }
  // Another connection's exclusive transaction on the store's database: its
  // writes wait (up to the busy timeout, 10 s) until UnlockDatabase. Null if
  // the database could not be taken.
  sqlite3* LockDatabase() {
    sqlite3* other = nullptr;
    // A running job writes too: wait for its transaction rather than fail.
    if (sqlite3_open((dir_ + "/jobs.db").c_str(), &other) != SQLITE_OK ||
        sqlite3_busy_timeout(other, 10000) != SQLITE_OK ||
        sqlite3_exec(other, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) != SQLITE_OK) {
      sqlite3_close(other);
      return nullptr;
    }
    return other;
  }
  void UnlockDatabase(sqlite3* other) {
    sqlite3_exec(other, "ROLLBACK", nullptr, nullptr, nullptr);
    sqlite3_close(other);
  }
  tandem::v1::Job WaitFor(const std::string& id, tandem::v1::JobState state, int seconds = 60) {
    const absl::Time deadline = absl::Now() + absl::Seconds(seconds);
    tandem::v1::Job job;
    while (absl::Now() < deadline) {
      job = *jobs_->Get(id);
      if (job.state() == state) return job;
      absl::SleepFor(absl::Milliseconds(20));
    }
    ADD_FAILURE() << id << " never reached " << tandem::v1::JobState_Name(state) << ": "
                  << job.ShortDebugString();
    return job;
  }

  std::string dir_;
  ServerMetrics metrics_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<JobManager> jobs_;
};

TEST_F(JobManagerTest, RunsAJobToSuccessWithEvents) {
  Open("success");
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(Spec(12), "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->created);
  EXPECT_EQ(s->job.state(), tandem::v1::JOB_STATE_QUEUED);
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 12);
  EXPECT_GT(done.metrics().eval_accuracy(), 0.0);
  EXPECT_EQ(done.attempts(), 1);
  // The stream: queued, running, steps, eval, checkpoints, succeeded. The job
  // ended, so its events are read back from the store.
  ASSERT_TRUE(jobs_->Events(s->job.id()).ok());
  std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(s->job.id(), 1, 1000);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front().state_change().to(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(events.back().state_change().to(), tandem::v1::JOB_STATE_SUCCEEDED);
  int steps = 0;
  for (const auto& e : events) steps += e.has_step();
  EXPECT_EQ(steps, 12);
}

TEST_F(JobManagerTest, RequestIdsAreIdempotent) {
  Open("idempotent");
  auto first = jobs_->Submit(Spec(3), "req-1");
  ASSERT_TRUE(first.ok()) << first.status();
  auto again = jobs_->Submit(Spec(3), "req-1");
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), first->job.id());
  const absl::Status different = jobs_->Submit(Spec(4), "req-1").status();
  EXPECT_EQ(different.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(different.message().find(first->job.id()), std::string::npos) << different;
  EXPECT_EQ(jobs_->Submit(Spec(3), "bad id!").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobManagerTest, InvalidSpecsNameTheField) {
  Open("invalid");
  tandem::v1::JobSpec spec = Spec(3);
  spec.mutable_training()->set_batch_size(0);
  absl::Status s = jobs_->Submit(spec, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec.training.batch_size"), std::string::npos) << s;
  spec = Spec(3);
  spec.mutable_data()->Clear();
  spec.mutable_data()->mutable_text()->set_path("../../etc/passwd");
  spec.mutable_model()->Clear();
  spec.mutable_model()->mutable_gpt();
  s = jobs_->Submit(spec, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec.data.text.path"), std::string::npos) << s;
  EXPECT_NE(s.message().find("outside the data root"), std::string::npos) << s;
}

TEST_F(JobManagerTest, UpdateRulesRunReserveTheirWorkersAndReport) {
  Open("update_rules");
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  tandem::v1::JobSpec plain = Spec(12);
  tandem::v1::JobSpec ps = Spec(12);
  ps.mutable_updates()->mutable_parameter_server()->set_staleness(1);
  ps.mutable_updates()->mutable_parameter_server()->set_workers(3);
  absl::StatusOr<JobManager::Submitted> a = jobs_->Submit(plain, "");
  absl::StatusOr<JobManager::Submitted> b = jobs_->Submit(ps, "");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const tandem::v1::Job sync = WaitFor(a->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  const tandem::v1::Job done = WaitFor(b->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  // Three workers' gradients, activations and weight copies are reserved.
  EXPECT_GT(done.reserved_host_bytes(), sync.reserved_host_bytes());
  EXPECT_EQ(sync.metrics().updates().rule(), "synchronous");
  EXPECT_EQ(done.metrics().updates().rule(), "parameter_server");
  EXPECT_EQ(done.metrics().updates().updates(), 12);
  EXPECT_LE(done.metrics().updates().max_staleness(), 1);
  EXPECT_EQ(done.resolved_spec().updates().parameter_server().shards(), 4);
  const std::string text = metrics_.Serialize();
  EXPECT_NE(text.find(absl::StrCat("tandem_job_update_rule_info{job_id=\"", done.id(),
                                   "\",rule=\"parameter_server\"} 1")),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(absl::StrCat("tandem_job_update_lagged_updates{job_id=\"", done.id(),
                                   "\",lag=\"0\"}")),
            std::string::npos);
  EXPECT_NE(text.find(absl::StrCat("tandem_job_update_staleness{job_id=\"", done.id(),
                                   "\",stat=\"max\"}")),
            std::string::npos);
  // A bad parameter is refused naming the field; the daemon goes on.
  tandem::v1::JobSpec bad = Spec(3);
  bad.mutable_updates()->mutable_easgd()->set_alpha(1.5f);
  const absl::Status refused = jobs_->Submit(bad, "").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("spec.updates.easgd.alpha: must be in (0, 1)"),
            std::string::npos)
      << refused;
  EXPECT_TRUE(jobs_->Submit(Spec(3), "").ok());
}

TEST_F(JobManagerTest, AJobLargerThanTheBudgetIsResourceExhausted) {
  Open("too-big", /*host_budget=*/1 << 20);
  tandem::v1::JobSpec spec = Spec(3);
  spec.mutable_model()->mutable_mlp()->set_hidden_sizes(0, 4096);
  const absl::Status s = jobs_->Submit(spec, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("host memory"), std::string::npos) << s;
  EXPECT_NE(s.message().find("1.0 MiB"), std::string::npos) << s;
}

// A job cannot lower its own reservation below what it needs: one refused for
// the node's budget is refused again (INVALID_ARGUMENT, naming the field) when
// it asks for 1 byte, and one that asks for more than it needs reserves that.
TEST_F(JobManagerTest, AJobCannotReserveLessThanItNeeds) {
  Open("bypass", /*host_budget=*/1 << 20);
  tandem::v1::JobSpec big = Spec(3);
  big.mutable_model()->mutable_mlp()->set_hidden_sizes(0, 4096);
  for (int64_t asked : {int64_t{1}, int64_t{4096}, int64_t{512} << 10}) {
    big.mutable_resources()->set_host_memory_bytes(asked);
    const absl::Status s = jobs_->Submit(big, "").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << asked;
    EXPECT_NE(s.message().find("spec.resources.host_memory_bytes"), std::string::npos) << s;
    EXPECT_NE(s.message().find("this job needs"), std::string::npos) << s;
  }
  Close();
  Open("bypass");
  const MemoryEstimate need = jobs_->Resolve(Spec(3), /*plan=*/false)->estimate;
  tandem::v1::JobSpec small = Spec(3);
  small.mutable_resources()->set_host_memory_bytes(need.host_bytes - 1);
  EXPECT_EQ(jobs_->Submit(small, "").status().code(), absl::StatusCode::kInvalidArgument);
  small.mutable_resources()->set_host_memory_bytes(2 * need.host_bytes);
  EXPECT_EQ(jobs_->Resolve(small, /*plan=*/false)->estimate.host_bytes, 2 * need.host_bytes);
  jobs_->Start();
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(small, "");
  ASSERT_TRUE(s.ok()) << s.status();
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.reserved_host_bytes(), 2 * need.host_bytes);
}

// A ZeRO-partitioned rank on the CPU engine reserves its 1/N of the optimizer
// state, not the whole: the point of partitioning is that a model whose state
// does not fit one node's budget fits N.
TEST_F(JobManagerTest, APartitionedRankReservesItsPieceOfTheOptimizerState) {
  Open("partitioned");
  tandem::v1::JobSpec spec = Spec(3);
  spec.mutable_optimizer()->set_kind(tandem::v1::OPTIMIZER_KIND_ADAM);
  spec.mutable_distributed()->set_replicas(4);
  spec.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  absl::StatusOr<JobManager::Resolved> replicated = jobs_->Resolve(spec, /*plan=*/false);
  ASSERT_TRUE(replicated.ok()) << replicated.status();
  spec.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_PARTITIONED);
  absl::StatusOr<JobManager::Resolved> partitioned = jobs_->Resolve(spec, /*plan=*/false);
  ASSERT_TRUE(partitioned.ok()) << partitioned.status();
  const MemoryEstimate& whole = replicated->estimate;
  const MemoryEstimate& piece = partitioned->estimate;
  // mlp 8 -> 16 -> 3: 195 weights (more, padded), Adam's two moments; a
  // float more per moment and layer at most.
  const int64_t state = whole.optimizer_state_bytes;
  EXPECT_GE(state, 2 * (8 * 16 + 16 + 16 * 3 + 3) * 4);
  EXPECT_EQ(piece.optimizer_state_total_bytes, state);
  EXPECT_LE(piece.optimizer_state_bytes, state / 4 + 2 * 4 * 8);
  EXPECT_GE(piece.optimizer_state_bytes, state / 4);
  EXPECT_EQ(whole.host_bytes - piece.host_bytes,
            whole.optimizer_state_bytes - piece.optimizer_state_bytes);
  EXPECT_NE(piece.Describe().find("this rank's pieces of"), std::string::npos) << piece.Describe();
}

TEST_F(JobManagerTest, AdmissionNeverOversubscribesAndExplainsTheWait) {
  // Room for one job at a time: the second waits with a reason.
  Open("admission");
  const MemoryEstimate one = jobs_->Resolve(Spec(200), /*plan=*/false)->estimate;
  Close();
  Open("admission", one.host_bytes + one.host_bytes / 2);
  jobs_->Start();
  auto a = jobs_->Submit(Spec(100000000), "");
  WaitFor(a->job.id(), tandem::v1::JOB_STATE_RUNNING);
  auto b = jobs_->Submit(Spec(3), "");
  // The scheduler thread writes the reason after the submit.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (jobs_->Get(b->job.id())->reason().find("of host memory") == std::string::npos &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const tandem::v1::Job waiting = *jobs_->Get(b->job.id());
  EXPECT_EQ(waiting.state(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_NE(waiting.reason().find("waiting for"), std::string::npos) << waiting.reason();
  EXPECT_NE(waiting.reason().find("of host memory"), std::string::npos) << waiting.reason();
  // Freeing the memory lets it run.
  ASSERT_TRUE(jobs_->Cancel(a->job.id(), "").ok());
  WaitFor(b->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(jobs_->Get(a->job.id())->state(), tandem::v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, HigherPriorityRunsFirst) {
  Open("priority");
  auto low = jobs_->Submit(Spec(3, 0), "");
  auto high = jobs_->Submit(Spec(3, 5), "");
  jobs_->Start();
  const tandem::v1::Job h = WaitFor(high->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  const tandem::v1::Job l = WaitFor(low->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_LE(h.start_time().seconds() * 1000000000ll + h.start_time().nanos(),
            l.start_time().seconds() * 1000000000ll + l.start_time().nanos());
}

TEST_F(JobManagerTest, CancelQueuedAtOnceAndRunningAtAStepBoundary) {
  Open("cancel");
  auto queued = jobs_->Submit(Spec(5), "");
  const tandem::v1::Job cancelled = *jobs_->Cancel(queued->job.id(), "not needed");
  EXPECT_EQ(cancelled.state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_NE(cancelled.reason().find("not needed"), std::string::npos);
  EXPECT_EQ(jobs_->Cancel(queued->job.id(), "").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(jobs_->Cancel("job-999999", "").status().code(), absl::StatusCode::kNotFound);

  jobs_->Start();
  auto running = jobs_->Submit(Spec(100000), "");
  WaitFor(running->job.id(), tandem::v1::JOB_STATE_RUNNING);
  while (jobs_->Get(running->job.id())->progress().step() < 1)
    absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(jobs_->Cancel(running->job.id(), "").ok());
  const tandem::v1::Job stopped = WaitFor(running->job.id(), tandem::v1::JOB_STATE_CANCELLED);
  // A final checkpoint at the step it stopped on.
  EXPECT_GT(stopped.checkpoint_step(), 0);
  EXPECT_EQ(stopped.checkpoint_step(), stopped.progress().step());
}

// A job's record is committed before its entry is live. A watch or a cancel
// that finds it in that window (its id from ListJobs, or a retried submit)
// waits for the entry instead of taking the record for an ended job's.
TEST_F(JobManagerTest, AWatchOrCancelInTheSubmitWindowGetsTheLiveJob) {
  absl::Notification stored, release;
  std::string stored_id;
  Open("submit-window", int64_t{1} << 32, true, std::nullopt, [&](JobManagerOptions& options) {
    options.on_job_stored = [&](const std::string& id) {
      stored_id = id;
      stored.Notify();
      release.WaitForNotification();
    };
  });
  std::thread submit([&] { ASSERT_TRUE(jobs_->Submit(Spec(5), "").ok()); });
  stored.WaitForNotification();
  ASSERT_EQ((*store_->GetJob(stored_id))->state(), tandem::v1::JOB_STATE_QUEUED);
  absl::StatusOr<std::shared_ptr<EventLog>> log;
  absl::StatusOr<tandem::v1::Job> cancelled;
  std::thread watch([&] { log = jobs_->Events(stored_id); });
  std::thread cancel([&] { cancelled = jobs_->Cancel(stored_id, "in the window"); });
  absl::SleepFor(absl::Milliseconds(200));  // both reach the store's record first
  release.Notify();
  submit.join();
  watch.join();
  cancel.join();
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), tandem::v1::JOB_STATE_CANCELLED);
  // The live log: the watcher gets the cancel's end, not a log closed before it.
  EXPECT_GE((*log)->last_sequence(), 2u);
}
TEST_F(JobManagerTest, GracefulStopRequeuesAndRestartResumes) {
  Open("restart");
  jobs_->Start();
  auto s = jobs_->Submit(Spec(400), "");
  const std::string id = s->job.id();
  // Let it run some steps, then stop the daemon.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (jobs_->Get(id)->progress().step() < 20 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  jobs_->Shutdown();
  const tandem::v1::Job paused = *jobs_->Get(id);
  EXPECT_EQ(paused.state(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_NE(paused.reason().find("resumes from its checkpoint"), std::string::npos)
      << paused.reason();
  const int64_t at = paused.checkpoint_step();
  EXPECT_GT(at, 0);
  Close();

  Open("restart", int64_t{1} << 32, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const tandem::v1::Job done = WaitFor(id, tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_EQ(done.progress().step(), 400);
  // It resumed: the second attempt's log says so.
  ASSERT_TRUE(jobs_->Events(id).ok());
  bool resumed = false;
  std::string logs;
  const std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(id, 1, 10000);
  for (const auto& e : events) {
    if (e.has_log()) logs += e.log().message() + "\n";
    if (e.has_log() &&
        e.log().message().find("resumed from checkpoint at step") != std::string::npos) {
      resumed = true;
    }
  }
  EXPECT_TRUE(resumed) << logs;
}

TEST_F(JobManagerTest, RecoveryRequeuesJobsLeftRunningByACrash) {
  Open("crash");
  auto s = jobs_->Submit(Spec(5), "");
  StoreAsRunning(s->job.id());
  Close();
  Open("crash", int64_t{1} << 32, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  const tandem::v1::Job recovered = *jobs_->Get(s->job.id());
  EXPECT_EQ(recovered.state(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_NE(recovered.reason().find("restarted"), std::string::npos) << recovered.reason();
  jobs_->Start();
  WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
}

// A job cancelled while it ran before a crash ends CANCELLED at recovery.
// When the store cannot take that end yet, the job is served from memory
// and its event log still closes: its watchers end instead of waiting for
// the daemon's shutdown. The end is written once the store takes it.
TEST_F(JobManagerTest, ARecoveredCancelTheStoreCannotTakeYetStillEndsItsWatchers) {
  Open("recovered-cancel");
  auto s = jobs_->Submit(Spec(5), "");
  const std::string id = s->job.id();
  tandem::v1::Job record = *store_->GetJob(id).value();
  record.set_state(tandem::v1::JOB_STATE_RUNNING);
  record.set_cancel_requested("cancelled by request");
  ASSERT_TRUE(store_->UpdateJob(record).ok());
  Close();
  Open("recovered-cancel", int64_t{1} << 32, /*fresh=*/false);
  sqlite3* other = LockDatabase();  // the store's writes give up after 10 s
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(jobs_->Recover().ok());
  // Checked while the database is still locked (WAL: reads go on): once it
  // is not, the persister writes the end at any moment.
  EXPECT_EQ(jobs_->Get(id)->state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ((*store_->GetJob(id))->state(), tandem::v1::JOB_STATE_RUNNING);  // not yet
  const absl::StatusOr<std::shared_ptr<EventLog>> log = jobs_->Events(id);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_TRUE((*log)->closed());
  // A watcher reading below memory gets the end the store has not taken.
  const std::vector<tandem::v1::JobEvent> held =
      jobs_->UnstoredEvents(id, 1, (*log)->last_sequence() + 1, 64);
  UnlockDatabase(other);
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].state_change().to(), tandem::v1::JOB_STATE_CANCELLED);
  jobs_->Start();  // its loop writes what the store could not take
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((*store_->GetJob(id))->state() != tandem::v1::JOB_STATE_CANCELLED &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ((*store_->GetJob(id))->state(), tandem::v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, ACancelTheStoreCannotTakeLeavesTheQueuedJobAsItWas) {
  Open("cancel-store");
  ASSERT_TRUE(jobs_->Recover().ok());
  auto s = jobs_->Submit(Spec(5), "");  // not started: it stays queued
  const std::string id = s->job.id();
  // Another writer holds the database: the store's writes give up after its
  // busy timeout (10 s).
  sqlite3* other = LockDatabase();
  ASSERT_NE(other, nullptr);
  const absl::StatusOr<tandem::v1::Job> refused = jobs_->Cancel(id, "");
  UnlockDatabase(other);
  EXPECT_FALSE(refused.ok());
  // Refused, so nothing changed: still queued, and no watcher was told otherwise.
  EXPECT_EQ(jobs_->Get(id)->state(), tandem::v1::JOB_STATE_QUEUED);
  uint64_t first = 0;
  for (const auto& e : (*jobs_->Events(id))->Read(1, 100, &first)) {
    EXPECT_FALSE(e.has_state_change() && e.state_change().to() == tandem::v1::JOB_STATE_CANCELLED);
  }
  const absl::StatusOr<tandem::v1::Job> cancelled = jobs_->Cancel(id, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ((*store_->GetJob(id))->state(), tandem::v1::JOB_STATE_CANCELLED);
}

TEST_F(JobManagerTest, TheNodeSnapshotAnswersWhileAStoreWriteHoldsTheJobManager) {
  Open("snapshot-during-write");
  ASSERT_TRUE(jobs_->Recover().ok());
  auto s = jobs_->Submit(Spec(5), "");  // not started: it stays queued
  const std::string id = s->job.id();
  // Another writer holds the database, so the cancel's store write waits
  // (up to the store's busy timeout, 10 s) while it holds the job manager.
  sqlite3* other = LockDatabase();
  ASSERT_NE(other, nullptr);
  std::atomic<bool> cancel_returned{false};
  std::thread cancel([&] {
    EXPECT_TRUE(jobs_->Cancel(id, "").ok());
    cancel_returned = true;
  });
  absl::SleepFor(absl::Milliseconds(500));  // the cancel is in its write by now
  const JobManager::Snapshot during = jobs_->TakeSnapshot();
  // GetNode's figures came back while the write still waited.
  EXPECT_FALSE(cancel_returned.load());
  UnlockDatabase(other);
  cancel.join();
  EXPECT_TRUE(during.accepting) << during.not_accepting_reason;
  EXPECT_EQ(during.queued, 1);
  EXPECT_EQ(during.jobs_by_state.at(tandem::v1::JOB_STATE_QUEUED), 1);
  const JobManager::Snapshot after = jobs_->TakeSnapshot();
  EXPECT_EQ(after.queued, 0);
  EXPECT_EQ(after.jobs_by_state.at(tandem::v1::JOB_STATE_CANCELLED), 1);
  EXPECT_EQ(jobs_->ProbeNotAccepting(), "");
}

// A checkpoint's record write waits on the disk without the job manager's
// lock: reads answer meanwhile, with the checkpoint, and once the disk takes
// writes again the record follows it. A cancel in that window is written
// after it, so the stored record keeps the cancel.
TEST_F(JobManagerTest, ACheckpointRecordWaitingOnTheDiskHoldsUpNoRead) {
  Open("checkpoint-during-write");
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const std::string id = jobs_->Submit(Spec(100000), "")->job.id();
  WaitFor(id, tandem::v1::JOB_STATE_RUNNING);
  const int64_t before = jobs_->Get(id)->checkpoint_step();
  // Another writer holds the database: each store write waits up to the
  // store's busy timeout (10 s). The next checkpoint first flushes the
  // job's events (given up after 10 s), then writes its record.
  sqlite3* other = LockDatabase();
  ASSERT_NE(other, nullptr);
  const absl::Time locked = absl::Now();
  absl::Duration slowest;
  int64_t seen = before;
  auto read = [&] {
    const absl::Time t = absl::Now();
    seen = jobs_->Get(id)->checkpoint_step();
    ASSERT_TRUE(jobs_->List(JobFilter{}).ok());
    slowest = std::max(slowest, absl::Now() - t);
  };
  while (seen == before && absl::Now() < locked + absl::Seconds(30)) {
    read();
    absl::SleepFor(absl::Milliseconds(20));
  }
  // The record's write is waiting now: reads still answer.
  for (int i = 0; i < 10; ++i) {
    read();
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::thread cancel([&] { EXPECT_TRUE(jobs_->Cancel(id, "while a checkpoint waits").ok()); });
  absl::SleepFor(absl::Milliseconds(200));
  UnlockDatabase(other);
  cancel.join();
  EXPECT_GT(seen, before);
  // Well under the busy timeout: no read waited for a write to give up.
  EXPECT_LT(slowest, absl::Seconds(5));
  WaitFor(id, tandem::v1::JOB_STATE_CANCELLED);
  const tandem::v1::Job stored = *store_->GetJob(id).value();
  EXPECT_EQ(stored.state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_NE(stored.cancel_requested().find("while a checkpoint waits"), std::string::npos)
      << stored.cancel_requested();
  EXPECT_GE(stored.checkpoint_step(), seen);
}

// A job that sets no threads is resolved to --job_threads (default_threads
// here), which plans, keys its measured profiles and runs it; one that sets
// them keeps its own; with no --job_threads it is left to all the cores.
TEST_F(JobManagerTest, AJobWithoutThreadsIsResolvedToTheDaemonsJobThreads) {
  Open("job-threads", int64_t{1} << 32, true, std::nullopt,
       [](JobManagerOptions& options) { options.default_threads = 3; });
  ASSERT_TRUE(jobs_->Recover().ok());
  tandem::v1::JobSpec unset = Spec(5);
  unset.mutable_training()->clear_threads();
  tandem::v1::JobSpec set = Spec(5);
  set.mutable_training()->set_threads(2);
  EXPECT_EQ(jobs_->Submit(unset, "")->job.resolved_spec().training().threads(), 3);
  EXPECT_EQ(jobs_->Submit(set, "")->job.resolved_spec().training().threads(), 2);
  Close();
  Open("job-threads-all", int64_t{1} << 32, true, std::nullopt,
       [](JobManagerOptions& options) { options.default_threads = 0; });
  ASSERT_TRUE(jobs_->Recover().ok());
  EXPECT_EQ(jobs_->Submit(unset, "")->job.resolved_spec().training().threads(), 0);
}

TEST_F(JobManagerTest, AnUnresponsiveJobManagerIsReportedAsNotAccepting) {
  Open("unresponsive");
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->SetUnresponsive("stuck for seconds");
  JobManager::Snapshot s = jobs_->TakeSnapshot();
  EXPECT_FALSE(s.accepting);
  EXPECT_EQ(s.not_accepting_reason, "stuck for seconds");
  // The probe itself answers from under the lock, without the watchdog's verdict.
  EXPECT_EQ(jobs_->ProbeNotAccepting(), "");
  jobs_->SetUnresponsive("");
  s = jobs_->TakeSnapshot();
  EXPECT_TRUE(s.accepting) << s.not_accepting_reason;
  jobs_->Shutdown();
  EXPECT_EQ(jobs_->TakeSnapshot().not_accepting_reason, "tandemd is shutting down");
  EXPECT_EQ(jobs_->ProbeNotAccepting(), "tandemd is shutting down");
}

TEST_F(JobManagerTest, AfterACleanStopEventsNumberOnWithoutAJump) {
  Open("clean-stop");
  auto s = jobs_->Submit(Spec(5), "");
  const std::string id = s->job.id();
  StoreAsRunning(id);  // as a run re-queued at the stop leaves it
  Close();             // stores every event, and so needs no reservation
  Open("clean-stop", int64_t{1} << 32, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  EXPECT_EQ((*jobs_->Events(id))->last_sequence(), 2u);
}

// A job left running by a crash whose data is not there when tandemd comes
// back (a mount not up yet) waits queued, saying why, and resumes once its
// data is back, instead of failing for good.
// Submits a job reading IDX files under the test's directory, leaves it as a
// crash would (RUNNING), and restarts the daemon (options customised by
// `customize`) with its images moved away to `images` + ".away". Its id.
std::string JobManagerTest::RecoverWithoutItsImages(
    const std::function<void(JobManagerOptions&)>& customize, std::string* images) {
  auto idx = [](std::vector<uint32_t> dims, int bytes) {
    std::string s = {0, 0, 8, static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(d >> shift));
    }
    for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(i % 3));
    return s;
  };
  Open("estimate-retry", int64_t{1} << 32, true, std::nullopt, customize);
  *images = dir_ + "/images.idx";
  const std::string labels = dir_ + "/labels.idx";
  std::ofstream(*images, std::ios::binary) << idx({64, 4, 4}, 64 * 16);
  std::ofstream(labels, std::ios::binary) << idx({64}, 64);
  tandem::v1::JobSpec spec = Spec(6);
  spec.mutable_data()->mutable_idx()->set_train_images(*images);
  spec.mutable_data()->mutable_idx()->set_train_labels(labels);
  auto s = jobs_->Submit(spec, "");
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return "";
  const std::string id = s->job.id();
  StoreAsRunning(id);
  Close();
  std::filesystem::rename(*images, *images + ".away");
  Open("estimate-retry", int64_t{1} << 32, /*fresh=*/false, std::nullopt, customize);
  EXPECT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  return id;
}

TEST_F(JobManagerTest, ARecoveredJobWhoseDataIsNotThereYetWaitsAndResumes) {
  std::string images;
  const std::string id = RecoverWithoutItsImages(
      [](JobManagerOptions& o) { o.estimate_retry_interval = absl::Milliseconds(100); }, &images);
  ASSERT_FALSE(id.empty());
  absl::SleepFor(absl::Milliseconds(400));  // several retries, the data still away
  tandem::v1::Job waiting = *jobs_->Get(id);
  EXPECT_EQ(waiting.state(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_NE(waiting.reason().find("cannot resume yet"), std::string::npos) << waiting.reason();
  EXPECT_NE(waiting.reason().find("data.idx.train_images"), std::string::npos) << waiting.reason();
  std::filesystem::rename(images + ".away", images);
  WaitFor(id, tandem::v1::JOB_STATE_SUCCEEDED);
}

// An estimate error that does not pass ends the job after --resume_wait,
// with the error, instead of keeping it queued for the daemon's life.
TEST_F(JobManagerTest, ARecoveredJobWhoseDataNeverComesBackFailsAfterTheResumeWait) {
  std::string images;
  const std::string id = RecoverWithoutItsImages(
      [](JobManagerOptions& o) {
        o.estimate_retry_interval = absl::Milliseconds(100);
        o.resume_wait = absl::Milliseconds(500);
      },
      &images);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(jobs_->Get(id)->state(), tandem::v1::JOB_STATE_QUEUED);
  const tandem::v1::Job failed = WaitFor(id, tandem::v1::JOB_STATE_FAILED, 10);
  EXPECT_NE(failed.reason().find("data.idx.train_images"), std::string::npos) << failed.reason();
  EXPECT_NE(failed.reason().find("gave up after trying for 500ms"), std::string::npos)
      << failed.reason();
}

// ProfileModel's and PlanModel's holds yield to the queue's next job only
// where it would start but for them: while it waits for memory other holders
// (here a rank's hold, standing for a running job) keep, they are taken on
// what is free; once those are gone, new ones are refused until it starts,
// so a stream of them cannot keep it waiting.
TEST_F(JobManagerTest, ProfileAndPlanHoldsNeverKeepTheQueuesNextJobWaiting) {
  Open("probe");
  const int64_t h = jobs_->Estimate(*ResolveJobSpec(Spec(5), false))->host_bytes;
  Close();
  Open("yield", /*host_budget=*/h + h / 2);
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const int64_t part = h * 6 / 10;  // any two fit; the job beside either does not
  absl::StatusOr<std::shared_ptr<void>> rank = jobs_->HoldHostMemory(part, "rank 1 of job-x");
  ASSERT_TRUE(rank.ok()) << rank.status();
  const std::string waiting = jobs_->Submit(Spec(5), "")->job.id();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (jobs_->Get(waiting)->reason().find("of host memory") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << jobs_->Get(waiting)->reason();
    absl::SleepFor(absl::Milliseconds(20));
  }
  // It waits for the rank: a profile's hold is taken on what is free.
  absl::StatusOr<std::shared_ptr<void>> profile =
      jobs_->HoldHostMemory(part, "the profile", /*yield_to_queue=*/true);
  ASSERT_TRUE(profile.ok()) << profile.status();
  rank->reset();
  // Now only the profile keeps it waiting: the next plan's hold is refused,
  // naming the job; a rank's is still taken on what is free.
  const absl::StatusOr<std::shared_ptr<void>> refused =
      jobs_->HoldHostMemory(1, "the plan", /*yield_to_queue=*/true);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("queued job " + waiting + " starts with"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(jobs_->HoldHostMemory(1, "rank 1 of job-y").ok());
  EXPECT_EQ(jobs_->Get(waiting)->state(), tandem::v1::JOB_STATE_QUEUED);
  profile->reset();
  WaitFor(waiting, tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(jobs_->HoldHostMemory(1, "the plan", /*yield_to_queue=*/true).ok());
}

TEST_F(JobManagerTest, ARecoveredJobNumbersItsEventsPastEveryNumberWatchersSaw) {
  Open("renumber");
  auto s = jobs_->Submit(Spec(5), "");
  const std::string id = s->job.id();
  // Events a watcher saw that a crash kept from the store: appended to the
  // live log, which the store hears of only at the next flush.
  std::shared_ptr<EventLog> log = *jobs_->Events(id);
  tandem::v1::JobEvent e;
  e.mutable_log()->set_message("seen, never stored");
  uint64_t seen = 0;
  for (int i = 0; i < 10; ++i) seen = log->Append(e).sequence();
  StoreAsRunning(id);
  EXPECT_LT(*store_->LastEventSequence(id), seen);
  Close();
  Open("renumber", int64_t{1} << 32, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  // The restart's state change comes after the last number handed out, so a
  // watcher resuming from seen + 1 gets it.
  const std::vector<tandem::v1::JobEvent> after = *store_->ReadEvents(id, seen + 1, 100);
  ASSERT_FALSE(after.empty());
  EXPECT_TRUE(after[0].has_state_change()) << after[0].ShortDebugString();
  EXPECT_EQ(after[0].state_change().to(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_GT((*jobs_->Events(id))->last_sequence(), seen);
}

}  // namespace
}  // namespace tandem::server

namespace tandem::server {
namespace {

// Fixed host figures, so plans do not depend on this machine's speed.
node::NodeOffer TestNode() {
  node::NodeOffer node;
  node.host.set_kind(tandem::v1::DEVICE_KIND_CPU);
  node.host.set_threads(1);
  node.host.set_peak_matmul_flops_per_second(50e9);
  node.host.set_peak_vector_flops_per_second(50e9);
  node.host.set_memory_bandwidth_bytes_per_second(10e9);
  node.host.set_memory_bytes(int64_t{8} << 30);
  return node;
}

// An emulated accelerator's capacity that makes EmulatedSpec's model offload:
// its fp32 model state is 2.1 MiB.
constexpr int64_t kHybridCapacity = int64_t{5} << 18;  // 1.25 MiB

tandem::v1::JobSpec EmulatedSpec(int64_t capacity) {
  tandem::v1::JobSpec spec = Spec(6);
  spec.mutable_model()->mutable_mlp()->clear_hidden_sizes();
  for (int i = 0; i < 3; ++i) spec.mutable_model()->mutable_mlp()->add_hidden_sizes(256);
  spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_EMULATED);
  spec.mutable_placement()->set_strategy(tandem::v1::STRATEGY_REUSE_DISTANCE);
  spec.mutable_resources()->set_accelerator_memory_bytes(capacity);
  return spec;
}

// Two ranks on a node of two emulated accelerators and two cores: a job that
// sets no threads runs each rank on one, and its record says why; one that
// sets them keeps them.
TEST_F(JobManagerTest, RanksSharingANodeGetTheirPartOfItsCores) {
  node::NodeOffer node = TestNode();
  node.host.set_threads(2);
  node.emulated_accelerators = 2;
  // --job_threads unset: a job's cores are all the node's.
  Open("shared-cores", int64_t{1} << 32, true, node,
       [](JobManagerOptions& o) { o.default_threads = 0; });
  tandem::v1::JobSpec spec = EmulatedSpec(kHybridCapacity);
  spec.mutable_distributed()->set_replicas(2);
  absl::StatusOr<JobManager::Resolved> r = jobs_->Resolve(spec, /*plan=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->spec.training().threads(), 1);
  EXPECT_NE(r->distributed_reason.find("its 2 ranks on one node share 2 cores: 1 thread each"),
            std::string::npos)
      << r->distributed_reason;
  EXPECT_EQ(r->plan.host_update_threads(), 1);
  spec.mutable_training()->set_threads(2);
  r = jobs_->Resolve(spec, /*plan=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->spec.training().threads(), 2);
  EXPECT_EQ(r->distributed_reason.find("share"), std::string::npos) << r->distributed_reason;
}

// A ZeRO-partitioned rank running a plan pinned in its spec (as a run's
// ranks get theirs) reserves its pieces of the state of the layers the plan
// updates on the host, and the whole state of the others; without a plan, the
// whole. The job's coordinator reserves the same at submission: the job's
// plan is the rank plan, solved for a rank's share of the batch.
TEST_F(JobManagerTest, APartitionedPlanRankReservesItsPiecesOfTheHostUpdatedState) {
  Open("partitioned-plan", int64_t{1} << 32, true, TestNode());
  tandem::v1::JobSpec spec = EmulatedSpec(kHybridCapacity);
  spec.mutable_placement()->set_strategy(tandem::v1::STRATEGY_ZERO_OFFLOAD);
  spec.mutable_optimizer()->set_kind(tandem::v1::OPTIMIZER_KIND_ADAM);
  spec.mutable_distributed()->set_replicas(4);
  spec.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_PARTITIONED);
  absl::StatusOr<JobManager::Resolved> unpinned = jobs_->Resolve(spec, /*plan=*/true);
  ASSERT_TRUE(unpinned.ok()) << unpinned.status();
  absl::StatusOr<MemoryEstimate> estimated = jobs_->Estimate(unpinned->spec);
  ASSERT_TRUE(estimated.ok()) << estimated.status();
  const MemoryEstimate& whole = *estimated;
  EXPECT_EQ(whole.optimizer_state_bytes, whole.optimizer_state_total_bytes);
  const tandem::v1::Plan& plan = unpinned->plan;
  int64_t host_layers = 0;
  for (const tandem::v1::LayerPlan& l : plan.layers()) {
    if (l.update() == tandem::v1::PLACEMENT_HOST) ++host_layers;
  }
  ASSERT_GT(host_layers, 0) << plan.solver().note();

  spec = unpinned->spec;
  *spec.mutable_placement()->mutable_plan() = plan;
  absl::StatusOr<MemoryEstimate> piece = jobs_->Estimate(spec);
  ASSERT_TRUE(piece.ok()) << piece.status();
  // zero_offload updates every layer with weights on the host: Adam's two
  // moments cut in 4, and a float per moment and layer more at most.
  const int64_t total = whole.optimizer_state_total_bytes;
  EXPECT_GE(piece->optimizer_state_bytes, total / 4);
  EXPECT_LE(piece->optimizer_state_bytes, 2 * 4 * ((total / 8 + 3) / 4 + host_layers));
  EXPECT_EQ(whole.host_bytes - piece->host_bytes,
            whole.optimizer_state_bytes - piece->optimizer_state_bytes);
  EXPECT_NE(piece->Describe().find("this rank's pieces of"), std::string::npos)
      << piece->Describe();
  EXPECT_EQ(plan.batch_size(), (spec.training().batch_size() + 3) / 4);
  EXPECT_EQ(unpinned->estimate.optimizer_state_bytes, piece->optimizer_state_bytes);
  EXPECT_EQ(unpinned->estimate.host_bytes, piece->host_bytes);
  EXPECT_EQ(jobs_->Estimate(unpinned->spec, &plan)->host_bytes, piece->host_bytes);
  // Replicated, the same plan keeps the whole.
  tandem::v1::JobSpec replicated = spec;
  replicated.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  EXPECT_EQ(jobs_->Estimate(replicated)->optimizer_state_bytes, total);

  // In bf16 a rank also keeps bf16 working copies of the weights and their
  // bf16 gradients, 4 bytes a weight; partitioned, only its pieces of the
  // fp32 master weights (cut as the moments), replicated all of them.
  const int64_t weights = total / 8;  // Adam: two fp32 moments a weight
  spec.set_precision(tandem::v1::PRECISION_BF16);
  replicated.set_precision(tandem::v1::PRECISION_BF16);
  absl::StatusOr<MemoryEstimate> bf16_piece = jobs_->Estimate(spec);
  absl::StatusOr<MemoryEstimate> bf16_whole = jobs_->Estimate(replicated);
  ASSERT_TRUE(bf16_piece.ok()) << bf16_piece.status();
  ASSERT_TRUE(bf16_whole.ok()) << bf16_whole.status();
  EXPECT_EQ(bf16_whole->parameter_bytes - piece->parameter_bytes, 4 * weights);
  const int64_t masters = bf16_piece->parameter_bytes - piece->parameter_bytes;
  EXPECT_GE(masters, 4 * (weights / 4));
  EXPECT_LE(masters, 4 * ((weights + 3) / 4 + host_layers));
}

TEST_F(JobManagerTest, HybridJobsArePlannedAtSubmissionAndRunUnderThePlan) {
  Open("hybrid", int64_t{1} << 32, true, TestNode());
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  // Too small for any reuse_distance plan: refused at once, with what it needs.
  absl::Status refused = jobs_->Submit(EmulatedSpec(64 << 10), "").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_NE(refused.message().find("it needs at least"), std::string::npos) << refused;
  // CUDA on a node without one.
  tandem::v1::JobSpec cuda = EmulatedSpec(0);
  cuda.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_CUDA);
  refused = jobs_->Submit(cuda, "").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("placement.accelerator"), std::string::npos) << refused;

  const int64_t capacity = kHybridCapacity;
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(EmulatedSpec(capacity), "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->job.plan().strategy(), tandem::v1::STRATEGY_REUSE_DISTANCE);
  EXPECT_TRUE(s->job.plan().feasible());
  EXPECT_GT(s->job.metrics().predicted_step_seconds(), 0);
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress().step(), 6);
  EXPECT_GT(done.metrics().peak_accelerator_bytes(), 0);
  EXPECT_LE(done.metrics().peak_accelerator_bytes(), capacity);
  EXPECT_EQ(done.plan().layers_size(), s->job.plan().layers_size());
  EXPECT_EQ(done.measured_timeline().source(), "measured");
  EXPECT_GT(done.measured_timeline().spans_size(), 0);
  // The arena's capacity was reserved on the host while it ran.
  EXPECT_GE(done.reserved_host_bytes(), capacity);

  // Per-layer timings reached the metrics: forward, backward and update series.
  const std::string text = metrics_.Serialize();
  for (const char* phase : {"forward", "backward", "update"}) {
    const std::string series = absl::StrCat("tandem_layer_step_seconds_count{job_id=\"", done.id(),
                                            "\",layer=\"linear1\",phase=\"", phase, "\"}");
    EXPECT_NE(text.find(series), std::string::npos)
        << series << " not among\n"
        << [&] {
             std::string counts;
             for (absl::string_view line : absl::StrSplit(text, '\n')) {
               if (absl::StartsWith(line, "tandem_layer_step_seconds_count"))
                 absl::StrAppend(&counts, line, "\n");
             }
             return counts;
           }();
  }
  EXPECT_NE(text.find(absl::StrCat("tandem_job_predicted_step_seconds{job_id=\"", done.id())),
            std::string::npos);
  // And the executor's resources: busy time on the emulated accelerator's
  // compute stream, and its staging memory.
  for (const std::string& series :
       {absl::StrCat("tandem_resource_busy_seconds_total{device=\"emulated:0\",job_id=\"",
                     done.id(), "\",resource=\"accelerator_compute\"}"),
        absl::StrCat("tandem_pinned_host_memory_bytes{device=\"emulated:0\",job_id=\"", done.id(),
                     "\"}"),
        absl::StrCat(
            "tandem_job_accelerator_memory_bytes{category=\"parameters\",device=\"emulated:"
            "0\",job_id=\"",
            done.id(), "\"}"),
        absl::StrCat("tandem_job_accelerator_memory_peak_bytes{device=\"emulated:0\",job_id=\"",
                     done.id(), "\"}")}) {
    EXPECT_NE(text.find(series), std::string::npos) << series << " not in\n" << text;
  }
}

// The plan flows once: submission resolves the spec, builds the model (for the
// estimate and the plan) and solves the plan; the run uses the stored spec and
// plan and builds the model once more, for training. Nothing is done twice.
TEST_F(JobManagerTest, EachJobIsResolvedAndPlannedOnceAndItsModelBuiltOncePerRun) {
  Open("once", int64_t{1} << 32, true, TestNode());
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const int64_t resolutions = work_counters::spec_resolutions.load();
  const int64_t plans = work_counters::plan_solves.load();
  const int64_t builds = work_counters::model_builds.load();
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(EmulatedSpec(kHybridCapacity), "");
  ASSERT_TRUE(s.ok()) << s.status();
  // Counted once the job has run (it may start before Submit returns).
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(work_counters::spec_resolutions.load() - resolutions, 1);
  EXPECT_EQ(work_counters::plan_solves.load() - plans, 1);
  EXPECT_EQ(work_counters::model_builds.load() - builds, 2);
  // It ran under the plan it was admitted with.
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(done.plan().prediction(),
                                                                 s->job.plan().prediction()));
  EXPECT_EQ(done.plan().layers_size(), s->job.plan().layers_size());
}

// The record keeps the step program the plan lowered to at submission, and
// the run executes that stored program. One damaged while the job was queued
// does not run: the plan is lowered again, the job's log says so, and the
// record ends with the program that ran.
TEST_F(JobManagerTest, TheRecordKeepsTheStepProgramAndTheRunExecutesIt) {
  Open("program", int64_t{1} << 32, true, TestNode());
  ASSERT_TRUE(jobs_->Recover().ok());
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(EmulatedSpec(kHybridCapacity), "");
  ASSERT_TRUE(s.ok()) << s.status();
  const tandem::v1::Schedule& program = s->job.schedule();
  ASSERT_GT(program.ops_size(), 0);
  EXPECT_EQ(program.mode(), tandem::v1::Schedule::MODE_ACCELERATOR);
  EXPECT_EQ(program.layers_size(), s->job.plan().layers_size());
  absl::StatusOr<std::optional<tandem::v1::Job>> stored = store_->GetJob(s->job.id());
  ASSERT_TRUE(stored.ok() && stored->has_value());
  EXPECT_EQ((*stored)->schedule().SerializeAsString(), program.SerializeAsString());
  // A second job whose stored program is damaged before it runs.
  absl::StatusOr<JobManager::Submitted> damaged = jobs_->Submit(EmulatedSpec(kHybridCapacity), "");
  ASSERT_TRUE(damaged.ok()) << damaged.status();
  tandem::v1::Job record = *store_->GetJob(damaged->job.id()).value();
  record.mutable_schedule()->mutable_ops(0)->add_deps()->set_op(1 << 20);
  ASSERT_TRUE(store_->UpdateJob(record).ok());
  Close();
  Open("program", int64_t{1} << 32, /*fresh=*/false, TestNode());
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.schedule().SerializeAsString(), program.SerializeAsString());
  const tandem::v1::Job repaired = WaitFor(damaged->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(repaired.schedule().SerializeAsString(), program.SerializeAsString());
  bool warned = false;
  const std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(damaged->job.id(), 1, 10000);
  for (const auto& e : events) {
    warned |= e.has_log() && e.log().severity() == tandem::v1::LOG_SEVERITY_WARNING &&
              e.log().message().find("stored step program is not this plan's lowering") !=
                  std::string::npos;
  }
  EXPECT_TRUE(warned);
  // The undamaged job's log has no such warning.
  const std::vector<tandem::v1::JobEvent> clean = *store_->ReadEvents(s->job.id(), 1, 10000);
  for (const auto& e : clean) {
    EXPECT_FALSE(e.has_log() && e.log().message().find("stored step program") != std::string::npos)
        << e.log().message();
  }
}

// A program too large for the record's readers (1,024 micro-batches of 130
// layers, the most the planner allows) is not stored; the job keeps its plan
// and the run lowers it.
TEST_F(JobManagerTest, AProgramOverTheRecordLimitIsLeftToTheRun) {
  Open("big-program", int64_t{1} << 32, true, TestNode());
  ASSERT_TRUE(jobs_->Recover().ok());
  tandem::v1::JobSpec spec = EmulatedSpec(64 << 20);
  spec.mutable_model()->mutable_mlp()->clear_hidden_sizes();
  for (int i = 0; i < 64; ++i) spec.mutable_model()->mutable_mlp()->add_hidden_sizes(32);
  spec.mutable_training()->set_batch_size(1024);
  spec.mutable_placement()->set_micro_batch_size(1);
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(spec, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->job.plan().micro_batch_size(), 1);
  EXPECT_GT(s->job.plan().layers_size(), 0);
  EXPECT_EQ(s->job.schedule().ops_size(), 0);
  // The same job at 16 micro-batches keeps its program.
  spec.mutable_training()->set_batch_size(16);
  s = jobs_->Submit(spec, "");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_GT(s->job.schedule().ops_size(), 0);
}

// A cancel asked for while a distributed run is stuck (here its ranks'
// rendezvous, which then gives up UNAVAILABLE as a lost rank does) ends the
// job CANCELLED: it is not restarted as after a lost rank, and the cancel
// is not forgotten.
TEST_F(JobManagerTest, ACancelDuringADistributedRendezvousEndsTheJob) {
  std::atomic<int> runs{0};
  absl::Notification joining, give_up;
  OpenDistributed("cancel-rendezvous",
                  [&](const Model&, const tandem::v1::JobSpec&, int64_t,
                      Allocator*) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
                    if (runs.fetch_add(1) == 0) joining.Notify();
                    give_up.WaitForNotification();
                    return absl::UnavailableError("the ranks did not join");
                  });
  tandem::v1::JobSpec spec = Spec(6);
  spec.mutable_distributed()->set_replicas(2);
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(spec, "");
  ASSERT_TRUE(s.ok()) << s.status();
  joining.WaitForNotification();
  ASSERT_TRUE(jobs_->Cancel(s->job.id(), "wrong data").ok());
  give_up.Notify();
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(done.reason(), "cancelled: wrong data");
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(jobs_->Get(s->job.id())->state(), tandem::v1::JOB_STATE_CANCELLED);
}

// A distributed run whose ranks stopped together for a peer shutting down
// (rank 0's run ends CANCELLED while nobody here asked for it, and this
// tandemd is not stopping) is a lost rank: the job waits for the peer as
// after any loss, and says why, instead of claiming this tandemd shut down.
TEST_F(JobManagerTest, RanksStoppedForAPeerShuttingDownRestartAsAfterALostRank) {
  std::atomic<int> runs{0};
  OpenDistributed("peer-stopped",
                  [&](const Model&, const tandem::v1::JobSpec&, int64_t,
                      Allocator*) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
                    ++runs;
                    return absl::CancelledError("stopped at step 0 of 6");
                  });
  tandem::v1::JobSpec spec = Spec(6);
  spec.mutable_distributed()->set_replicas(2);
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(spec, "");
  ASSERT_TRUE(s.ok()) << s.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (runs.load() < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_GE(runs.load(), 2) << "the job was not restarted";
  const tandem::v1::Job job = *jobs_->Get(s->job.id());
  EXPECT_NE(job.state(), tandem::v1::JOB_STATE_FAILED) << job.reason();
  bool said = false;
  const std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(s->job.id(), 1, 10000);
  for (const auto& e : events) {
    said |= e.has_state_change() &&
            absl::StrContains(e.state_change().reason(),
                              "the ranks stopped together for a rank's tandemd shutting down");
    EXPECT_FALSE(e.has_state_change() &&
                 absl::StrContains(e.state_change().reason(), "interrupted by tandemd"))
        << e.state_change().reason();
  }
  EXPECT_TRUE(said);
  ASSERT_TRUE(jobs_->Cancel(s->job.id(), "done").ok());
  WaitFor(s->job.id(), tandem::v1::JOB_STATE_CANCELLED);
}

// A daemon restarted with a smaller host budget fails the queued jobs that
// no longer fit it (at recovery, with the numbers), instead of keeping them
// queued forever in front of every job behind them.
TEST_F(JobManagerTest, AJobLargerThanTheBudgetAfterARestartFailsAndHoldsNoQueue) {
  Open("smaller-budget", int64_t{1} << 32);
  ASSERT_TRUE(jobs_->Recover().ok());
  tandem::v1::JobSpec big = Spec(6);
  big.mutable_model()->mutable_mlp()->clear_hidden_sizes();
  for (int i = 0; i < 2; ++i) big.mutable_model()->mutable_mlp()->add_hidden_sizes(2048);
  absl::StatusOr<JobManager::Submitted> queued = jobs_->Submit(big, "");
  ASSERT_TRUE(queued.ok()) << queued.status();
  const int64_t big_bytes = jobs_->Estimate(queued->job.resolved_spec())->host_bytes;
  Close();
  Open("smaller-budget", big_bytes / 2, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  const tandem::v1::Job failed = WaitFor(queued->job.id(), tandem::v1::JOB_STATE_FAILED, 5);
  EXPECT_NE(failed.reason().find("cannot resume after restart"), std::string::npos)
      << failed.reason();
  EXPECT_NE(failed.reason().find("--host_memory_budget"), std::string::npos) << failed.reason();
  absl::StatusOr<JobManager::Submitted> small = jobs_->Submit(Spec(2), "");
  ASSERT_TRUE(small.ok()) << small.status();
  WaitFor(small->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
}

// A failed job's ERROR line is stored like its other events: the stored
// sequence has no gap, and a replay after the job left memory shows it.
TEST_F(JobManagerTest, AFailedJobsErrorLineIsStoredInSequence) {
  Open("error-line", int64_t{1} << 32, true, std::nullopt, [](JobManagerOptions& options) {
    options.make_runner = [](const Model&, const tandem::v1::JobSpec&, int64_t,
                             Allocator*) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
      return absl::InternalError("the runner broke");
    };
  });
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(Spec(4), "");
  ASSERT_TRUE(s.ok()) << s.status();
  const tandem::v1::Job failed = WaitFor(s->job.id(), tandem::v1::JOB_STATE_FAILED);
  Close();  // every pending event flushed
  store_ = *JobStore::Open(dir_ + "/jobs.db");
  const std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(s->job.id(), 1, 10000);
  ASSERT_FALSE(events.empty());
  bool error_line = false;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].sequence(), i + 1) << events[i].ShortDebugString();
    error_line |= events[i].has_log() &&
                  events[i].log().severity() == tandem::v1::LOG_SEVERITY_ERROR &&
                  absl::StrContains(events[i].log().message(), "the runner broke");
  }
  EXPECT_TRUE(error_line);
  EXPECT_EQ(events.back().sequence(), failed.last_event_sequence());
}

// A cancel of a running job is stored before it is acknowledged: a tandemd
// that went down before the job's next step boundary ends the job CANCELLED
// when it restarts, instead of resuming it.
TEST_F(JobManagerTest, ACancelAcknowledgedWhileTheJobRanSurvivesARestart) {
  Open("cancel-restart");
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(Spec(100000), "");
  ASSERT_TRUE(s.ok()) << s.status();
  WaitFor(s->job.id(), tandem::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(jobs_->Cancel(s->job.id(), "wrong data").ok());
  // What a crash right now would leave: the stored record says so.
  tandem::v1::Job stored = *store_->GetJob(s->job.id()).value();
  EXPECT_EQ(stored.cancel_requested(), "cancelled: wrong data");
  WaitFor(s->job.id(), tandem::v1::JOB_STATE_CANCELLED);
  // A restart that finds the job running with its cancel stored.
  stored.set_state(tandem::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store_->UpdateJob(stored).ok());
  Close();
  Open("cancel-restart", int64_t{1} << 32, /*fresh=*/false);
  ASSERT_TRUE(jobs_->Recover().ok());
  const tandem::v1::Job recovered = *jobs_->Get(s->job.id());
  EXPECT_EQ(recovered.state(), tandem::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(recovered.reason(), "cancelled: wrong data");
}

// A data-parallel rank computes on its share of each batch: it reserves
// activations for that share, as one replica of that batch would, not for
// the whole batch.
TEST_F(JobManagerTest, ARankReservesActivationsForItsShareOfTheBatch) {
  Open("rank-share");
  tandem::v1::JobSpec one = Spec(6, 0, 64);
  tandem::v1::JobSpec four = Spec(6, 0, 256);
  four.mutable_distributed()->set_replicas(4);
  four.mutable_distributed()->set_sharding(tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  absl::StatusOr<JobManager::Resolved> r1 = jobs_->Resolve(one, /*plan=*/false);
  absl::StatusOr<JobManager::Resolved> r4 = jobs_->Resolve(four, /*plan=*/false);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(r4.ok()) << r4.status();
  absl::StatusOr<MemoryEstimate> e1 = jobs_->Estimate(r1->spec);
  absl::StatusOr<MemoryEstimate> e4 = jobs_->Estimate(r4->spec);
  ASSERT_TRUE(e1.ok()) << e1.status();
  ASSERT_TRUE(e4.ok()) << e4.status();
  EXPECT_GT(e1->activation_bytes, 0);
  EXPECT_EQ(e4->activation_bytes, e1->activation_bytes);
}

// A pipeline runs its runner's own schedule, not a step program of the plan
// executor: its record stores none, and its log never says that the stored
// one was replaced (it did, for every pipeline job, while submission stored
// the one-device lowering of the pipeline's plan).
TEST_F(JobManagerTest, APipelineJobStoresNoStepProgramAndRunsWithoutWarnings) {
  node::NodeOffer node = TestNode();
  node.emulated_accelerators = 2;
  Open("pipeline-program", int64_t{1} << 32, true, node);
  ASSERT_TRUE(jobs_->Recover().ok());
  jobs_->Start();
  tandem::v1::JobSpec spec = EmulatedSpec(int64_t{64} << 20);
  spec.mutable_placement()->set_strategy(tandem::v1::STRATEGY_UNSPECIFIED);
  spec.mutable_placement()->mutable_pipeline()->set_stages(2);
  absl::StatusOr<JobManager::Submitted> s = jobs_->Submit(spec, "");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->job.plan().pipeline_size(), 2);
  EXPECT_EQ(s->job.schedule().ops_size(), 0);
  const tandem::v1::Job done = WaitFor(s->job.id(), tandem::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.schedule().ops_size(), 0);
  const std::vector<tandem::v1::JobEvent> events = *store_->ReadEvents(s->job.id(), 1, 10000);
  EXPECT_FALSE(events.empty());
  for (const auto& e : events) {
    EXPECT_FALSE(e.has_log() && e.log().severity() == tandem::v1::LOG_SEVERITY_WARNING)
        << e.log().message();
  }
}

TEST_F(JobManagerTest, WithoutANodeJobsAskingForAnAcceleratorAreRefused) {
  Open("no-node");
  const absl::Status s = jobs_->Submit(EmulatedSpec(kHybridCapacity), "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("placement.accelerator"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::server
