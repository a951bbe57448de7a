#include "runtime/exec/span_engine.h"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/core/clock.h"

namespace tandem {
namespace {
thread_local bool on_worker_thread = false;
}  // namespace

bool SpanEngine::OnWorkerThread() { return on_worker_thread; }

int64_t SpanEngine::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_;
}

SpanEngine::SpanEngine(const std::vector<tandem::v1::TimelineResource>& resources,
                       std::function<void(tandem::v1::TimelineResource)> setup,
                       double jitter_seconds, std::function<void(const SpanRecord&)> recorder)
    : jitter_seconds_(jitter_seconds), recorder_(std::move(recorder)) {
  for (auto r : resources) queues_[r];
  for (auto r : resources) {
    workers_.emplace_back([this, r, setup] {
      const std::string name = tandem::v1::TimelineResource_Name(r).substr(18, 15);
      pthread_setname_np(pthread_self(), name.c_str());
      on_worker_thread = true;
      if (setup) setup(r);
      WorkerLoop(r);
    });
  }
}

SpanEngine::~SpanEngine() {
  WaitAll().IgnoreError();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [r, q] : queues_) q.cv.notify_all();
  }
  for (std::thread& t : workers_) t.join();
}

SpanId SpanEngine::Add(const SpanInfo& info, std::vector<SpanId> deps,
                       std::function<absl::Status()> work) {
  return Add(info, std::move(deps), {}, std::move(work));
}

SpanId SpanEngine::Add(const SpanInfo& info, std::vector<SpanId> deps,
                       std::vector<SpanId> start_deps, std::function<absl::Status()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  const SpanId id = next_id_++;
  Span& span = spans_[id];
  span.info = info;
  span.work = std::move(work);
  span.added = span.ready = WallSeconds();
  for (SpanId d : deps) {
    if (d <= 0 || d < collected_below_) continue;
    auto it = spans_.find(d);
    if (it == spans_.end() || it->second.done) continue;
    it->second.dependents.push_back(id);
    ++span.pending;
  }
  for (SpanId d : start_deps) {
    if (d <= 0 || d < collected_below_) continue;
    auto it = spans_.find(d);
    if (it == spans_.end() || it->second.started) continue;
    it->second.start_dependents.push_back(id);
    ++span.pending;
  }
  if (span.pending == 0) {
    Issue(id);
    Collect();  // a span on a resource this engine does not run ends at once
  }
  return id;
}

void SpanEngine::Issue(SpanId id) {
  Span& span = spans_[id];
  auto q = queues_.find(span.info.resource);
  if (q == queues_.end()) {
    // A resource this engine does not run: a programming error, reported as such.
    if (status_.ok()) {
      status_ = absl::InternalError(
          absl::StrCat("span for resource ", tandem::v1::TimelineResource_Name(span.info.resource),
                       " which this executor does not run"));
    }
    // Done without running: what waits for it is released (its workers skip
    // their work on the failed graph), so every wait ends with the error.
    span.done = true;
    span.work = nullptr;
    std::vector<SpanId> waiting = std::move(span.dependents);
    waiting.insert(waiting.end(), span.start_dependents.begin(), span.start_dependents.end());
    span.dependents.clear();
    span.start_dependents.clear();
    const tandem::v1::TimelineResource from = span.info.resource;
    const double now = WallSeconds();
    // Not collected here: a caller (Complete) may be iterating a span that
    // Collect would erase; Add and Complete collect once they are done.
    for (SpanId d : waiting) Release(d, now, from, from);
    done_cv_.notify_all();
    return;
  }
  ++active_;
  q->second.ready.push_back(id);
  q->second.cv.notify_one();
}

void SpanEngine::WorkerLoop(tandem::v1::TimelineResource resource) {
  Queue& q = queues_[resource];
  std::mt19937_64 jitter(static_cast<uint64_t>(resource) * 0x9E3779B97F4A7C15ull + 1);
  // The end of this resource's previous span; before the first, the worker's
  // start (an idle copy engine waiting for the first update has waited).
  double last_end = WallSeconds();
  while (true) {
    SpanId id;
    std::function<absl::Status()> work;
    bool skip;
    {
      std::unique_lock<std::mutex> lock(mu_);
      q.cv.wait(lock, [&] { return stopping_ || !q.ready.empty(); });
      if (q.ready.empty()) return;
      id = q.ready.front();
      q.ready.pop_front();
      work = std::move(spans_[id].work);
      skip = !status_.ok();
    }
    SpanRecord record;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Span& span = spans_[id];
      record.info = span.info;
      // Idle since the previous span (or since this one was added, whichever
      // is later) until its last dependency completed.
      if (span.waited_on != tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED) {
        record.wait_seconds = std::max(0.0, span.ready - std::max(last_end, span.added));
        if (record.wait_seconds > 0) record.waited_on = span.waited_on;
      }
      span.waited = record.wait_seconds > 0;
    }
    if (jitter_seconds_ > 0 && !skip) {
      std::this_thread::sleep_for(std::chrono::duration<double>(
          std::uniform_real_distribution<double>(0, jitter_seconds_)(jitter)));
    }
    record.start = WallSeconds();
    {
      // Spans issued when this one starts (prefetches) are ready now.
      std::lock_guard<std::mutex> lock(mu_);
      Span& span = spans_[id];
      span.started = true;
      for (SpanId d : span.start_dependents) Release(d, record.start, resource, resource);
      span.start_dependents.clear();
    }
    absl::Status s = skip ? absl::OkStatus() : work();
    record.end = WallSeconds();
    if (!s.ok()) {
      // Say which span failed: "layer 3 backward (micro-batch 2): ...".
      std::string phase = tandem::v1::TimelinePhase_Name(record.info.phase).substr(15);
      for (char& c : phase) c = c == '_' ? ' ' : static_cast<char>(std::tolower(c));
      std::string where =
          record.info.layer >= 0 ? absl::StrCat("layer ", record.info.layer, " ", phase) : phase;
      if (record.info.micro_batch >= 0)
        absl::StrAppend(&where, " (micro-batch ", record.info.micro_batch, ")");
      s = absl::Status(s.code(), absl::StrCat(where, ": ", s.message()));
      std::lock_guard<std::mutex> lock(mu_);
      if (status_.ok()) status_ = s;
    }
    last_end = record.end;
    // Before Complete: whoever waits for the span sees it recorded.
    if (recorder_ && !skip) recorder_(record);
    Complete(id, skip ? SpanRecord{} : record);
  }
}

void SpanEngine::Complete(SpanId id, const SpanRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  Span& span = spans_[id];
  span.done = true;
  span.work = nullptr;
  --active_;
  if (record.end > 0) records_.push_back(record);
  // A copy that itself sat waiting passes on what it waited for; a copy that
  // was only queued behind other copies, and any other resource, is the cause.
  const bool copy = span.info.resource == tandem::v1::TIMELINE_RESOURCE_COPY_H2D ||
                    span.info.resource == tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
  const tandem::v1::TimelineResource cause =
      copy && span.waited ? span.waited_on : span.info.resource;
  const double ready = record.end > 0 ? record.end : WallSeconds();
  for (SpanId d : span.dependents) Release(d, ready, span.info.resource, cause);
  // A span that never ran (the graph failed) releases what waits for its start.
  for (SpanId d : span.start_dependents) Release(d, ready, span.info.resource, cause);
  span.dependents.clear();
  span.start_dependents.clear();
  Collect();
  done_cv_.notify_all();
}

void SpanEngine::Release(SpanId id, double ready, tandem::v1::TimelineResource from,
                         tandem::v1::TimelineResource cause) {
  auto it = spans_.find(id);
  if (it == spans_.end() || --it->second.pending != 0) return;
  it->second.ready = ready;
  // Program order on one resource is no wait: it was busy with the span before.
  if (it->second.info.resource != from) it->second.waited_on = cause;
  Issue(id);
}

void SpanEngine::Collect() {
  while (!spans_.empty() && spans_.begin()->second.done) {
    collected_below_ = spans_.begin()->first + 1;
    spans_.erase(spans_.begin());
  }
}

absl::Status SpanEngine::Wait(SpanId id) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] {
    if (id < collected_below_) return true;
    auto it = spans_.find(id);
    return it == spans_.end() || it->second.done;
  });
  return status_;
}

absl::Status SpanEngine::WaitAll() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return spans_.empty(); });
  return status_;
}

absl::Status SpanEngine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

std::vector<SpanRecord> SpanEngine::TakeRecords() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<SpanRecord> out;
  out.swap(records_);
  return out;
}

}  // namespace tandem
