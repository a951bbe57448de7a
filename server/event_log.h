// One job's event stream: the job's runner appends, any number of watchers read
// from any sequence number and wait for more. Appending never waits for
// watchers: a slow or vanished watcher only holds its own cursor. The newest
// events (at most `max_in_memory`) live in memory while the job is live in this
// process; a reader of older ones (dropped from memory, or from before a
// restart) is told where memory starts and fetches the rest from the store.
// Events reach watchers before the store has them; so that a restart after a
// crash never numbers a new event as one a watcher already saw (and skip it
// when the watcher resumes from its next sequence), a live job's log reserves
// sequence numbers in blocks of kReserveBlock, durably, before handing them
// out, and the log of a recovered job starts past its reservation.
// Thread-safe.
#ifndef TANDEM_SERVER_EVENT_LOG_H_
#define TANDEM_SERVER_EVENT_LOG_H_

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

class EventLog {
 public:
  // A log whose next event gets `last_sequence` + 1; events up to last_sequence
  // are on disk only.
  // `reserve(through)`, when set, makes sequence numbers up to `through`
  // durable before any is handed out (called on the appending thread, under
  // the log's lock); `reserved_through` are durable already (0: none past
  // last_sequence).
  using Reserve = std::function<void(uint64_t through)>;
  EventLog(std::string job_id, uint64_t last_sequence, size_t max_in_memory = kMaxInMemory,
           Reserve reserve = nullptr, uint64_t reserved_through = 0);
  static constexpr size_t kMaxInMemory = 4096;
  static constexpr uint64_t kReserveBlock = 1024;

  // Numbers, timestamps and stores `event`; wakes waiters. Returns the stored event.
  tandem::v1::JobEvent Append(tandem::v1::JobEvent event);
  // Events with sequence >= from, at most `max`, from memory. `*first_in_memory`
  // is the smallest sequence held in memory (events below it are on disk).
  std::vector<tandem::v1::JobEvent> Read(uint64_t from, int max, uint64_t* first_in_memory) const;
  uint64_t last_sequence() const;

  // No more events will come (the job ended, or the daemon is stopping with
  // `shutting_down`). Wakes every waiter.
  void Close(bool shutting_down = false);
  bool closed() const;
  bool shutting_down() const;

  // Registers `wake` to run once, on the appending (or closing) thread, when an
  // event with sequence >= from exists or the log closes, and returns a handle
  // for CancelWait. If that is already so, registers nothing and returns 0: the
  // caller reads again (wake is never called from inside WaitFor).
  int64_t WaitFor(uint64_t from, std::function<void()> wake);
  void CancelWait(int64_t handle);

 private:
  const std::string job_id_;
  mutable absl::Mutex mu_;
  uint64_t first_sequence_ ABSL_GUARDED_BY(mu_);
  const size_t max_in_memory_;
  const Reserve reserve_;
  uint64_t reserved_through_ ABSL_GUARDED_BY(mu_);
  std::deque<tandem::v1::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, std::pair<uint64_t, std::function<void()>>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_EVENT_LOG_H_
