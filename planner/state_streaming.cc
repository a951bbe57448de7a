#include "planner/state_streaming.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "planner/update_placement.h"

namespace tandem::planner {
namespace {

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr tandem::v1::Placement kHost = tandem::v1::PLACEMENT_HOST;

// Chains of at most this many layers that may move also get pair moves.
constexpr int kPairLayers = 12;
// Descents from the fastest starts of step 1 besides the best.
constexpr size_t kDescents = 6;

// A placement's simulation without a timeline; nullopt-like `ok` false when
// it cannot be simulated.
struct Scored {
  bool ok = false;
  double seconds = HUGE_VAL;
  int64_t peak = INT64_MAX;
  SimulationResult result;
};

Scored Score(const PlanSimulator& simulator, const Decisions& d, int64_t* evaluations) {
  SimulationOptions quiet;
  quiet.record_timeline = false;
  ++*evaluations;
  absl::StatusOr<SimulationResult> r = simulator.Simulate(d, quiet);
  Scored s;
  if (!r.ok()) return s;
  s.ok = true;
  s.seconds = r->prediction.iteration_seconds();
  s.peak = r->prediction.accelerator_peak_bytes();
  s.result = *std::move(r);
  return s;
}

}  // namespace

std::vector<UpdatePlace> UpdatePlacesOf(const Decisions& d) {
  std::vector<UpdatePlace> places(d.layers.size(), UpdatePlace::kHost);
  for (size_t l = 0; l < d.layers.size(); ++l) {
    const LayerDecisions& x = d.layers[l];
    if (x.update == kAcc)
      places[l] = x.stream_state ? UpdatePlace::kStreamed : UpdatePlace::kResident;
  }
  return places;
}

Decisions WithUpdatePlaces(Decisions base, const std::vector<bool>& eligible,
                           const std::vector<UpdatePlace>& places) {
  for (size_t l = 0; l < base.layers.size(); ++l) {
    if (!eligible[l]) continue;
    base.layers[l].update = places[l] == UpdatePlace::kHost ? kHost : kAcc;
    base.layers[l].stream_state = places[l] == UpdatePlace::kStreamed;
  }
  return base;
}

std::vector<bool> ThreePlaceEligible(const PlanSimulator& simulator, const Decisions& base) {
  const CostModel& cost = simulator.cost();
  std::vector<bool> eligible(base.layers.size(), false);
  for (size_t l = 0; l < base.layers.size(); ++l) {
    eligible[l] = cost.ParameterBytes(static_cast<int>(l)) > 0 &&
                  base.layers[l].parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR;
  }
  return eligible;
}

StreamSearchResult SearchStreamedState(const PlanSimulator& simulator, const Decisions& start,
                                       double start_seconds, int64_t budget_bytes,
                                       const StreamSearchOptions& options) {
  StreamSearchResult out;
  out.decisions = start;
  const std::vector<bool> eligible = ThreePlaceEligible(simulator, start);
  const int L = static_cast<int>(start.layers.size());
  // The best placement so far, its prefetch distance and update lag.
  std::vector<UpdatePlace> best = UpdatePlacesOf(start);
  int best_ahead = std::max(1, start.state_prefetch_layers);
  int best_lag = std::max(0, start.state_update_lag);
  double best_seconds = start_seconds;
  Scored current;
  auto decisions = [&](const std::vector<UpdatePlace>& places, int ahead, int lag) {
    Decisions d = WithUpdatePlaces(start, eligible, places);
    d.state_prefetch_layers = ahead;
    d.state_update_lag = lag;
    return d;
  };
  // Simulates a candidate; adopts it when it fits and is the fastest yet.
  auto offer = [&](const std::vector<UpdatePlace>& places, int ahead, int lag) {
    Scored s = Score(simulator, decisions(places, ahead, lag), &out.evaluations);
    if (!s.ok || s.peak > budget_bytes || !(s.seconds < best_seconds)) return false;
    best = places;
    best_ahead = ahead;
    best_lag = lag;
    best_seconds = s.seconds;
    current = std::move(s);
    return true;
  };

  std::vector<int> candidates;  // host-updated layers that could stream
  for (int l = 0; l < L; ++l) {
    if (eligible[l] && best[l] == UpdatePlace::kHost) candidates.push_back(l);
  }
  const std::vector<UpdatePlace> from = best;
  const int C = static_cast<int>(candidates.size());
  // 1. Every k-th of them streams, so that each one's copies overlap the
  //    backward of the k - 1 between, under a few prefetch distances and
  //    lags; the same with the resident layers streaming too (their memory
  //    freed for others, which the descent moves); and every k-th of all the
  //    eligible layers, the rest on the host.
  std::vector<int> all;
  for (int l = 0; l < L; ++l) {
    if (eligible[l]) all.push_back(l);
  }
  const std::vector<UpdatePlace> host(L, UpdatePlace::kHost);
  // Every start that fits; the fastest few are descended from (step 3).
  struct Start {
    double seconds;
    std::vector<UpdatePlace> places;
    int ahead, lag;
  };
  std::vector<Start> starts;
  std::vector<UpdatePlace> unresident = from;
  for (UpdatePlace& x : unresident) {
    if (x == UpdatePlace::kResident) x = UpdatePlace::kStreamed;
  }
  for (const auto& [layers, base] :
       {std::pair{&candidates, &from}, {&candidates, &unresident}, {&all, &host}}) {
    const int n = static_cast<int>(layers->size());
    // k = 0: the base alone (the unresident one), 1: every candidate streams.
    for (int k : {0, 1, 2, 3, 4, 6, 8, 12, 16}) {
      if (k > std::max(n, 1)) break;
      if (k <= 1 && base != &unresident) continue;
      if (k == 0 && unresident == from) continue;
      for (auto [ahead, lag] : {std::pair{1, 0}, {1, 2}, {1, 4}, {4, 4}}) {
        if (out.evaluations >= options.max_evaluations / 4) break;
        std::vector<UpdatePlace> places = *base;
        for (int i = 0; k > 0 && i < n; i += k) places[(*layers)[i]] = UpdatePlace::kStreamed;
        const int a = std::min(ahead, std::max(1, L - 1));
        Scored s = Score(simulator, decisions(places, a, lag), &out.evaluations);
        if (!s.ok || s.peak > budget_bytes) continue;
        starts.push_back({s.seconds, places, a, lag});
        if (s.seconds < best_seconds) {
          best = places;
          best_ahead = a;
          best_lag = lag;
          best_seconds = s.seconds;
          current = std::move(s);
        }
      }
    }
  }

  // 2. update_placement.h's local search over which of them stream (runs by
  //    reuse distance from either end, greedy fill, descent), under the best
  //    prefetch distance and lag so far.
  if (C > 0) {
    std::vector<bool> subset(L, false);
    for (int l : candidates) subset[l] = true;
    const int64_t limit = out.evaluations + options.max_evaluations / 4;
    const int ahead = best_ahead, lag = best_lag;
    PlacementScorer scorer = [&](const std::vector<bool>& streamed, bool) {
      // Past its share of the simulations every placement scores as
      // unusable, so the search's start phases end too.
      if (out.evaluations >= limit) return PlacementScore{HUGE_VAL, INT64_MAX};
      std::vector<UpdatePlace> places = from;
      for (int l : candidates) {
        if (streamed[l]) places[l] = UpdatePlace::kStreamed;
      }
      const Scored s = Score(simulator, decisions(places, ahead, lag), &out.evaluations);
      return PlacementScore{s.seconds, s.peak};
    };
    PlacementSearchOptions search;
    search.max_evaluations = limit;
    search.max_kick_evaluations = 0;
    const PlacementSearchResult found = SearchUpdatePlacement(subset, budget_bytes, scorer, search);
    if (found.feasible && found.iteration_seconds < best_seconds) {
      std::vector<UpdatePlace> places = from;
      for (int l : candidates) {
        if (found.on_accelerator[l]) places[l] = UpdatePlace::kStreamed;
      }
      offer(places, ahead, lag);
    }
  }

  // 3. Steepest descent: single-layer moves to either other place, the
  //    prefetch distance and the lag halved or doubled; the fastest move that
  //    fits, until none improves. At a local optimum of those, on chains of
  //    at most kPairLayers eligible layers, pair moves (two layers at once).
  //    (descend: from the best, which it replaces by each improvement.)
  std::vector<int> movable;
  for (int l = 0; l < L; ++l) {
    if (eligible[l]) movable.push_back(l);
  }
  const bool small = static_cast<int>(movable.size()) <= kPairLayers;
  constexpr UpdatePlace kPlaces[] = {UpdatePlace::kHost, UpdatePlace::kResident,
                                     UpdatePlace::kStreamed};
  auto descend = [&](bool pairs) {
    while (out.evaluations < options.max_evaluations) {
      const std::vector<UpdatePlace> at = best;
      const int ahead = best_ahead, lag = best_lag;
      const double before = best_seconds;
      // The distances and lags a move that streams is tried with: the
      // current ones and their neighbours; single moves on small chains, every
      // distance and lag the search reaches (ExhaustivePlaces's).
      std::vector<std::pair<int, int>> near = {{ahead, lag}};
      auto add = [&](std::vector<std::pair<int, int>>* to, int a, int q) {
        if (a < 1 || (a > 1 && a >= L) || q < 0 || q > L) return;
        for (auto t : *to) {
          if (t == std::pair{a, q}) return;
        }
        to->push_back({a, q});
      };
      add(&near, ahead / 2, lag);
      add(&near, ahead * 2, lag);
      add(&near, ahead, lag / 2);
      add(&near, ahead, std::max(1, lag * 2));
      std::vector<std::pair<int, int>> single = near;
      if (small) {
        for (int a = 1; a == 1 || a < L; a *= 2) {
          for (int q = 0; q <= L; q = std::max(1, q * 2)) add(&single, a, q);
        }
      }
      auto offer_all = [&](const std::vector<UpdatePlace>& places,
                           const std::vector<std::pair<int, int>>& timings) {
        bool streams = false;
        for (UpdatePlace x : places) streams |= x == UpdatePlace::kStreamed;
        if (!streams) return offer(places, 1, 0), void();
        for (auto [a, q] : timings) offer(places, a, q);
      };
      bool streams = false;
      for (UpdatePlace x : at) streams |= x == UpdatePlace::kStreamed;
      if (streams) {
        for (size_t t = 1; t < single.size(); ++t) offer(at, single[t].first, single[t].second);
      }
      for (int l : movable) {
        if (out.evaluations >= options.max_evaluations) break;
        for (UpdatePlace p : kPlaces) {
          if (p == at[l]) continue;
          std::vector<UpdatePlace> places = at;
          places[l] = p;
          // offer() keeps the fastest of this round's moves: each is scored
          // against the best so far, which only falls.
          if (p == UpdatePlace::kStreamed || streams) {
            offer_all(places, single);
          } else {
            offer(places, ahead, lag);
          }
        }
      }
      if (best_seconds < before) continue;
      if (!pairs) break;
      for (size_t i = 0; i < movable.size() && out.evaluations < options.max_evaluations; ++i) {
        for (size_t k = i + 1; k < movable.size(); ++k) {
          for (UpdatePlace p : kPlaces) {
            for (UpdatePlace q : kPlaces) {
              if (p == at[movable[i]] || q == at[movable[k]]) continue;
              std::vector<UpdatePlace> places = at;
              places[movable[i]] = p;
              places[movable[k]] = q;
              offer_all(places, near);
            }
          }
        }
      }
      if (!(best_seconds < before)) break;
    }
  };
  // From the best so far, then from the fastest other starts of step 1 (a
  // slower start may descend further); the best of all stays.
  descend(small);
  std::sort(starts.begin(), starts.end(),
            [](const Start& a, const Start& b) { return a.seconds < b.seconds; });
  for (size_t i = 0; i < starts.size() && i < kDescents; ++i) {
    if (out.evaluations >= options.max_evaluations) break;
    const Start& s = starts[i];
    if (s.places == best && s.ahead == best_ahead && s.lag == best_lag) continue;
    const std::vector<UpdatePlace> at = best;
    const int ahead = best_ahead, lag = best_lag;
    const double seconds = best_seconds;
    const Scored scored = current;
    best = s.places;
    best_ahead = s.ahead;
    best_lag = s.lag;
    best_seconds = s.seconds;
    current = Score(simulator, decisions(best, best_ahead, best_lag), &out.evaluations);
    descend(small);
    if (best_seconds < seconds) continue;
    best = at;
    best_ahead = ahead;
    best_lag = lag;
    best_seconds = seconds;
    current = scored;
  }
  // 4. Kicks, on small chains: each single move from the best, taken even
  //    when it is slower, then descended from without pair moves; the first
  //    that ends faster than the best is kept, and the kicks start again.
  for (bool kicked = small; kicked && out.evaluations < options.max_evaluations;) {
    kicked = false;
    const std::vector<UpdatePlace> at = best;
    const int ahead = best_ahead, lag = best_lag;
    const double seconds = best_seconds;
    const Scored scored = current;
    for (size_t i = 0; i < movable.size() && !kicked; ++i) {
      for (UpdatePlace p : kPlaces) {
        if (p == at[movable[i]] || out.evaluations >= options.max_evaluations) continue;
        std::vector<UpdatePlace> places = at;
        places[movable[i]] = p;
        Scored s = Score(simulator, decisions(places, ahead, lag), &out.evaluations);
        if (!s.ok || s.peak > budget_bytes) continue;
        best = std::move(places);
        best_seconds = s.seconds;
        current = std::move(s);
        descend(false);
        if (best_seconds < seconds) {
          kicked = true;
          break;
        }
        best = at;
        best_ahead = ahead;
        best_lag = lag;
        best_seconds = seconds;
        current = scored;
      }
    }
  }
  if (!(best_seconds < start_seconds) || !current.ok) return out;
  out.decisions = decisions(best, best_ahead, best_lag);
  out.improved = true;
  out.simulation = std::move(current.result);
  return out;
}

ExhaustiveResult ExhaustivePlaces(const PlanSimulator& simulator, const Decisions& base,
                                  int64_t budget_bytes) {
  const std::vector<bool> eligible = ThreePlaceEligible(simulator, base);
  const int L = static_cast<int>(base.layers.size());
  std::vector<int> e;
  for (int l = 0; l < L; ++l) {
    if (eligible[l]) e.push_back(l);
  }
  // The prefetch distances and lags the search can reach from 1 and 0.
  std::vector<int> aheads = {1}, lags = {0, 1};
  while (aheads.back() * 2 < L) aheads.push_back(aheads.back() * 2);
  while (lags.back() < L) lags.push_back(lags.back() * 2);
  ExhaustiveResult out;
  std::vector<UpdatePlace> places(L, UpdatePlace::kHost);
  int64_t combinations = 1;
  for (size_t i = 0; i < e.size(); ++i) combinations *= 3;
  for (int64_t c = 0; c < combinations; ++c) {
    int64_t code = c;
    bool streams = false;
    for (int l : e) {
      places[l] = static_cast<UpdatePlace>(code % 3);
      streams |= places[l] == UpdatePlace::kStreamed;
      code /= 3;
    }
    for (int ahead : aheads) {
      for (int lag : lags) {
        // Without a streamed layer the distance and lag change nothing.
        if (!streams && (ahead != 1 || lag != 0)) continue;
        Decisions d = WithUpdatePlaces(base, eligible, places);
        d.state_prefetch_layers = ahead;
        d.state_update_lag = lag;
        const Scored s = Score(simulator, d, &out.evaluations);
        if (!s.ok || s.peak > budget_bytes) continue;
        if (!out.feasible || s.seconds < out.iteration_seconds) {
          out.feasible = true;
          out.iteration_seconds = s.seconds;
          out.places = places;
          out.prefetch_layers = ahead;
          out.update_lag = lag;
        }
      }
    }
  }
  return out;
}

}  // namespace tandem::planner
