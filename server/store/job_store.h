// The daemon's durable state: jobs and their events in SQLite (WAL mode), under
// --state_dir. With Sync::kFull (the default) a write returns only after its
// transaction is fsynced, so an acknowledged job survives kill -9 and power
// loss; with Sync::kNormal it survives kill -9.
//
// Writes are group-committed as LevelDB does: concurrent writers queue, the
// writer at the front commits everyone's operations in one transaction (each in
// its own savepoint, so one failure does not undo the others), and wakes them.
// Many concurrent submits therefore share one fsync. Reads use a second
// connection and never wait for writers (WAL). Thread-safe.
#ifndef TANDEM_SERVER_STORE_JOB_STORE_H_
#define TANDEM_SERVER_STORE_JOB_STORE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/job.pb.h"

struct sqlite3;

namespace tandem::server {

struct JobFilter {
  // Empty = all states.
  std::vector<tandem::v1::JobState> states;
  // Jobs whose labels include all of these.
  std::map<std::string, std::string> labels;
  // Jobs created before this job sequence number (paging); 0 = no bound.
  int64_t before_sequence = 0;
  int limit = 100;
};

struct JobPage {
  std::vector<tandem::v1::Job> jobs;
  // Sequence number of the last job returned, for the next page; 0 when done.
  int64_t next_before = 0;
  int64_t total = 0;
};

class JobStore {
 public:
  // How a commit reaches the disk. kFull fsyncs every commit (durable across power
  // loss); kNormal leaves the WAL to the OS until a checkpoint (durable across a
  // crash or kill -9 of tandemd, not a power loss), for disks whose fsync is slow.
  enum class Sync { kFull, kNormal };

  // Opens or creates `path` (its directory must exist). When it cannot be
  // opened for writing (a full disk, a read-only mount, an unwritable file) but
  // can still be read, the store opens read-only: reads work and every write
  // returns read_only() (whose code is the cause's: RESOURCE_EXHAUSTED for a
  // full disk).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path,
                                                        Sync sync = Sync::kFull);
  // OK when writable; otherwise why not.
  const absl::Status& read_only() const { return read_only_; }
  ~JobStore();

  // Assigns the job an id ("job-000042") and stores it with `events` (their
  // job_id is filled in) and, in the same write, its event numbers reserved
  // through `reserve_events_through` (0: none; ReserveEventSequences).
  // ALREADY_EXISTS when job.request_id is taken.
  absl::StatusOr<tandem::v1::Job> InsertJob(tandem::v1::Job job,
                                            std::vector<tandem::v1::JobEvent> events,
                                            uint64_t reserve_events_through = 0);
  // Replaces a job's record and appends events, in one transaction. With
  // kMayUseReserve, a write the full disk refuses releases the reserve (below)
  // and is tried once more: for state changes, above all a job's end, which
  // would otherwise be lost if the daemon stopped before space was freed.
  enum class Priority { kNormal, kMayUseReserve };
  absl::Status UpdateJob(const tandem::v1::Job& job,
                         const std::vector<tandem::v1::JobEvent>& events = {},
                         Priority priority = Priority::kNormal);

  // The reserve: a file of kReserveBytes beside the database (`path`.reserve),
  // allocated while the disk has room, deleted to make room for a
  // kMayUseReserve write when the disk is full. Open makes it; RestoreReserve
  // makes it again once the file system has kReserveBytes x 4 free, and
  // returns whether it is there. Not for read-only stores.
  static constexpr int64_t kReserveBytes = int64_t{4} << 20;
  bool RestoreReserve();
  bool has_reserve() const;
  // Appends events; with `keep_per_job` > 0, each job they belong to then keeps
  // only its state changes and its newest `keep_per_job` events (a chatty job's
  // log is bounded on disk; readers see the gap as a jump in sequence numbers).
  absl::Status AppendEvents(const std::vector<tandem::v1::JobEvent>& events,
                            int64_t keep_per_job = 0);

  absl::StatusOr<std::optional<tandem::v1::Job>> GetJob(const std::string& id);
  absl::StatusOr<std::optional<tandem::v1::Job>> FindByRequestId(const std::string& request_id);
  // A record that does not decode is listed, not dropped: its id, the state its
  // row holds and a reason saying it is damaged; the first time, a line on
  // stderr says so. GetJob of it is DATA_LOSS.
  absl::StatusOr<JobPage> ListJobs(const JobFilter& filter);
  // Jobs in QUEUED or RUNNING, oldest first. A damaged record is reported (see
  // ListJobs) and left out: nothing of it can be resumed.
  absl::StatusOr<std::vector<tandem::v1::Job>> LoadUnfinished();
  // Events of a job with sequence >= from, in order, at most `max`.
  absl::StatusOr<std::vector<tandem::v1::JobEvent>> ReadEvents(const std::string& job_id,
                                                               uint64_t from, int max);
  // Jobs per state, over all jobs.
  absl::StatusOr<std::map<tandem::v1::JobState, int64_t>> CountByState();
  // The highest event sequence stored for a job (0 when none).
  absl::StatusOr<uint64_t> LastEventSequence(const std::string& job_id);
  // Event sequence numbers of a job handed out up to `through` (EventLog's
  // reservation: a recovered job's events are numbered past it), and the
  // highest reserved (0 when none).
  absl::Status ReserveEventSequences(const std::string& job_id, uint64_t through);
  // Forgets the reservation: every event handed out is stored (a clean stop),
  // so a restart numbers on from the last one.
  absl::Status ReleaseEventSequences(const std::string& job_id);
  absl::StatusOr<uint64_t> ReservedEventSequence(const std::string& job_id);
  // Sequence number behind a job id ("job-000042" -> 42), or 0 for anything
  // but an id exactly as FormatJobId writes it.
  static int64_t SequenceOf(const std::string& job_id);
  // "job-000042"; more digits past 999999.
  static std::string FormatJobId(int64_t sequence);

 private:
  using Op = std::function<absl::Status(sqlite3*)>;
  struct Writer;
  JobStore() = default;
  absl::Status OpenWritable(const std::string& path, Sync sync);
  absl::Status Write(Op op);
  // Deletes the reserve; false when there was none.
  bool ReleaseReserve();
  void ReportDamage(const std::string& id);

  absl::Status read_only_;
  std::string reserve_path_;
  mutable absl::Mutex reserve_mu_;
  bool has_reserve_ ABSL_GUARDED_BY(reserve_mu_) = false;
  absl::Mutex damage_mu_;
  std::set<std::string> damaged_ ABSL_GUARDED_BY(damage_mu_);

  sqlite3* write_db_ = nullptr;
  absl::Mutex write_mu_;
  std::deque<Writer*> writers_ ABSL_GUARDED_BY(write_mu_);
  int64_t next_sequence_ ABSL_GUARDED_BY(write_mu_) = 1;

  absl::Mutex read_mu_;
  sqlite3* read_db_ ABSL_GUARDED_BY(read_mu_) = nullptr;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_STORE_JOB_STORE_H_
