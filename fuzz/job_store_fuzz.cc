// Fuzz target: recovery of the job store from rows a crash, a bad disk or an
// older build may have left. A fresh store is made (so its schema is the
// code's), the input's rows are written into it with plain SQL, and the store
// is opened again and read the way tandemd does at start and after: unfinished
// jobs, the list, each job, its events, the counts, and one new submit.
//
// Input: records until the bytes run out, each
//   kind (1 byte: even = a job row, odd = an event row)
//   seq  (8 bytes, little-endian; a job's seq, or an event's job_seq)
//   n    (8 bytes: the state of a job row, the sequence of an event row)
//   len  (2 bytes) and that many bytes: the row's protobuf blob
//
// Checks: nothing crashes; a damaged row is listed, never dropped (ListJobs
// counts every row); the new job gets an id no row has.
#include <sqlite3.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "fuzz/scratch_dir.h"
#include "server/store/job_store.h"

namespace {

using tandem::server::JobStore;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "job_store_fuzz: %s\n", what.c_str());
  std::abort();
}

struct Reader {
  const uint8_t* p;
  size_t left;
  bool Take(void* out, size_t n) {
    if (left < n) return false;
    std::memcpy(out, p, n);
    p += n;
    left -= n;
    return true;
  }
};

// Writes the input's rows with plain SQL (constraint violations, such as a
// repeated seq, are skipped as SQLite would refuse them from tandemd too).
void WriteRows(const std::string& path, const uint8_t* data, size_t size,
               std::set<int64_t>* job_seqs) {
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) Fail(sqlite3_errmsg(db));
  sqlite3_stmt* job = nullptr;
  sqlite3_stmt* event = nullptr;
  if (sqlite3_prepare_v2(db,
                         "INSERT INTO jobs (seq, request_id, state, priority, create_us, job) "
                         "VALUES (?, NULL, ?, 0, 0, ?)",
                         -1, &job, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v2(db,
                         "INSERT INTO events (job_seq, sequence, event, state_change) "
                         "VALUES (?, ?, ?, 0)",
                         -1, &event, nullptr) != SQLITE_OK) {
    Fail(sqlite3_errmsg(db));
  }
  Reader in{data, size};
  for (int rows = 0; rows < 64; ++rows) {
    uint8_t kind;
    int64_t seq, n;
    uint16_t len;
    if (!in.Take(&kind, 1) || !in.Take(&seq, 8) || !in.Take(&n, 8) || !in.Take(&len, 2)) break;
    len = std::min<size_t>(len, in.left);
    sqlite3_stmt* s = (kind & 1) ? event : job;
    sqlite3_reset(s);
    sqlite3_bind_int64(s, 1, seq);
    sqlite3_bind_int64(s, 2, n);
    sqlite3_bind_blob(s, 3, in.p, len, SQLITE_TRANSIENT);
    in.p += len;
    in.left -= len;
    if (sqlite3_step(s) == SQLITE_DONE && !(kind & 1)) job_seqs->insert(seq);
  }
  sqlite3_finalize(job);
  sqlite3_finalize(event);
  sqlite3_close(db);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tandem::fuzz::ScratchDir() + "/jobs.db";
  for (const char* suffix : {"", "-wal", "-shm"}) unlink((path + suffix).c_str());
  {
    absl::StatusOr<std::unique_ptr<JobStore>> fresh = JobStore::Open(path, JobStore::Sync::kNormal);
    if (!fresh.ok()) Fail(std::string(fresh.status().message()));
  }
  std::set<int64_t> job_seqs;
  WriteRows(path, data, size, &job_seqs);

  absl::StatusOr<std::unique_ptr<JobStore>> opened = JobStore::Open(path, JobStore::Sync::kNormal);
  if (!opened.ok())
    Fail(std::string("reopening failed: ") + std::string(opened.status().message()));
  JobStore& store = **opened;
  if (!store.read_only().ok()) Fail("the store opened read-only");
  (void)store.LoadUnfinished();
  (void)store.CountByState();
  tandem::server::JobFilter all;
  all.limit = 1000;
  absl::StatusOr<tandem::server::JobPage> page = store.ListJobs(all);
  if (!page.ok()) Fail(std::string(page.status().message()));
  if (page->total != static_cast<int64_t>(job_seqs.size())) {
    Fail("ListJobs counts " + std::to_string(page->total) + " jobs of " +
         std::to_string(job_seqs.size()) + " rows");
  }
  for (const tandem::v1::Job& job : page->jobs) {
    (void)store.GetJob(job.id());
    (void)store.ReadEvents(job.id(), 0, 100);
    (void)store.LastEventSequence(job.id());
  }
  tandem::v1::Job fresh_job;
  fresh_job.set_request_id("fuzz-new-job");
  absl::StatusOr<tandem::v1::Job> inserted = store.InsertJob(fresh_job, {});
  if (inserted.ok()) {
    if (job_seqs.count(JobStore::SequenceOf(inserted->id())) > 0) {
      Fail("a new job reuses " + inserted->id());
    }
  } else if (inserted.status().message().empty()) {
    Fail("InsertJob failed without a message");
  }
  return 0;
}
