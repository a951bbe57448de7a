#include "planner/update_placement.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace tandem::planner {
namespace {

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr tandem::v1::Placement kHost = tandem::v1::PLACEMENT_HOST;

// Layers on each side of the prefix boundary the local search may move.
constexpr int kWindow = 8;
// Passes of the local search; each takes at least one improving move.
constexpr int kMaxLocalPasses = 64;

bool Shorter(double a, double b) { return a < b - 1e-12 * std::max(1.0, std::fabs(b)); }

}  // namespace

PlacementScorer SimulatorPlacementScorer(const PlanSimulator& simulator, const Schedule& base) {
  return [&simulator, base](const std::vector<bool>& acc, bool need_peak) {
    Schedule s = base;
    for (size_t l = 0; l < s.layers.size(); ++l) {
      if (s.layers[l].parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED) continue;
      s.layers[l].update = acc[l] ? kAcc : kHost;
    }
    SimulationOptions options;
    options.record_timeline = false;
    absl::StatusOr<SimulationResult> r = simulator.Simulate(s, options);
    PlacementScore score;
    if (!r.ok()) {
      score.iteration_seconds = HUGE_VAL;
      score.accelerator_peak_bytes = INT64_MAX;
      return score;
    }
    score.iteration_seconds = r->prediction.iteration_seconds();
    score.accelerator_peak_bytes = r->prediction.accelerator_peak_bytes();
    return score;
  };
}

PlacementSearchResult SearchUpdatePlacement(const std::vector<bool>& eligible, int64_t budget_bytes,
                                            const PlacementScorer& score,
                                            const PlacementSearchOptions& options) {
  const int L = static_cast<int>(eligible.size());
  PlacementSearchResult best;
  std::vector<int> order;  // Eligible layers by reuse distance.
  for (int l = 0; l < L; ++l) {
    if (eligible[l]) order.push_back(l);
  }
  const int E = static_cast<int>(order.size());
  auto evaluate = [&](const std::vector<bool>& acc, bool need_peak) {
    ++best.evaluations;
    return score(acc, need_peak);
  };
  auto fits = [&](const std::vector<bool>& acc) {
    return evaluate(acc, true).accelerator_peak_bytes <= budget_bytes;
  };
  const std::vector<bool> none(L, false);
  const bool none_fits = evaluate(none, true).accelerator_peak_bytes <= budget_bytes;

  // The first k layers of `seq` (positions into `order`) on the accelerator.
  auto take = [&](const std::vector<int>& seq, int k) {
    std::vector<bool> acc(L, false);
    for (int i = 0; i < k; ++i) acc[order[seq[i]]] = true;
    return acc;
  };
  // 2. The best feasible run of `seq`: the longest that fits (binary search),
  // then the fastest below it (ternary search on the unimodal time, then
  // neighbours). Returns its length.
  auto best_run = [&](const std::vector<int>& seq) {
    int k_max = 0;
    if (E > 0 && fits(take(seq, E))) {
      k_max = E;
    } else {
      int lo = 0, hi = E;
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(take(seq, mid)) ? lo : hi) = mid;
      }
      k_max = lo;
    }
    auto time_of = [&](int k) { return evaluate(take(seq, k), false).iteration_seconds; };
    int lo = 0, hi = k_max;
    while (hi - lo > 2) {
      const int m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
      if (Shorter(time_of(m2), time_of(m1))) {
        lo = m1;
      } else {
        hi = m2;
      }
    }
    int k_best = lo;
    double t_best = time_of(lo);
    for (int k = lo + 1; k <= hi; ++k) {
      const double t = time_of(k);
      if (Shorter(t, t_best)) k_best = k, t_best = t;
    }
    return fits(take(seq, k_best)) ? k_best : 0;
  };
  std::vector<int> ascending(E), descending(E);
  for (int i = 0; i < E; ++i) ascending[i] = i, descending[i] = E - 1 - i;
  // The runs assume that nothing on the accelerator fits.
  const int k_prefix = none_fits ? best_run(ascending) : 0;
  const int k_suffix = none_fits ? best_run(descending) : 0;

  // Positions the local search may move: around the prefix boundary and
  // around the suffix boundary (the head of the host update queue).
  std::vector<int> window;
  for (int i = 0; i < E; ++i) {
    if (std::abs(i - k_prefix) < kWindow || std::abs(i - (E - k_suffix)) < kWindow) {
      window.push_back(i);
    }
  }
  const int W = static_cast<int>(window.size());

  // 4. From each start: steepest descent over single flips; at a local
  // optimum, the first improving pair flip; until neither improves.
  // `tabu` (a window index, or -1) may not be flipped: after a kick, the
  // descent must not simply undo it.
  auto descend = [&](std::vector<bool> current, int tabu) {
    double t_current = evaluate(current, false).iteration_seconds;
    for (int pass = 0; pass < kMaxLocalPasses && best.evaluations < options.max_evaluations;
         ++pass) {
      std::vector<std::pair<double, int>> moves;
      for (int a = 0; a < W; ++a) {
        if (a == tabu) continue;
        std::vector<bool> trial = current;
        trial[order[window[a]]] = !trial[order[window[a]]];
        const double t = evaluate(trial, false).iteration_seconds;
        if (Shorter(t, t_current)) moves.push_back({t, a});
      }
      std::sort(moves.begin(), moves.end());
      if (moves.size() > static_cast<size_t>(options.fit_checks_per_step)) {
        moves.resize(options.fit_checks_per_step);
      }
      bool improved = false;
      for (const auto& [t, a] : moves) {
        std::vector<bool> trial = current;
        trial[order[window[a]]] = !trial[order[window[a]]];
        if (fits(trial)) {
          current = std::move(trial), t_current = t, improved = true;
          break;
        }
      }
      int pair_checks = 0;
      for (int a = 0; a < W && !improved && best.evaluations < options.max_evaluations &&
                      pair_checks < options.fit_checks_per_step;
           ++a) {
        for (int b = a + 1; b < W && !improved && pair_checks < options.fit_checks_per_step; ++b) {
          if (a == tabu || b == tabu) continue;
          std::vector<bool> trial = current;
          trial[order[window[a]]] = !trial[order[window[a]]];
          trial[order[window[b]]] = !trial[order[window[b]]];
          const double t = evaluate(trial, false).iteration_seconds;
          if (!Shorter(t, t_current)) continue;
          ++pair_checks;
          if (fits(trial)) current = std::move(trial), t_current = t, improved = true;
        }
      }
      if (!improved) break;
    }
    return std::make_pair(t_current, current);
  };

  // When even "all on the host" exceeds the budget, an accelerator update
  // can still lower the peak (its gradient leaves at once instead of waiting
  // in the D2H queue): start from the single window flip with the lowest
  // peak, if it fits.
  std::vector<bool> start = none;
  if (!none_fits) {
    int64_t lowest = INT64_MAX;
    for (int a = 0; a < W; ++a) {
      std::vector<bool> trial = none;
      trial[order[window[a]]] = true;
      const int64_t peak = evaluate(trial, true).accelerator_peak_bytes;
      if (peak < lowest) lowest = peak, start = std::move(trial);
    }
    if (lowest > budget_bytes) return best;
  }
  best.feasible = true;

  std::vector<bool> prefix = none_fits ? take(ascending, k_prefix) : start;
  // 3. Greedy fill past the prefix, in reuse-distance order.
  double t_prefix = evaluate(prefix, false).iteration_seconds;
  for (int i = k_prefix; i < std::min(E, k_prefix + 2 * kWindow); ++i) {
    std::vector<bool> trial = prefix;
    trial[order[i]] = true;
    const double t = evaluate(trial, false).iteration_seconds;
    if (Shorter(t, t_prefix) && fits(trial)) prefix = std::move(trial), t_prefix = t;
  }
  std::pair<double, std::vector<bool>> winner = descend(prefix, -1);
  if (none_fits) {
    for (const std::vector<bool>& other_start : {take(descending, k_suffix), none}) {
      std::pair<double, std::vector<bool>> other = descend(other_start, -1);
      if (Shorter(other.first, winner.first)) winner = std::move(other);
    }
  }
  // 5. Kicks: flip one window layer of the best answer, then two (even for
  // the worse, if it still fits), and descend again without undoing the
  // first; keep what improves. Bounded by options.max_kick_evaluations so
  // that long chains stay within the solve-time target.
  auto kick = [&](int a, int b) {
    std::vector<bool> kicked_start = winner.second;
    kicked_start[order[window[a]]] = !kicked_start[order[window[a]]];
    if (b >= 0) kicked_start[order[window[b]]] = !kicked_start[order[window[b]]];
    if (!fits(kicked_start)) return false;
    std::pair<double, std::vector<bool>> other = descend(std::move(kicked_start), a);
    if (!Shorter(other.first, winner.first)) return false;
    winner = std::move(other);
    return true;
  };
  // Kicks get a budget of layer-evaluations, so they cost the same on long
  // chains as on short ones.
  const int64_t kick_limit = std::min<int64_t>(options.max_kick_evaluations,
                                               options.kick_layer_evaluations / std::max(1, L));
  auto budget_left = [&] { return best.evaluations < kick_limit; };
  bool kicked = true;
  while (kicked && budget_left()) {
    kicked = false;
    for (int a = 0; a < W && !kicked && budget_left(); ++a) kicked = kick(a, -1);
    for (int a = 0; a < W && !kicked && budget_left(); ++a) {
      for (int b = 0; b < W && !kicked && budget_left(); ++b) {
        if (b != a) kicked = kick(a, b);
      }
    }
  }

  const PlacementScore final_score = evaluate(winner.second, true);
  best.on_accelerator = std::move(winner.second);
  best.iteration_seconds = final_score.iteration_seconds;
  best.accelerator_peak_bytes = final_score.accelerator_peak_bytes;
  return best;
}

}  // namespace tandem::planner
