#include "planner/update_placement.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "planner/exact_placement.h"

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

std::vector<bool> UpdateEligibleLayers(const CostModel& cost, const Decisions& decisions) {
  std::vector<bool> eligible(cost.num_layers());
  for (int l = 0; l < cost.num_layers(); ++l) {
    eligible[l] = cost.ParameterBytes(l) > 0 &&
                  decisions.layers[l].parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR;
  }
  return eligible;
}

PlacementScorer SimulatorPlacementScorer(const PlanSimulator& simulator, const Decisions& base) {
  return [&simulator, base](const std::vector<bool>& acc, bool need_peak) {
    Decisions s = base;
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

namespace {

// A placement and its iteration time.
struct Candidate {
  double seconds = 0;
  std::vector<bool> on_accelerator;
};

// The local search of update_placement.h: BestStart is steps 1-3, Improve
// steps 4-5.
class LocalSearch {
 public:
  LocalSearch(const std::vector<bool>& eligible, int64_t budget, const PlacementScorer& score,
              const PlacementSearchOptions& options, int64_t* evaluations)
      : L_(static_cast<int>(eligible.size())),
        budget_(budget),
        score_(score),
        options_(options),
        evaluations_(*evaluations) {
    for (int l = 0; l < L_; ++l) {
      if (eligible[l]) order_.push_back(l);
    }
    E_ = static_cast<int>(order_.size());
  }

  // The fastest of the structured starts that fit; false when none does.
  bool BestStart(Candidate* best) {
    const std::vector<bool> none(L_, false);
    const bool none_fits = Fits(none);
    std::vector<int> ascending(E_), descending(E_);
    for (int i = 0; i < E_; ++i) ascending[i] = i, descending[i] = E_ - 1 - i;
    // The runs assume that nothing on the accelerator fits.
    const int k_prefix = none_fits ? BestRun(ascending) : 0;
    const int k_suffix = none_fits ? BestRun(descending) : 0;
    // Positions the local search may move: around the prefix boundary and
    // around the suffix boundary (the head of the host update queue).
    for (int i = 0; i < E_; ++i) {
      if (std::abs(i - k_prefix) < kWindow || std::abs(i - (E_ - k_suffix)) < kWindow) {
        window_.push_back(i);
      }
    }
    // When even "all on the host" exceeds the budget, an accelerator update
    // can still lower the peak (its gradient leaves at once instead of
    // waiting in the D2H queue): start from the single window flip with the
    // lowest peak, if it fits.
    std::vector<bool> prefix = none_fits ? Take(ascending, k_prefix) : none;
    if (!none_fits) {
      int64_t lowest = INT64_MAX;
      for (int w : window_) {
        std::vector<bool> trial = none;
        trial[order_[w]] = true;
        const int64_t peak = Evaluate(trial, true).accelerator_peak_bytes;
        if (peak < lowest) lowest = peak, prefix = std::move(trial);
      }
      if (lowest > budget_) return false;
    }
    // 3. Greedy fill past the prefix, in reuse-distance order.
    double t_prefix = Seconds(prefix);
    for (int i = k_prefix; i < std::min(E_, k_prefix + 2 * kWindow); ++i) {
      std::vector<bool> trial = prefix;
      trial[order_[i]] = true;
      const double t = Seconds(trial);
      if (Shorter(t, t_prefix) && Fits(trial)) prefix = std::move(trial), t_prefix = t;
    }
    *best = {t_prefix, std::move(prefix)};
    if (none_fits) {
      for (std::vector<bool> other : {Take(descending, k_suffix), none}) {
        const double t = Seconds(other);
        if (Shorter(t, best->seconds)) *best = {t, std::move(other)};
      }
    }
    return true;
  }

  // 4-5. Descent from `start` (which fits), then kicks.
  Candidate Improve(Candidate start) {
    Candidate winner = Descend(std::move(start.on_accelerator), -1);
    const int W = static_cast<int>(window_.size());
    // Kicks: flip one window layer of the best answer, then two (even for
    // the worse, if it still fits), and descend again without undoing the
    // first; keep what improves. Kicks get a budget of layer-evaluations,
    // so they cost the same on long chains as on short ones.
    const int64_t kick_limit = std::min<int64_t>(options_.max_kick_evaluations,
                                                 options_.kick_layer_evaluations / std::max(1, L_));
    auto budget_left = [&] { return evaluations_ < kick_limit; };
    auto kick = [&](int a, int b) {
      std::vector<bool> kicked = winner.on_accelerator;
      kicked[order_[window_[a]]] = !kicked[order_[window_[a]]];
      if (b >= 0) kicked[order_[window_[b]]] = !kicked[order_[window_[b]]];
      if (!Fits(kicked)) return false;
      Candidate other = Descend(std::move(kicked), a);
      if (!Shorter(other.seconds, winner.seconds)) return false;
      winner = std::move(other);
      return true;
    };
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
    return winner;
  }

  PlacementScore Evaluate(const std::vector<bool>& acc, bool need_peak) {
    ++evaluations_;
    return score_(acc, need_peak);
  }

 private:
  // Layers on each side of a run's boundary the descent may move.
  static constexpr int kWindow = 8;
  // Passes of a descent; each takes at least one improving move.
  static constexpr int kMaxLocalPasses = 64;

  double Seconds(const std::vector<bool>& acc) { return Evaluate(acc, false).iteration_seconds; }
  bool Fits(const std::vector<bool>& acc) {
    return Evaluate(acc, true).accelerator_peak_bytes <= budget_;
  }
  // The first k layers of `seq` (positions into order_) on the accelerator.
  std::vector<bool> Take(const std::vector<int>& seq, int k) const {
    std::vector<bool> acc(L_, false);
    for (int i = 0; i < k; ++i) acc[order_[seq[i]]] = true;
    return acc;
  }

  // 2. The best feasible run of `seq`: the longest that fits (binary
  // search), then the fastest below it (ternary search on the unimodal
  // time, then neighbours). Returns its length.
  int BestRun(const std::vector<int>& seq) {
    int k_max = 0;
    if (E_ > 0 && Fits(Take(seq, E_))) {
      k_max = E_;
    } else {
      int lo = 0, hi = E_;
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (Fits(Take(seq, mid)) ? lo : hi) = mid;
      }
      k_max = lo;
    }
    auto time_of = [&](int k) { return Seconds(Take(seq, k)); };
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
    return Fits(Take(seq, k_best)) ? k_best : 0;
  }

  // 4. Steepest descent over single flips of window layers; at a local
  // optimum, the first improving pair flip; until neither improves. `tabu`
  // (a window index, or -1) may not be flipped: after a kick, the descent
  // must not simply undo it.
  Candidate Descend(std::vector<bool> current, int tabu) {
    const int W = static_cast<int>(window_.size());
    double t_current = Seconds(current);
    for (int pass = 0; pass < kMaxLocalPasses && evaluations_ < options_.max_evaluations; ++pass) {
      std::vector<std::pair<double, int>> moves;
      for (int a = 0; a < W; ++a) {
        if (a == tabu) continue;
        std::vector<bool> trial = current;
        trial[order_[window_[a]]] = !trial[order_[window_[a]]];
        const double t = Seconds(trial);
        if (Shorter(t, t_current)) moves.push_back({t, a});
      }
      std::sort(moves.begin(), moves.end());
      if (moves.size() > static_cast<size_t>(options_.fit_checks_per_step)) {
        moves.resize(options_.fit_checks_per_step);
      }
      bool improved = false;
      for (const auto& [t, a] : moves) {
        std::vector<bool> trial = current;
        trial[order_[window_[a]]] = !trial[order_[window_[a]]];
        if (Fits(trial)) {
          current = std::move(trial), t_current = t, improved = true;
          break;
        }
      }
      int pair_checks = 0;
      for (int a = 0; a < W && !improved && evaluations_ < options_.max_evaluations &&
                      pair_checks < options_.fit_checks_per_step;
           ++a) {
        for (int b = a + 1; b < W && !improved && pair_checks < options_.fit_checks_per_step; ++b) {
          if (a == tabu || b == tabu) continue;
          std::vector<bool> trial = current;
          trial[order_[window_[a]]] = !trial[order_[window_[a]]];
          trial[order_[window_[b]]] = !trial[order_[window_[b]]];
          const double t = Seconds(trial);
          if (!Shorter(t, t_current)) continue;
          ++pair_checks;
          if (Fits(trial)) current = std::move(trial), t_current = t, improved = true;
        }
      }
      if (!improved) break;
    }
    return {t_current, std::move(current)};
  }

  const int L_;
  const int64_t budget_;
  const PlacementScorer& score_;
  const PlacementSearchOptions& options_;
  int64_t& evaluations_;
  std::vector<int> order_;  // Eligible layers by reuse distance.
  int E_ = 0;
  std::vector<int> window_;  // Positions into order_.
};

// The result for `acc`, with its exact time and peak.
void Finish(const std::vector<bool>& acc, LocalSearch* search, PlacementSearchResult* result) {
  const PlacementScore s = search->Evaluate(acc, true);
  result->feasible = true;
  result->on_accelerator = acc;
  result->iteration_seconds = s.iteration_seconds;
  result->accelerator_peak_bytes = s.accelerator_peak_bytes;
}

}  // namespace

PlacementSearchResult SearchUpdatePlacement(const std::vector<bool>& eligible, int64_t budget_bytes,
                                            const PlacementScorer& score,
                                            const PlacementSearchOptions& options) {
  PlacementSearchResult result;
  LocalSearch search(eligible, budget_bytes, score, options, &result.evaluations);
  Candidate start;
  if (!search.BestStart(&start)) return result;
  Finish(search.Improve(std::move(start)).on_accelerator, &search, &result);
  return result;
}

PlacementSearchResult SearchChainUpdatePlacement(ChainEvaluator* evaluator,
                                                 const std::vector<bool>& eligible,
                                                 int64_t budget_bytes,
                                                 const PlacementSearchOptions& options) {
  evaluator->set_peak_limit(budget_bytes);
  PlacementSearchResult result;
  const PlacementScorer score = [evaluator](const std::vector<bool>& acc, bool need_peak) {
    return evaluator->Score(acc, need_peak);
  };
  LocalSearch search(eligible, budget_bytes, score, options, &result.evaluations);
  Candidate start;
  const bool have_start = search.BestStart(&start);
  const ExactPlacementResult exact = SearchExactPlacement(
      evaluator, eligible, budget_bytes, have_start ? start.on_accelerator : std::vector<bool>(),
      options.max_exact_nodes, options.max_exact_work);
  result.proven_optimal = exact.complete;
  result.search_nodes = exact.nodes;
  result.search_work = exact.work;
  result.evaluations += exact.exact_runs;
  if (exact.improved) {
    start = {evaluator->Score(exact.on_accelerator, false).iteration_seconds, exact.on_accelerator};
  } else if (!have_start) {
    return result;  // Nothing fits: the exact search found no placement either.
  }
  // A proven optimum needs no local search; otherwise improve on the best
  // known placement.
  Finish(exact.complete ? start.on_accelerator : search.Improve(std::move(start)).on_accelerator,
         &search, &result);
  return result;
}

}  // namespace tandem::planner
