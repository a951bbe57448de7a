#include "server/store/job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "gtest/gtest.h"

namespace tandem::server {
namespace {

std::string Db(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir + "/jobs.db";
}

tandem::v1::Job NewJob(const std::string& request_id, int priority = 0) {
  tandem::v1::Job job;
  job.set_request_id(request_id);
  job.set_state(tandem::v1::JOB_STATE_QUEUED);
  job.mutable_spec()->set_priority(priority);
  return job;
}

tandem::v1::JobEvent StateEvent(uint64_t seq) {
  tandem::v1::JobEvent e;
  e.set_sequence(seq);
  e.mutable_state_change()->set_to(tandem::v1::JOB_STATE_QUEUED);
  return e;
}

// Runs `sql` on the store's database file behind its back (a damaged or
// forged store).
void ExecOn(const std::string& path, const char* sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  EXPECT_EQ(sqlite3_exec(db, sql, nullptr, nullptr, nullptr), SQLITE_OK) << sql;
  sqlite3_close(db);
}

TEST(JobStoreTest, InsertGetAndReopen) {
  const std::string path = Db("reopen");
  std::string id;
  {
    auto store = *JobStore::Open(path);
    absl::StatusOr<tandem::v1::Job> job = store->InsertJob(NewJob("r1"), {StateEvent(1)});
    ASSERT_TRUE(job.ok()) << job.status();
    id = job->id();
    EXPECT_EQ(id, "job-000001");
    EXPECT_EQ(job->last_event_sequence(), 1u);
  }
  auto store = *JobStore::Open(path);
  auto got = *store->GetJob(id);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->request_id(), "r1");
  auto events = *store->ReadEvents(id, 1, 10);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].job_id(), id);
  // Ids continue after a reopen.
  EXPECT_EQ(store->InsertJob(NewJob("r2"), {})->id(), "job-000002");
}

// A writable store keeps a reserve file of real blocks (not a sparse file,
// which would free nothing when deleted), found again on reopen; removed, it
// is made again by RestoreReserve.
TEST(JobStoreTest, TheReserveIsAllocatedAndMadeAgain) {
  const std::string path = Db("reserve");
  const std::string reserve = path + ".reserve";
  auto blocks_bytes = [&reserve] {
    struct stat st;
    return stat(reserve.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_blocks) * 512 : -1;
  };
  {
    auto store = *JobStore::Open(path);
    EXPECT_TRUE(store->has_reserve());
    EXPECT_GE(blocks_bytes(), JobStore::kReserveBytes);
  }
  auto store = *JobStore::Open(path);
  EXPECT_TRUE(store->has_reserve());
  std::filesystem::remove(reserve);
  // The store still believes it there until it needs it; a new store finds it gone.
  auto fresh = *JobStore::Open(path);
  EXPECT_TRUE(fresh->has_reserve());
  EXPECT_GE(blocks_bytes(), JobStore::kReserveBytes);
}

// Only an id exactly as the store writes it names a job: no sign, no
// whitespace, no other zero padding.
TEST(JobStoreTest, JobIdsAreStrict) {
  EXPECT_EQ(JobStore::SequenceOf("job-000042"), 42);
  EXPECT_EQ(JobStore::SequenceOf("job-1234567"), 1234567);
  EXPECT_EQ(JobStore::FormatJobId(1234567), "job-1234567");
  for (const char* bad : {"job-+00042", "job-42", "job-0000042", "job- 000042", "job-000042 ",
                          "job--00042", "job-000000", "job-", "Job-000042", "job-00004x"}) {
    EXPECT_EQ(JobStore::SequenceOf(bad), 0) << bad;
  }
  auto store = *JobStore::Open(Db("strict-ids"));
  ASSERT_TRUE(store->InsertJob(NewJob("s1"), {}).ok());
  EXPECT_TRUE(store->GetJob("job-000001")->has_value());
  EXPECT_FALSE(store->GetJob("job-+1")->has_value());
  EXPECT_FALSE(store->GetJob("job-1")->has_value());
}

TEST(JobStoreTest, RequestIdIsUnique) {
  auto store = *JobStore::Open(Db("unique"));
  ASSERT_TRUE(store->InsertJob(NewJob("same"), {}).ok());
  EXPECT_EQ(store->InsertJob(NewJob("same"), {}).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store->FindByRequestId("same")->has_value());
  EXPECT_FALSE(store->FindByRequestId("other")->has_value());
  // Empty request ids never collide.
  EXPECT_TRUE(store->InsertJob(NewJob(""), {}).ok());
  EXPECT_TRUE(store->InsertJob(NewJob(""), {}).ok());
}

TEST(JobStoreTest, ConcurrentInsertsAreGroupCommittedWithoutLoss) {
  auto store = *JobStore::Open(Db("concurrent"));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        if (!store
                 ->InsertJob(NewJob("t" + std::to_string(t) + "-" + std::to_string(i)),
                             {StateEvent(1)})
                 .ok()) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  JobFilter all;
  all.limit = 1000;
  EXPECT_EQ(store->ListJobs(all)->total, 200);
}

TEST(JobStoreTest, ListFiltersAndPagesNewestFirst) {
  auto store = *JobStore::Open(Db("list"));
  for (int i = 0; i < 7; ++i) {
    tandem::v1::Job job = NewJob("");
    if (i % 2 == 0) job.set_state(tandem::v1::JOB_STATE_SUCCEEDED);
    (*job.mutable_spec()->mutable_labels())["team"] = i < 5 ? "a" : "b";
    ASSERT_TRUE(store->InsertJob(job, {}).ok());
  }
  JobFilter f;
  f.limit = 3;
  JobPage p1 = *store->ListJobs(f);
  ASSERT_EQ(p1.jobs.size(), 3u);
  EXPECT_EQ(p1.jobs[0].id(), "job-000007");
  EXPECT_EQ(p1.total, 7);
  f.before_sequence = p1.next_before;
  JobPage p2 = *store->ListJobs(f);
  EXPECT_EQ(p2.jobs[0].id(), "job-000004");
  f.before_sequence = p2.next_before;
  JobPage p3 = *store->ListJobs(f);
  EXPECT_EQ(p3.jobs.size(), 1u);
  EXPECT_EQ(p3.next_before, 0);
  JobFilter succeeded_a;
  succeeded_a.states = {tandem::v1::JOB_STATE_SUCCEEDED};
  succeeded_a.labels = {{"team", "a"}};
  EXPECT_EQ(store->ListJobs(succeeded_a)->total, 3);  // jobs 1, 3, 5
}

TEST(JobStoreTest, UpdateReplacesTheRecordAndAppendsEvents) {
  auto store = *JobStore::Open(Db("update"));
  tandem::v1::Job job = *store->InsertJob(NewJob("u"), {StateEvent(1)});
  job.set_state(tandem::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store->UpdateJob(job, {StateEvent(2), StateEvent(3)}).ok());
  EXPECT_EQ((*store->GetJob(job.id()))->state(), tandem::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store->ReadEvents(job.id(), 2, 10)->size(), 2u);
  EXPECT_EQ(store->LoadUnfinished()->size(), 1u);
  tandem::v1::Job ghost = job;
  ghost.set_id("job-999999");
  EXPECT_EQ(store->UpdateJob(ghost).code(), absl::StatusCode::kNotFound);
}

// A chatty job's stored log is bounded: its newest events and every state
// change stay, the rest go.
TEST(JobStoreTest, EventRetentionKeepsTheNewestAndEveryStateChange) {
  auto store = *JobStore::Open(Db("retention"));
  const std::string id = store->InsertJob(NewJob("r"), {StateEvent(1)})->id();
  for (uint64_t seq = 2; seq <= 1000; seq += 10) {
    std::vector<tandem::v1::JobEvent> batch;
    for (uint64_t s = seq; s < seq + 10; ++s) {
      tandem::v1::JobEvent e = s == 500 ? StateEvent(s) : tandem::v1::JobEvent();
      e.set_sequence(s);
      e.set_job_id(id);
      if (s != 500) e.mutable_log()->set_message("chatty");
      batch.push_back(e);
    }
    ASSERT_TRUE(store->AppendEvents(batch, /*keep_per_job=*/50).ok());
  }
  const std::vector<tandem::v1::JobEvent> kept = *store->ReadEvents(id, 1, 100000);
  ASSERT_EQ(kept.size(), 52u);  // 1 and 500 (state changes), then 952..1001
  EXPECT_EQ(kept[0].sequence(), 1u);
  EXPECT_EQ(kept[1].sequence(), 500u);
  EXPECT_EQ(kept[2].sequence(), 952u);
  EXPECT_EQ(kept.back().sequence(), 1001u);
  EXPECT_EQ(*store->LastEventSequence(id), 1001u);
}

// After a crash the numbers jump (the event log's reservation): retention
// still keeps the newest 50 events, not only those within 50 numbers of the
// last.
TEST(JobStoreTest, EventRetentionCountsEventsAcrossAJumpInNumbers) {
  auto store = *JobStore::Open(Db("retention-jump"));
  const std::string id = store->InsertJob(NewJob("j"), {StateEvent(1)})->id();
  // Log events `first` to `last` of the job.
  auto logs = [&id](uint64_t first, uint64_t last) {
    std::vector<tandem::v1::JobEvent> batch;
    for (uint64_t s = first; s <= last; ++s) {
      tandem::v1::JobEvent& e = batch.emplace_back();
      e.set_sequence(s);
      e.set_job_id(id);
      e.mutable_log()->set_message("chatty");
    }
    return batch;
  };
  ASSERT_TRUE(store->AppendEvents(logs(2, 51), /*keep_per_job=*/50).ok());       // before the crash
  ASSERT_TRUE(store->AppendEvents(logs(1025, 1034), /*keep_per_job=*/50).ok());  // after
  const std::vector<tandem::v1::JobEvent> kept = *store->ReadEvents(id, 1, 100000);
  ASSERT_EQ(kept.size(), 51u);  // the state change, 12..51 and 1025..1034
  EXPECT_EQ(kept[0].sequence(), 1u);
  EXPECT_EQ(kept[1].sequence(), 12u);
  EXPECT_EQ(kept.back().sequence(), 1034u);
}

// A store written before event retention (no state_change column) opens,
// gains the column and keeps its rows.
TEST(JobStoreTest, AStoreFromBeforeRetentionIsMigrated) {
  const std::string path = Db("migrate");
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE events (job_seq INTEGER NOT NULL, sequence INTEGER NOT "
                           "NULL, event BLOB NOT NULL, PRIMARY KEY (job_seq, sequence)) WITHOUT "
                           "ROWID; INSERT INTO events VALUES (1, 1, x'');",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->read_only().ok()) << (*store)->read_only();
  const std::string id = (*store)->InsertJob(NewJob("r"), {StateEvent(2)})->id();
  EXPECT_EQ(id, "job-000001");
  EXPECT_EQ((*store)->ReadEvents(id, 1, 10)->size(), 2u);
}

// A store whose last job number is the largest an int64 holds (forged or
// damaged: job_store_fuzz found the overflow) opens writable, keeps its
// jobs, and refuses new ones instead of overflowing.
TEST(JobStoreTest, AStoreAtTheLastJobNumberRefusesNewJobs) {
  const std::string path = Db("last-number");
  {
    auto store = *JobStore::Open(path);
    ASSERT_TRUE(store->InsertJob(NewJob("a"), {}).ok());
  }
  ExecOn(path, "UPDATE jobs SET seq = 9223372036854775807 WHERE seq = 1");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->read_only().ok()) << (*store)->read_only();
  absl::StatusOr<JobPage> page = (*store)->ListJobs(JobFilter());
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs.size(), 1u);
  absl::StatusOr<tandem::v1::Job> refused = (*store)->InsertJob(NewJob("b"), {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

// A record that no longer decodes (a damaged disk, a bad edit) is listed with
// what its row still says, counted, and reported; never silently dropped.
TEST(JobStoreTest, ADamagedRecordIsListedAsSuchNotDropped) {
  const std::string path = Db("damaged");
  {
    auto store = *JobStore::Open(path);
    for (const char* r : {"a", "b", "c"}) ASSERT_TRUE(store->InsertJob(NewJob(r), {}).ok());
  }
  ExecOn(path, "UPDATE jobs SET job = x'ffffffffffff' WHERE seq = 2");
  auto store = *JobStore::Open(path);
  absl::StatusOr<JobPage> page = store->ListJobs(JobFilter());
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs.size(), 3u);
  EXPECT_EQ(page->total, 3);
  const tandem::v1::Job& damaged = page->jobs[1];
  EXPECT_EQ(damaged.id(), "job-000002");
  EXPECT_EQ(damaged.state(), tandem::v1::JOB_STATE_QUEUED);
  EXPECT_NE(damaged.reason().find("damaged (6 bytes that do not decode)"), std::string::npos)
      << damaged.reason();
  EXPECT_EQ(store->GetJob("job-000002").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ((*store->CountByState())[tandem::v1::JOB_STATE_QUEUED], 3);
  // Recovery cannot resume it, and says so rather than failing.
  absl::StatusOr<std::vector<tandem::v1::Job>> unfinished = store->LoadUnfinished();
  ASSERT_TRUE(unfinished.ok()) << unfinished.status();
  EXPECT_EQ(unfinished->size(), 2u);
  // The store stays writable around it.
  EXPECT_TRUE(store->read_only().ok());
  EXPECT_EQ(store->InsertJob(NewJob("d"), {})->id(), "job-000004");
}

}  // namespace
}  // namespace tandem::server
