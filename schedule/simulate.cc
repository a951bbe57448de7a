#include "schedule/simulate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
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

// Every operation's dependents over one iteration (`offsets` into
// `dependents`): the dependencies of the schedule, and each in-order
// resource's order as a dependency of each operation on the one before it in
// line (the last of an iteration before the first of the next). Unrolled
// over the iterations on the fly, so one table serves them all.
struct Template {
  std::vector<int> offsets;
  std::vector<Dependent> dependents;
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
  t.offsets.assign(n + 1, 0);
  t.prerequisites.assign(n, 0);
  t.lag_offsets.assign(n + 1, 0);
  ForEachEdge(s, [&](int from, const Dependent& to) {
    ++t.offsets[from + 1];
    ++t.prerequisites[to.op];
    if (to.lag > 0) ++t.lag_offsets[to.op + 1];
  });
  for (int o = 0; o < n; ++o) {
    t.offsets[o + 1] += t.offsets[o];
    t.lag_offsets[o + 1] += t.lag_offsets[o];
  }
  t.dependents.resize(t.offsets[n]);
  t.lags.resize(t.lag_offsets[n]);
  std::vector<int> fill(t.offsets.begin(), t.offsets.end() - 1);
  std::vector<int> lag_fill(t.lag_offsets.begin(), t.lag_offsets.end() - 1);
  ForEachEdge(s, [&](int from, const Dependent& to) {
    t.dependents[fill[from]++] = to;
    if (to.lag > 0) t.lags[lag_fill[to.op]++] = to.lag;
  });
  return t;
}

}  // namespace

absl::StatusOr<Timing> Simulate(const Schedule& s, const std::vector<double>& seconds,
                                int iterations) {
  if (static_cast<int>(seconds.size()) != s.num_ops()) {
    return absl::InvalidArgumentError(absl::StrCat("seconds: has ", seconds.size(),
                                                   " durations for ", s.num_ops(), " operations"));
  }
  const int per = s.num_ops();
  const int n = per * iterations;
  const Template tpl = Build(s);
  // Per unrolled operation: its unmet prerequisites, its iteration and its
  // operation in the template (no divisions in the loop below).
  std::vector<int> remaining(n), op_of(n), iteration_of(n);
  for (int i = 0; i < iterations; ++i) {
    for (int o = 0; o < per; ++o) {
      int count = tpl.prerequisites[o];
      for (int k = tpl.lag_offsets[o]; k < tpl.lag_offsets[o + 1]; ++k) count -= tpl.lags[k] > i;
      remaining[i * per + o] = count;
      op_of[i * per + o] = o;
      iteration_of[i * per + o] = i;
    }
  }

  Timing run;
  run.iterations = iterations;
  run.ops_per_iteration = per;
  run.start.assign(n, -1.0);
  run.end.assign(n, -1.0);
  run.binding.assign(n, -1);
  std::vector<double> ready(n, 0.0);
  auto resource = [&](int x) { return s.ops[op_of[x]].resource; };

  using Entry = std::pair<double, int64_t>;
  using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  const int R = static_cast<int>(s.resources.size());
  std::vector<MinHeap> queues(R);
  // The operation each resource runs (-1: idle); a resource runs one at a
  // time, so these are the only ends in the future.
  std::vector<int> running(R, -1);
  // Starts happen at the current time and wait in `starts` (op * 2); ends are
  // op * 2 + 1. Each instant's events are handled in the order of those
  // codes, starts and ends together.
  std::vector<int64_t> starts, batch;
  for (int x = 0; x < n; ++x) {
    if (remaining[x] == 0) queues[resource(x)].push({0.0, x});
  }
  auto dispatch = [&](double t) {
    for (int r = 0; r < R; ++r) {
      if (running[r] >= 0 || queues[r].empty()) continue;
      const int x = static_cast<int>(queues[r].top().second);
      queues[r].pop();
      running[r] = x;
      run.start[x] = t;
      run.end[x] = t + seconds[op_of[x]];
      starts.push_back(int64_t{x} * 2);
    }
  };
  double t = 0.0;
  dispatch(t);
  int finished = 0;
  while (true) {
    // The next instant: now, while starts wait, else the earliest end.
    if (starts.empty()) {
      double next = HUGE_VAL;
      for (int r = 0; r < R; ++r) {
        if (running[r] >= 0) next = std::min(next, run.end[running[r]]);
      }
      if (next == HUGE_VAL) break;
      t = next;
    }
    batch.swap(starts);
    starts.clear();
    for (int r = 0; r < R; ++r) {
      if (running[r] >= 0 && run.end[running[r]] == t) {
        batch.push_back(int64_t{running[r]} * 2 + 1);
        running[r] = -1;  // free for the dispatch after this instant
        ++finished;
      }
    }
    std::sort(batch.begin(), batch.end());
    for (const int64_t code : batch) {
      const int x = static_cast<int>(code / 2);
      const bool is_end = (code & 1) != 0;
      const int i = iteration_of[x], o = op_of[x];
      for (int k = tpl.offsets[o]; k < tpl.offsets[o + 1]; ++k) {
        const Dependent& dep = tpl.dependents[k];
        if (dep.on_start == is_end || i + dep.lag >= iterations) continue;
        const int d = (i + dep.lag) * per + dep.op;
        if (t >= ready[d]) {
          ready[d] = t;
          run.binding[d] = x;
        }
        if (--remaining[d] == 0) queues[resource(d)].push({t, d});
      }
    }
    batch.clear();
    dispatch(t);
  }
  if (finished != n) {
    return absl::InternalError(
        absl::StrCat("schedule deadlocked: ", n - finished, " of ", n, " operations never ran"));
  }
  return run;
}

}  // namespace tandem::schedule
