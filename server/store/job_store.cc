#include "server/store/job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"

namespace tandem::server {
namespace {

using tandem::v1::Job;
using tandem::v1::JobEvent;

// The status for an SQLite result code: a full disk is RESOURCE_EXHAUSTED (the
// caller may try again once space is freed), an unwritable or failing disk
// UNAVAILABLE, a damaged file DATA_LOSS.
absl::Status StoreStatus(int rc, const std::string& message) {
  switch (rc & 0xff) {
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(
          absl::StrCat("job store: the disk holding the state directory is full (", message, ")"));
    case SQLITE_READONLY:
    case SQLITE_IOERR:
    case SQLITE_CANTOPEN:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(absl::StrCat("job store: ", message));
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(absl::StrCat("job store: ", message));
    default:
      return absl::InternalError(absl::StrCat("job store: ", message));
  }
}

absl::Status SqlError(sqlite3* db, const std::string& what) {
  return StoreStatus(sqlite3_extended_errcode(db), absl::StrCat(what, ": ", sqlite3_errmsg(db)));
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    const std::string message = err ? err : sqlite3_errstr(rc);
    sqlite3_free(err);
    return StoreStatus(rc, absl::StrCat(message, " in: ", sql));
  }
  return absl::OkStatus();
}

// A job whose stored record does not decode: listed with what the row still
// says (its id and state) rather than dropped, so ListJobs agrees with the
// counts and an operator can see what was lost.
Job DamagedJob(int64_t seq, int64_t state, size_t bytes) {
  Job job;
  job.set_id(JobStore::FormatJobId(seq));
  job.set_state(tandem::v1::JobState_IsValid(state) ? static_cast<tandem::v1::JobState>(state)
                                                    : tandem::v1::JOB_STATE_UNSPECIFIED);
  job.set_reason(absl::StrCat("the job store's record of this job is damaged (", bytes,
                              " bytes that do not decode); its spec and results are lost"));
  return job;
}

// A prepared statement, finalised on scope exit.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) stmt_ = nullptr;
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  bool ok() const { return stmt_ != nullptr; }
  sqlite3_stmt* get() { return stmt_; }
  void Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), s.size(), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), s.size(), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void BindNull(int i) { sqlite3_bind_null(stmt_, i); }
  int Step() { return sqlite3_step(stmt_); }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

int64_t MicrosOf(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000000 + t.nanos() / 1000;
}

// A job's event numbers reserved through `through` (never lowered).
absl::Status WriteReservation(sqlite3* db, int64_t job_seq, uint64_t through) {
  Statement s(db,
              "INSERT INTO event_reservations (job_seq, through) VALUES (?1, ?2) "
              "ON CONFLICT(job_seq) DO UPDATE SET through = MAX(through, ?2)");
  if (!s.ok()) return SqlError(db, "prepare event reservation");
  s.Bind(1, job_seq);
  s.Bind(2, static_cast<int64_t>(through));
  if (s.Step() != SQLITE_DONE) return SqlError(db, "reserve event sequences");
  return absl::OkStatus();
}

absl::Status InsertEvents(sqlite3* db, const std::vector<JobEvent>& events) {
  Statement s(db,
              "INSERT OR REPLACE INTO events(job_seq, sequence, event, state_change) "
              "VALUES(?, ?, ?, ?)");
  if (!s.ok()) return SqlError(db, "prepare event insert");
  for (const JobEvent& e : events) {
    sqlite3_reset(s.get());
    s.Bind(1, JobStore::SequenceOf(e.job_id()));
    s.Bind(2, static_cast<int64_t>(e.sequence()));
    s.BindBlob(3, e.SerializeAsString());
    s.Bind(4, int64_t{e.has_state_change()});
    if (s.Step() != SQLITE_DONE) return SqlError(db, "insert event");
  }
  return absl::OkStatus();
}

absl::Status WriteJobRow(sqlite3* db, const Job& job, bool insert) {
  Statement s(db, insert ? "INSERT INTO jobs(seq, request_id, state, priority, create_us, job) "
                           "VALUES(?, ?, ?, ?, ?, ?)"
                         : "UPDATE jobs SET request_id = ?2, state = ?3, priority = ?4, "
                           "create_us = ?5, job = ?6 WHERE seq = ?1");
  if (!s.ok()) return SqlError(db, "prepare job write");
  s.Bind(1, JobStore::SequenceOf(job.id()));
  if (job.request_id().empty()) {
    s.BindNull(2);
  } else {
    s.Bind(2, job.request_id());
  }
  s.Bind(3, static_cast<int64_t>(job.state()));
  s.Bind(4, static_cast<int64_t>(job.spec().priority()));
  s.Bind(5, MicrosOf(job.create_time()));
  s.BindBlob(6, job.SerializeAsString());
  const int rc = s.Step();
  if (rc == SQLITE_CONSTRAINT) {
    return absl::AlreadyExistsError(absl::StrCat("request_id '", job.request_id(), "' is taken"));
  }
  if (rc != SQLITE_DONE) return SqlError(db, insert ? "insert job" : "update job");
  if (!insert && sqlite3_changes(db) != 1)
    return absl::NotFoundError(absl::StrCat("no job ", job.id()));
  return absl::OkStatus();
}

absl::StatusOr<sqlite3*> OpenConnection(const std::string& path,
                                        int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return StoreStatus(rc, absl::StrCat("cannot open '", path, "': ", message));
  }
  sqlite3_busy_timeout(db, 10000);
  return db;
}

// A connection that reads `path` without writing anything: read-only, or, when
// even that needs a write (a WAL database's shared-memory file on a full disk)
// and the write-ahead log is empty, immutable.
absl::StatusOr<sqlite3*> OpenReadOnly(const std::string& path) {
  absl::StatusOr<sqlite3*> db = OpenConnection(path, SQLITE_OPEN_READONLY);
  if (db.ok()) {
    bool readable;
    {
      // Finalised before the connection may be closed.
      Statement probe(*db, "SELECT COUNT(*) FROM jobs");
      readable = probe.ok() && probe.Step() == SQLITE_ROW;
    }
    if (readable) return db;
    const absl::Status s = SqlError(*db, "read");
    sqlite3_close(*db);
    db = s;
  }
  // Immutable reads skip the write-ahead log: only right when it holds nothing
  // (a clean shutdown removes it; a failed open may leave it empty).
  struct stat wal;
  if (stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) return db.status();
  return OpenConnection(absl::StrCat("file:", path, "?immutable=1"),
                        SQLITE_OPEN_READONLY | SQLITE_OPEN_URI);
}

}  // namespace

struct JobStore::Writer {
  JobStore* store = nullptr;
  Op op;
  absl::Status status;
  bool done = false;
};

int64_t JobStore::SequenceOf(const std::string& job_id) {
  int64_t seq = 0;
  if (job_id.size() > 4 && job_id.compare(0, 4, "job-") == 0 &&
      absl::SimpleAtoi(job_id.substr(4), &seq) && seq > 0 && FormatJobId(seq) == job_id) {
    return seq;
  }
  return 0;  // only the id as tandemd writes it: not "job-+1", "job-1" or "job- 000001"
}

std::string JobStore::FormatJobId(int64_t sequence) {
  return absl::StrFormat("job-%06d", sequence);
}

absl::Status JobStore::OpenWritable(const std::string& path, Sync sync) {
  TANDEM_ASSIGN_OR_RETURN(write_db_, OpenConnection(path));
  sqlite3* db = write_db_;
  TANDEM_RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode=WAL"));
  // FULL: in WAL mode, every commit fsyncs the log before returning. NORMAL: the
  // log is written (so it survives the process) and fsynced at checkpoints.
  TANDEM_RETURN_IF_ERROR(
      Exec(db, sync == Sync::kFull ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"));
  TANDEM_RETURN_IF_ERROR(Exec(db, R"sql(
    CREATE TABLE IF NOT EXISTS jobs (
      seq INTEGER PRIMARY KEY,
      request_id TEXT UNIQUE,
      state INTEGER NOT NULL,
      priority INTEGER NOT NULL,
      create_us INTEGER NOT NULL,
      job BLOB NOT NULL);
    CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
    CREATE TABLE IF NOT EXISTS events (
      job_seq INTEGER NOT NULL,
      sequence INTEGER NOT NULL,
      event BLOB NOT NULL,
      PRIMARY KEY (job_seq, sequence)) WITHOUT ROWID;
    CREATE TABLE IF NOT EXISTS event_reservations (
      job_seq INTEGER PRIMARY KEY,
      through INTEGER NOT NULL);
  )sql"));
  {
    // Stores made before event retention lack the column that keeps state
    // changes from being pruned; their older rows count as other events.
    Statement has(db,
                  "SELECT COUNT(*) FROM pragma_table_info('events') WHERE name = 'state_change'");
    if (!has.ok() || has.Step() != SQLITE_ROW) return SqlError(db, "read the events schema");
    if (has.Int(0) == 0) {
      TANDEM_RETURN_IF_ERROR(
          Exec(db, "ALTER TABLE events ADD COLUMN state_change INTEGER NOT NULL DEFAULT 0"));
    }
  }
  {
    Statement s(db, "SELECT COALESCE(MAX(seq), 0) FROM jobs");
    if (!s.ok() || s.Step() != SQLITE_ROW) return SqlError(db, "read job count");
    const int64_t last = s.Int(0);
    absl::MutexLock lock(&write_mu_);
    // A last job number at the largest there is (only a damaged or forged
    // store has one) leaves none for new jobs (InsertJob refuses them); the
    // store's jobs stay readable and writable.
    next_sequence_ = last == std::numeric_limits<int64_t>::max() ? last : last + 1;
  }
  absl::MutexLock lock(&read_mu_);
  TANDEM_ASSIGN_OR_RETURN(read_db_, OpenConnection(path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path, Sync sync) {
  std::unique_ptr<JobStore> store(new JobStore());
  const absl::Status writable = store->OpenWritable(path, sync);
  if (writable.ok()) {
    store->reserve_path_ = path + ".reserve";
    store->RestoreReserve();
    return store;
  }
  // What was stored must stay readable even when nothing can be written (a
  // full disk, a read-only mount): the daemon then serves reads and refuses
  // writes with this reason.
  store.reset(new JobStore());
  absl::StatusOr<sqlite3*> read = OpenReadOnly(path);
  if (!read.ok()) {
    return absl::Status(
        writable.code(),
        absl::StrCat(writable.message(), "; reading it failed too: ", read.status().message()));
  }
  absl::MutexLock lock(&store->read_mu_);
  store->read_db_ = *read;
  store->read_only_ = absl::Status(
      writable.code(), absl::StrCat("the job store is read-only: ", writable.message()));
  return store;
}

JobStore::~JobStore() {
  sqlite3_close(write_db_);
  absl::MutexLock lock(&read_mu_);
  sqlite3_close(read_db_);
}

absl::Status JobStore::Write(Op op) {
  if (!read_only_.ok()) return read_only_;
  Writer w;
  w.store = this;
  w.op = std::move(op);
  absl::MutexLock lock(&write_mu_);
  writers_.push_back(&w);
  // Wait to be done by a leader, or to become the leader.
  write_mu_.Await(absl::Condition(
      +[](Writer* self) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return self->done || self->store->writers_.front() == self;
      },
      &w));
  if (w.done) return w.status;
  // Leader: commit everything queued so far in one transaction. Writers that
  // arrive meanwhile wait for the next round.
  std::vector<Writer*> batch(writers_.begin(), writers_.end());
  write_mu_.Unlock();
  // The ops from batch[first] on share the open transaction.
  size_t first = 0;
  absl::Status txn = Exec(write_db_, "BEGIN IMMEDIATE");
  for (size_t i = 0; txn.ok() && i < batch.size(); ++i) {
    Writer* each = batch[i];
    Exec(write_db_, "SAVEPOINT op").IgnoreError();
    each->status = each->op(write_db_);
    if (sqlite3_get_autocommit(write_db_) != 0) {
      // SQLite rolled the whole transaction back (an I/O error; a full disk
      // without a statement journal): the ops before this one in it are gone
      // too, whatever they returned. The rest go on in a new transaction.
      const absl::Status cause = each->status.ok()
                                     ? absl::InternalError("the transaction ended under an op")
                                     : each->status;
      for (size_t j = first; j < i; ++j) {
        // An op that failed on its own keeps its error.
        if (!batch[j]->status.ok()) continue;
        batch[j]->status = absl::Status(
            cause.code(), absl::StrCat("rolled back with a later write: ", cause.message()));
      }
      each->status = cause;
      first = i + 1;
      txn = Exec(write_db_, "BEGIN IMMEDIATE");
      continue;
    }
    Exec(write_db_, each->status.ok() ? "RELEASE op" : "ROLLBACK TO op; RELEASE op").IgnoreError();
  }
  if (txn.ok()) {
    txn = Exec(write_db_, "COMMIT");
    if (!txn.ok()) Exec(write_db_, "ROLLBACK").IgnoreError();
  }
  write_mu_.Lock();
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!txn.ok() && i >= first) batch[i]->status = txn;
    batch[i]->done = true;
    writers_.pop_front();
  }
  return w.status;
}

bool JobStore::has_reserve() const {
  absl::MutexLock lock(&reserve_mu_);
  return has_reserve_;
}

bool JobStore::RestoreReserve() {
  absl::MutexLock lock(&reserve_mu_);
  if (has_reserve_ || reserve_path_.empty()) return has_reserve_;
  struct stat st;
  if (stat(reserve_path_.c_str(), &st) == 0 && st.st_size >= kReserveBytes) {
    has_reserve_ = true;  // left by an earlier run
    return true;
  }
  // Only with room to spare: taking the last free bytes would itself fill the disk.
  struct statvfs fs;
  const std::string dir = reserve_path_.substr(0, reserve_path_.find_last_of('/') + 1);
  if (statvfs(dir.empty() ? "." : dir.c_str(), &fs) != 0) return false;
  if (static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize) < 4 * kReserveBytes) {
    return false;
  }
  const int fd = open(reserve_path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  // posix_fallocate takes the blocks now (a sparse file would free nothing).
  const bool allocated = posix_fallocate(fd, 0, kReserveBytes) == 0 && fsync(fd) == 0;
  close(fd);
  if (!allocated) {
    unlink(reserve_path_.c_str());
    return false;
  }
  has_reserve_ = true;
  return true;
}

bool JobStore::ReleaseReserve() {
  absl::MutexLock lock(&reserve_mu_);
  if (!has_reserve_) return false;
  has_reserve_ = false;
  if (unlink(reserve_path_.c_str()) != 0) return false;
  std::fprintf(stderr,
               "tandemd: the state directory's disk is full: released the job store's %lld MiB "
               "reserve to record a job's state; it is made again once space is freed\n",
               static_cast<long long>(kReserveBytes >> 20));
  return true;
}

absl::StatusOr<Job> JobStore::InsertJob(Job job, std::vector<JobEvent> events,
                                        uint64_t reserve_events_through) {
  {
    absl::MutexLock lock(&write_mu_);
    if (next_sequence_ == std::numeric_limits<int64_t>::max()) {
      return absl::ResourceExhaustedError("job store: no job number is left");
    }
    job.set_id(FormatJobId(next_sequence_++));
  }
  for (JobEvent& e : events) e.set_job_id(job.id());
  if (!events.empty()) job.set_last_event_sequence(events.back().sequence());
  TANDEM_RETURN_IF_ERROR(Write([&](sqlite3* db) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(WriteJobRow(db, job, /*insert=*/true));
    TANDEM_RETURN_IF_ERROR(InsertEvents(db, events));
    if (reserve_events_through == 0) return absl::OkStatus();
    return WriteReservation(db, SequenceOf(job.id()), reserve_events_through);
  }));
  return job;
}

absl::Status JobStore::UpdateJob(const Job& job, const std::vector<JobEvent>& events,
                                 Priority priority) {
  std::vector<JobEvent> owned = events;
  for (JobEvent& e : owned) e.set_job_id(job.id());
  const auto update = [&](sqlite3* db) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(WriteJobRow(db, job, /*insert=*/false));
    return InsertEvents(db, owned);
  };
  absl::Status s = Write(update);
  if (s.code() == absl::StatusCode::kResourceExhausted && priority == Priority::kMayUseReserve &&
      read_only_.ok() && ReleaseReserve()) {
    s = Write(update);
  }
  return s;
}

absl::Status JobStore::AppendEvents(const std::vector<JobEvent>& events, int64_t keep_per_job) {
  if (events.empty()) return absl::OkStatus();
  return Write([&](sqlite3* db) -> absl::Status {
    TANDEM_RETURN_IF_ERROR(InsertEvents(db, events));
    if (keep_per_job <= 0) return absl::OkStatus();
    // Every job in the batch keeps its state changes and its newest
    // `keep_per_job` events; the primary key makes this a range delete.
    std::set<int64_t> jobs;
    for (const JobEvent& e : events) jobs.insert(SequenceOf(e.job_id()));
    // By count, not by sequence arithmetic: numbers jump after a crash (the
    // event log's reservation), and the newest `keep_per_job` stay whatever
    // the gaps between them.
    Statement prune(db,
                    "DELETE FROM events WHERE job_seq = ?1 AND state_change = 0 AND sequence <= "
                    "(SELECT sequence FROM events WHERE job_seq = ?1 AND state_change = 0 "
                    "ORDER BY sequence DESC LIMIT 1 OFFSET ?2)");
    if (!prune.ok()) return SqlError(db, "prepare event pruning");
    for (int64_t job : jobs) {
      sqlite3_reset(prune.get());
      prune.Bind(1, job);
      prune.Bind(2, keep_per_job);
      if (prune.Step() != SQLITE_DONE) return SqlError(db, "prune events");
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<std::optional<Job>> JobStore::GetJob(const std::string& id) {
  const int64_t seq = SequenceOf(id);
  if (seq == 0) return std::optional<Job>();
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_, "SELECT job FROM jobs WHERE seq = ?");
  if (!s.ok()) return SqlError(read_db_, "prepare get");
  s.Bind(1, seq);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return std::optional<Job>();
  if (rc != SQLITE_ROW) return SqlError(read_db_, "get job");
  Job job;
  if (!job.ParseFromString(s.Blob(0))) {
    ReportDamage(id);
    return absl::DataLossError(
        absl::StrCat("job store: the record of ", id, " is damaged and cannot be read"));
  }
  return std::optional<Job>(std::move(job));
}

absl::StatusOr<std::optional<Job>> JobStore::FindByRequestId(const std::string& request_id) {
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_, "SELECT job FROM jobs WHERE request_id = ?");
  if (!s.ok()) return SqlError(read_db_, "prepare find");
  s.Bind(1, request_id);
  const int rc = s.Step();
  if (rc == SQLITE_DONE) return std::optional<Job>();
  if (rc != SQLITE_ROW) return SqlError(read_db_, "find job");
  Job job;
  if (!job.ParseFromString(s.Blob(0))) {
    return absl::DataLossError(absl::StrCat("job store: the record of the job with request_id '",
                                            request_id, "' is damaged and cannot be read"));
  }
  return std::optional<Job>(std::move(job));
}

absl::StatusOr<JobPage> JobStore::ListJobs(const JobFilter& filter) {
  std::string where = "1";
  if (!filter.states.empty()) {
    std::vector<std::string> states;
    for (auto s : filter.states) states.push_back(absl::StrCat(static_cast<int>(s)));
    absl::StrAppend(&where, " AND state IN (", absl::StrJoin(states, ","), ")");
  }
  absl::MutexLock lock(&read_mu_);
  JobPage page;
  // Labels are matched after decoding, so the total honours them too.
  Statement s(
      read_db_,
      absl::StrCat("SELECT seq, job, state FROM jobs WHERE ", where, " ORDER BY seq DESC").c_str());
  if (!s.ok()) return SqlError(read_db_, "prepare list");
  bool more = false;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    const int64_t seq = s.Int(0);
    Job job;
    const std::string blob = s.Blob(1);
    if (!job.ParseFromString(blob)) {
      job = DamagedJob(seq, s.Int(2), blob.size());
      ReportDamage(job.id());
    }
    bool match = true;
    for (const auto& [k, v] : filter.labels) {
      auto it = job.spec().labels().find(k);
      if (it == job.spec().labels().end() || it->second != v) match = false;
    }
    if (!match) continue;
    ++page.total;
    if (filter.before_sequence > 0 && seq >= filter.before_sequence) continue;
    if (static_cast<int>(page.jobs.size()) < filter.limit) {
      page.jobs.push_back(std::move(job));
      page.next_before = seq;
    } else {
      more = true;
    }
  }
  if (rc != SQLITE_DONE) return SqlError(read_db_, "list jobs");
  if (!more) page.next_before = 0;
  return page;
}

absl::StatusOr<std::vector<Job>> JobStore::LoadUnfinished() {
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_, "SELECT seq, job FROM jobs WHERE state IN (?, ?) ORDER BY seq ASC");
  if (!s.ok()) return SqlError(read_db_, "prepare unfinished");
  s.Bind(1, static_cast<int64_t>(tandem::v1::JOB_STATE_QUEUED));
  s.Bind(2, static_cast<int64_t>(tandem::v1::JOB_STATE_RUNNING));
  std::vector<Job> jobs;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    Job job;
    if (job.ParseFromString(s.Blob(1))) {
      jobs.push_back(std::move(job));
    } else {
      ReportDamage(FormatJobId(s.Int(0)));
    }
  }
  if (rc != SQLITE_DONE) return SqlError(read_db_, "load unfinished");
  return jobs;
}

absl::StatusOr<std::vector<JobEvent>> JobStore::ReadEvents(const std::string& job_id, uint64_t from,
                                                           int max) {
  absl::MutexLock lock(&read_mu_);
  Statement s(
      read_db_,
      "SELECT event FROM events WHERE job_seq = ? AND sequence >= ? ORDER BY sequence LIMIT ?");
  if (!s.ok()) return SqlError(read_db_, "prepare events");
  s.Bind(1, SequenceOf(job_id));
  s.Bind(2, static_cast<int64_t>(from));
  s.Bind(3, static_cast<int64_t>(max));
  std::vector<JobEvent> events;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW) {
    JobEvent e;
    if (e.ParseFromString(s.Blob(0))) events.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return SqlError(read_db_, "read events");
  return events;
}

absl::StatusOr<std::map<tandem::v1::JobState, int64_t>> JobStore::CountByState() {
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (!s.ok()) return SqlError(read_db_, "prepare count");
  std::map<tandem::v1::JobState, int64_t> counts;
  int rc;
  while ((rc = s.Step()) == SQLITE_ROW)
    counts[static_cast<tandem::v1::JobState>(s.Int(0))] = s.Int(1);
  if (rc != SQLITE_DONE) return SqlError(read_db_, "count jobs");
  return counts;
}

absl::StatusOr<uint64_t> JobStore::LastEventSequence(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_, "SELECT COALESCE(MAX(sequence), 0) FROM events WHERE job_seq = ?");
  if (!s.ok()) return SqlError(read_db_, "prepare last event");
  s.Bind(1, SequenceOf(job_id));
  if (s.Step() != SQLITE_ROW) return SqlError(read_db_, "last event");
  return static_cast<uint64_t>(s.Int(0));
}

absl::Status JobStore::ReserveEventSequences(const std::string& job_id, uint64_t through) {
  return Write([&](sqlite3* db) { return WriteReservation(db, SequenceOf(job_id), through); });
}

absl::Status JobStore::ReleaseEventSequences(const std::string& job_id) {
  return Write([&](sqlite3* db) -> absl::Status {
    Statement s(db, "DELETE FROM event_reservations WHERE job_seq = ?");
    if (!s.ok()) return SqlError(db, "prepare event release");
    s.Bind(1, SequenceOf(job_id));
    if (s.Step() != SQLITE_DONE) return SqlError(db, "release event sequences");
    return absl::OkStatus();
  });
}

absl::StatusOr<uint64_t> JobStore::ReservedEventSequence(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Statement s(read_db_,
              "SELECT COALESCE(MAX(through), 0) FROM event_reservations WHERE job_seq = ?");
  if (!s.ok() && absl::StrContains(sqlite3_errmsg(read_db_), "no such table")) {
    return uint64_t{0};  // a store written before reservations, opened read-only
  }
  if (!s.ok()) return SqlError(read_db_, "prepare event reservation read");
  s.Bind(1, SequenceOf(job_id));
  if (s.Step() != SQLITE_ROW) return SqlError(read_db_, "read event reservation");
  return static_cast<uint64_t>(s.Int(0));
}

void JobStore::ReportDamage(const std::string& id) {
  absl::MutexLock lock(&damage_mu_);
  if (!damaged_.insert(id).second) return;
  std::fprintf(stderr,
               "tandemd: job store: the record of %s is damaged (it does not decode); it is listed "
               "with what remains and cannot be resumed\n",
               id.c_str());
}

}  // namespace tandem::server
