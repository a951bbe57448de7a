#include "schedule/simulate.h"

#include <functional>
#include <queue>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::schedule {
namespace {

struct Edge {
  int prerequisite;
  int dependent;
  bool on_start;
};

// Every dependency of every iteration, and each stream's order as a
// dependency on the operation before in line.
std::vector<Edge> UnrolledEdges(const Schedule& s, int iterations) {
  const int n = s.num_ops();
  std::vector<Edge> edges;
  for (int i = 0; i < iterations; ++i) {
    for (int o = 0; o < n; ++o) {
      for (const Dep& d : s.ops[o].deps) {
        if (i - d.lag >= 0) edges.push_back({(i - d.lag) * n + d.op, i * n + o, d.on_start});
      }
    }
    for (size_t r = 0; r < s.order.size(); ++r) {
      if (!s.resources[r].in_order) continue;
      const std::vector<int>& order = s.order[r];
      for (size_t t = 0; t < order.size(); ++t) {
        const int prev = t > 0 ? i * n + order[t - 1] : (i > 0 ? (i - 1) * n + order.back() : -1);
        if (prev >= 0) edges.push_back({prev, i * n + order[t], false});
      }
    }
  }
  return edges;
}

// The edges as lists of dependents per operation (`offsets` into
// `dependents`, each entry dependent * 2 + on_start) and each operation's
// count of unmet dependencies.
void Adjacency(const std::vector<Edge>& edges, int n, std::vector<int>* remaining,
               std::vector<int>* offsets, std::vector<int>* dependents) {
  remaining->assign(n, 0);
  offsets->assign(n + 1, 0);
  for (const Edge& e : edges) {
    ++(*remaining)[e.dependent];
    ++(*offsets)[e.prerequisite + 1];
  }
  for (int i = 0; i < n; ++i) (*offsets)[i + 1] += (*offsets)[i];
  dependents->assign(edges.size(), 0);
  std::vector<int> fill(offsets->begin(), offsets->end() - 1);
  for (const Edge& e : edges) {
    (*dependents)[fill[e.prerequisite]++] = e.dependent * 2 + (e.on_start ? 1 : 0);
  }
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
  std::vector<int> remaining, offsets, dependents;
  Adjacency(UnrolledEdges(s, iterations), n, &remaining, &offsets, &dependents);

  Timing run;
  run.iterations = iterations;
  run.ops_per_iteration = per;
  run.start.assign(n, -1.0);
  run.end.assign(n, -1.0);
  run.binding.assign(n, -1);
  std::vector<double> ready(n, 0.0);
  auto resource = [&](int x) { return s.ops[x % per].resource; };
  auto duration = [&](int x) { return seconds[x % per]; };

  using Entry = std::pair<double, int64_t>;
  using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  const int R = static_cast<int>(s.resources.size());
  std::vector<MinHeap> queues(R);
  std::vector<bool> busy(R, false);
  MinHeap events;  // (time, op * 2 + is_end)
  for (int x = 0; x < n; ++x) {
    if (remaining[x] == 0) queues[resource(x)].push({0.0, x});
  }
  auto dispatch = [&](double t) {
    for (int r = 0; r < R; ++r) {
      if (busy[r] || queues[r].empty()) continue;
      const int x = static_cast<int>(queues[r].top().second);
      queues[r].pop();
      busy[r] = true;
      run.start[x] = t;
      run.end[x] = t + duration(x);
      events.push({t, int64_t{x} * 2});
      events.push({run.end[x], int64_t{x} * 2 + 1});
    }
  };
  dispatch(0.0);
  int finished = 0;
  while (!events.empty()) {
    const double t = events.top().first;
    while (!events.empty() && events.top().first == t) {
      const int64_t code = events.top().second;
      events.pop();
      const int x = static_cast<int>(code / 2);
      const bool is_end = (code & 1) != 0;
      if (is_end) {
        busy[resource(x)] = false;
        ++finished;
      }
      for (int k = offsets[x]; k < offsets[x + 1]; ++k) {
        const int d = dependents[k] / 2;
        const bool on_start = (dependents[k] & 1) != 0;
        if (on_start == is_end) continue;
        if (t >= ready[d]) {
          ready[d] = t;
          run.binding[d] = x;
        }
        if (--remaining[d] == 0) queues[resource(d)].push({t, d});
      }
    }
    dispatch(t);
  }
  if (finished != n) {
    return absl::InternalError(
        absl::StrCat("schedule deadlocked: ", n - finished, " of ", n, " operations never ran"));
  }
  return run;
}

}  // namespace tandem::schedule
