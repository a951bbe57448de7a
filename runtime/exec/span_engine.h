// Runs a growing graph of spans (a layer's forward on the compute stream, a
// gradient copy on the D2H engine, a CPU update...) on one worker thread per
// resource, with the issue rule of the schedule (schedule/schedule.h):
// a span is issued to its resource the moment its last dependency completes
// (or, for a start-dependency, starts), and each resource runs its issued
// spans one at a time in issue order (FIFO). Compute streams get program order
// by depending on their previous span.
//
// Spans may be added while others run (the next iteration's forward while the
// previous iteration's CPU updates still go on). The first span that fails
// stops the graph: later spans are marked done without running and the error
// is reported by status(). Every span's start and end are recorded for the
// measured timeline. Thread-safe.
#ifndef TANDEM_RUNTIME_EXEC_SPAN_ENGINE_H_
#define TANDEM_RUNTIME_EXEC_SPAN_ENGINE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "tandem/v1/plan.pb.h"

namespace tandem {

using SpanId = int64_t;

struct SpanInfo {
  tandem::v1::TimelineResource resource = tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  tandem::v1::TimelinePhase phase = tandem::v1::TIMELINE_PHASE_UNSPECIFIED;
  int layer = -1;
  int micro_batch = 0;
  int64_t bytes = 0;
  // Which training iteration the span belongs to (for the timeline).
  int64_t iteration = 0;
  // The schedule operation it runs (schedule/schedule.h), -1 if none.
  int op = -1;
};

struct SpanRecord {
  SpanInfo info;
  // Wall-clock seconds (clock.h WallSeconds).
  double start = 0, end = 0;
  // How long the span's resource sat idle before it (since its previous span,
  // or since the engine started), waiting for this span's last dependency to
  // complete, and the resource that wait traces back to. A copy that itself
  // sat waiting passes its own cause on, so the accelerator waiting for
  // weights that waited for a host update has waited on HOST_UPDATE; a copy
  // that was only queued behind other copies is itself the cause.
  // UNSPECIFIED (and no wait) when the span did not wait.
  double wait_seconds = 0;
  tandem::v1::TimelineResource waited_on = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
};

class SpanEngine {
 public:
  // One worker per resource in `resources`; `setup(resource)` runs first on each
  // worker thread (e.g. to set its OpenMP thread count).
  // `jitter_seconds` > 0 (tests only) delays every span's start by a random
  // time up to that, so that a missing dependency shows up as a wrong result
  // whatever the machine's speed: the engine's own lock orders every span for
  // ThreadSanitizer, so only a different interleaving exposes a logical race.
  // `recorder`, when set, is called on the span's worker thread with every
  // span's record as it completes (so it must be thread-safe).
  SpanEngine(const std::vector<tandem::v1::TimelineResource>& resources,
             std::function<void(tandem::v1::TimelineResource)> setup = nullptr,
             double jitter_seconds = 0, std::function<void(const SpanRecord&)> recorder = nullptr);
  // Waits for every span, then stops the workers.
  ~SpanEngine();

  // Adds a span that runs `work` on its resource after all `deps` completed.
  // Dependencies that already completed (or were collected) count as met.
  SpanId Add(const SpanInfo& info, std::vector<SpanId> deps, std::function<absl::Status()> work);
  // The same, and also after every span in `start_deps` has started (a
  // prefetch issued when the compute stream starts the span before the one it
  // feeds). A start-dependency that already started counts as met.
  SpanId Add(const SpanInfo& info, std::vector<SpanId> deps, std::vector<SpanId> start_deps,
             std::function<absl::Status()> work);

  // Blocks until `id` (or everything) is done. Returns the graph's status.
  absl::Status Wait(SpanId id);
  absl::Status WaitAll();
  absl::Status status() const;

  // Records of spans finished since the last call, and drops them.
  std::vector<SpanRecord> TakeRecords();

  // Spans issued to a worker (queued or running) and not yet complete: the
  // work that can still make progress without anything new being added.
  int64_t active() const;
  // Whether the calling thread is one of this process's span workers.
  static bool OnWorkerThread();

 private:
  struct Span {
    SpanInfo info;
    std::function<absl::Status()> work;
    int pending = 0;
    bool started = false, done = false;
    std::vector<SpanId> dependents, start_dependents;
    // When it was added and when its last dependency completed (WallSeconds),
    // and the root cause of that dependency (SpanRecord::waited_on).
    double added = 0, ready = 0;
    tandem::v1::TimelineResource waited_on = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
    // Whether its resource sat idle waiting for it (set when it starts).
    bool waited = false;
  };
  struct Queue {
    std::deque<SpanId> ready;
    std::condition_variable cv;
  };

  void Issue(SpanId id);  // mu_ held
  void Complete(SpanId id, const SpanRecord& record);
  // One of `id`'s dependencies is met at `ready`, traced back to `cause`.
  void Release(SpanId id, double ready, tandem::v1::TimelineResource from,
               tandem::v1::TimelineResource cause);  // mu_ held
  void WorkerLoop(tandem::v1::TimelineResource resource);
  void Collect();  // mu_ held

  mutable std::mutex mu_;
  std::condition_variable done_cv_;
  std::map<SpanId, Span> spans_;
  SpanId next_id_ = 1;
  // Spans below this id are all done and collected.
  SpanId collected_below_ = 1;
  std::map<tandem::v1::TimelineResource, Queue> queues_;
  std::vector<SpanRecord> records_;
  absl::Status status_;
  int64_t active_ = 0;
  const double jitter_seconds_;
  const std::function<void(const SpanRecord&)> recorder_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_SPAN_ENGINE_H_
