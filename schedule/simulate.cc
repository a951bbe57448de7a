#include "schedule/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::schedule {
namespace {

// A dependent of an operation, within one iteration's template: operation
// `op` of the iteration `lag` later waits on its start or its end.
struct Dependent {
  int op;
  int lag;
  bool on_start;
};

// Every operation's dependents over one iteration: the dependencies of the
// schedule, and each in-order resource's order as a dependency of each
// operation on the one before it in line (the last of an iteration before
// the first of the next). Unrolled over the iterations on the fly, so one
// table serves them all. Event e = op * 2 + (1 at its end, 0 at its start)
// releases dependents[offsets[e] .. offsets[e + 1]).
struct Template {
  std::vector<int> offsets;
  std::vector<Dependent> dependents;
  // Whether operation o's start releases anything (only those starts are
  // events: one that releases nothing changes nothing).
  bool ReleasesOnStart(int o) const { return offsets[2 * o + 1] > offsets[2 * o]; }
  // Per operation: all its prerequisites, and the lags of those in earlier
  // iterations (`lag_offsets` into `lags`): in iteration i those with a lag
  // above i are met before the run (a lag reaching before the first
  // iteration is met).
  std::vector<int> prerequisites;
  std::vector<int> lag_offsets;
  std::vector<int> lags;
};

// Calls `edge(prerequisite, dependent)` for every edge of one iteration.
template <typename Edge>
void ForEachEdge(const Schedule& s, Edge edge) {
  for (int o = 0; o < s.num_ops(); ++o) {
    for (const Dep& d : s.ops[o].deps) edge(d.op, Dependent{o, d.lag, d.on_start});
  }
  for (size_t r = 0; r < s.order.size(); ++r) {
    if (!s.resources[r].in_order) continue;
    const std::vector<int>& order = s.order[r];
    for (size_t k = 0; k < order.size(); ++k) {
      // The first of an iteration waits on the previous iteration's last.
      const bool first = k == 0;
      edge(first ? order.back() : order[k - 1], Dependent{order[k], first ? 1 : 0, false});
    }
  }
}

Template Build(const Schedule& s) {
  const int n = s.num_ops();
  Template t;
  auto event = [](int from, const Dependent& to) { return 2 * from + (to.on_start ? 0 : 1); };
  t.offsets.assign(2 * n + 1, 0);
  t.prerequisites.assign(n, 0);
  t.lag_offsets.assign(n + 1, 0);
  ForEachEdge(s, [&](int from, const Dependent& to) {
    ++t.offsets[event(from, to) + 1];
    ++t.prerequisites[to.op];
    if (to.lag > 0) ++t.lag_offsets[to.op + 1];
  });
  for (int e = 0; e < 2 * n; ++e) t.offsets[e + 1] += t.offsets[e];
  for (int o = 0; o < n; ++o) t.lag_offsets[o + 1] += t.lag_offsets[o];
  t.dependents.resize(t.offsets[2 * n]);
  t.lags.resize(t.lag_offsets[n]);
  std::vector<int> fill(t.offsets.begin(), t.offsets.end() - 1);
  std::vector<int> lag_fill(t.lag_offsets.begin(), t.lag_offsets.end() - 1);
  ForEachEdge(s, [&](int from, const Dependent& to) {
    t.dependents[fill[event(from, to)]++] = to;
    if (to.lag > 0) t.lags[lag_fill[to.op]++] = to.lag;
  });
  return t;
}

// The discrete-event run of `iterations` copies of a schedule: each
// operation starts once its prerequisites are met and its resource is free
// (the earliest ready first), then releases its dependents on start or end.
class EventLoop {
 public:
  EventLoop(const Schedule& s, const std::vector<double>& seconds, int iterations)
      : seconds_(seconds),
        iterations_(iterations),
        per_(s.num_ops()),
        n_(per_ * iterations),
        tpl_(Build(s)),
        queues_(s.resources.size()),
        running_(s.resources.size(), -1) {
    resource_.reserve(per_);
    for (const Op& op : s.ops) resource_.push_back(op.resource);
  }

  absl::StatusOr<Timing> Run() {
    Start();
    Dispatch();
    while (NextInstant()) {
      for (const int64_t code : TakeInstant()) Release(code);
      Dispatch();
    }
    if (finished_ != n_) {
      return absl::InternalError(absl::StrCat("schedule deadlocked: ", n_ - finished_, " of ", n_,
                                              " operations never ran"));
    }
    return std::move(run_);
  }

 private:
  int Resource(int x) const { return resource_[op_[x]]; }

  // Every unrolled operation's unmet prerequisites (those with a lag
  // reaching before the first iteration are met); those with none are ready.
  void Start() {
    run_.iterations = iterations_;
    run_.ops_per_iteration = per_;
    run_.start.assign(n_, -1.0);
    run_.end.assign(n_, -1.0);
    run_.binding.assign(n_, -1);
    run_.started.reserve(n_);
    run_.ended.reserve(n_);
    ready_.assign(n_, 0.0);
    remaining_.resize(n_);
    op_.resize(n_);
    iteration_.resize(n_);
    for (int i = 0, x = 0; i < iterations_; ++i) {
      for (int o = 0; o < per_; ++o, ++x) {
        int count = tpl_.prerequisites[o];
        for (int k = tpl_.lag_offsets[o]; k < tpl_.lag_offsets[o + 1]; ++k) {
          count -= tpl_.lags[k] > i;
        }
        remaining_[x] = count;
        op_[x] = o;
        iteration_[x] = i;
      }
    }
    for (int x = 0; x < n_; ++x) {
      if (remaining_[x] == 0) queues_[Resource(x)].Push(0.0, x);
    }
  }

  // Each idle resource starts its earliest ready operation now. Only a
  // resource freed or given a ready operation since the last dispatch can
  // start one (`touched_`, in resource order); past 64 resources, all.
  void Dispatch() {
    const size_t resources = queues_.size();
    for (size_t r = 0; r < resources; ++r) {
      if (resources <= 64 && (touched_ >> r & 1) == 0) continue;
      if (running_[r] >= 0 || queues_[r].empty()) continue;
      const int x = queues_[r].Pop();
      running_[r] = x;
      run_.start[x] = now_;
      run_.end[x] = now_ + seconds_[op_[x]];
      run_.started.push_back(x);
      if (tpl_.ReleasesOnStart(op_[x])) starts_.push_back(int64_t{x} * 2);
    }
    touched_ = 0;
  }

  // Moves to the next instant: now while starts wait, else the earliest end
  // (a resource runs one operation at a time, so those are the only future
  // events); false when nothing runs.
  bool NextInstant() {
    if (!starts_.empty()) return true;
    double next = HUGE_VAL;
    for (const int x : running_) {
      if (x >= 0) next = std::min(next, run_.end[x]);
    }
    now_ = next;
    return next != HUGE_VAL;
  }

  // This instant's events in the order of their codes (starts op * 2, ends
  // op * 2 + 1, together); the resources that end are free again.
  const std::vector<int64_t>& TakeInstant() {
    batch_.swap(starts_);
    starts_.clear();
    for (size_t r = 0; r < running_.size(); ++r) {
      int& x = running_[r];
      if (x >= 0 && run_.end[x] == now_) {
        batch_.push_back(int64_t{x} * 2 + 1);
        run_.ended.push_back(x);
        x = -1;
        ++finished_;
        Touch(static_cast<int>(r));
      }
    }
    if (batch_.size() > 1) std::sort(batch_.begin(), batch_.end());
    return batch_;
  }

  // The dependents an operation's start or end releases.
  void Release(int64_t code) {
    const int x = static_cast<int>(code >> 1);
    const int i = iteration_[x], e = 2 * op_[x] + static_cast<int>(code & 1);
    for (int k = tpl_.offsets[e]; k < tpl_.offsets[e + 1]; ++k) {
      const Dependent& dep = tpl_.dependents[k];
      if (i + dep.lag >= iterations_) continue;
      const int d = (i + dep.lag) * per_ + dep.op;
      if (now_ >= ready_[d]) {
        ready_[d] = now_;
        run_.binding[d] = x;
      }
      if (--remaining_[d] == 0) {
        const int r = Resource(d);
        queues_[r].Push(now_, d);
        Touch(r);
      }
    }
  }

  void Touch(int r) {
    if (r < 64) touched_ |= uint64_t{1} << r;
  }

  // A resource's ready operations, earliest ready first (ties: the lower
  // index). Operations become ready at the loop's current time, which never
  // falls, so the order is a queue whose tail of equal times is kept sorted.
  class ReadyQueue {
   public:
    bool empty() const { return head_ == entries_.size(); }
    void Push(double t, int x) {
      entries_.push_back({t, x});
      for (size_t k = entries_.size() - 1;
           k > head_ && entries_[k - 1].first == t && entries_[k - 1].second > x; --k) {
        std::swap(entries_[k - 1], entries_[k]);
      }
    }
    int Pop() {
      const int x = entries_[head_++].second;
      if (empty()) {
        entries_.clear();
        head_ = 0;
      }
      return x;
    }

   private:
    std::vector<std::pair<double, int>> entries_;
    size_t head_ = 0;
  };

  const std::vector<double>& seconds_;
  const int iterations_, per_, n_;
  const Template tpl_;
  // Per template operation its resource; per unrolled one its template
  // operation and iteration (no division on the hot path).
  std::vector<int> resource_;
  std::vector<int> op_, iteration_;
  // Per resource: its ready operations, and the one it runs (-1: idle).
  std::vector<ReadyQueue> queues_;
  std::vector<int> running_;
  std::vector<int> remaining_;
  std::vector<double> ready_;
  std::vector<int64_t> starts_, batch_;
  double now_ = 0.0;
  int finished_ = 0;
  // Bit r: resource r freed or given a ready operation since the last
  // Dispatch (every resource at the start).
  uint64_t touched_ = ~uint64_t{0};
  Timing run_;
};

}  // namespace

absl::StatusOr<Timing> Simulate(const Schedule& s, const std::vector<double>& seconds,
                                int iterations) {
  if (static_cast<int>(seconds.size()) != s.num_ops()) {
    return absl::InvalidArgumentError(absl::StrCat("seconds: has ", seconds.size(),
                                                   " durations for ", s.num_ops(), " operations"));
  }
  // The event loop's time never falls (its ready queues rely on it).
  for (size_t o = 0; o < seconds.size(); ++o) {
    if (!(seconds[o] >= 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("seconds[", o, "]: ", seconds[o], " is not a duration (>= 0)"));
    }
  }
  return EventLoop(s, seconds, iterations).Run();
}

}  // namespace tandem::schedule
