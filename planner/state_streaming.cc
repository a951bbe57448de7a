#include "planner/state_streaming.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

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

namespace {

bool Streams(const std::vector<UpdatePlace>& places) {
  for (UpdatePlace p : places) {
    if (p == UpdatePlace::kStreamed) return true;
  }
  return false;
}

constexpr UpdatePlace kPlaces[] = {UpdatePlace::kHost, UpdatePlace::kResident,
                                   UpdatePlace::kStreamed};

// The prefetch distances and update lags the search can reach from 1 and 0
// on a chain of `layers`: powers of two below the layer count, and lags
// from 0 to the first power of two at or past it.
std::pair<std::vector<int>, std::vector<int>> ReachableTimings(int layers) {
  std::vector<int> aheads = {1}, lags = {0, 1};
  while (aheads.back() * 2 < layers) aheads.push_back(aheads.back() * 2);
  while (lags.back() < layers) lags.push_back(lags.back() * 2);
  return {aheads, lags};
}

// Simulations ExhaustivePlaces spends on `movable` layers of a chain of
// `layers`: every placement without a streamed layer once, every other under
// each reachable timing. Saturates past `most`.
int64_t ExhaustiveSimulations(int movable, int layers, int64_t most) {
  const auto [aheads, lags] = ReachableTimings(layers);
  const int64_t timings = static_cast<int64_t>(aheads.size() * lags.size());
  int64_t all = 1, unstreamed = 1;
  for (int i = 0; i < movable; ++i) {
    all *= 3;
    unstreamed *= 2;
    if (unstreamed + (all - unstreamed) * timings > most) return most + 1;
  }
  return unstreamed + (all - unstreamed) * timings;
}

// Calls `visit(places, ahead, lag)` for every placement of the layers in
// `movable` over `base` (the others keep theirs) under every reachable
// timing (once, at 1 and 0, where nothing streams), in ExhaustivePlaces'
// order.
template <typename Visit>
void ForEachPlacement(std::vector<UpdatePlace> places, const std::vector<int>& movable,
                      Visit visit) {
  const auto [aheads, lags] = ReachableTimings(static_cast<int>(places.size()));
  int64_t combinations = 1;
  for (size_t i = 0; i < movable.size(); ++i) combinations *= 3;
  for (int64_t c = 0; c < combinations; ++c) {
    int64_t code = c;
    bool streams = false;
    for (int l : movable) {
      places[l] = static_cast<UpdatePlace>(code % 3);
      streams |= places[l] == UpdatePlace::kStreamed;
      code /= 3;
    }
    for (int ahead : aheads) {
      for (int lag : lags) {
        // Without a streamed layer the distance and lag change nothing.
        if (!streams && (ahead != 1 || lag != 0)) continue;
        visit(places, ahead, lag);
      }
    }
  }
}

// A point of the search: every layer's update place, the state's prefetch
// distance and the update lag (Decisions::state_prefetch_layers, _lag).
struct Candidate {
  std::vector<UpdatePlace> places;
  int ahead = 1;
  int lag = 0;
  bool operator==(const Candidate& o) const {
    return places == o.places && ahead == o.ahead && lag == o.lag;
  }
};

// SearchStreamedState's state: the best candidate so far (it only improves,
// except while a descent from another start or a kick is tried, which
// Explore puts back when it ends no faster) and the simulations spent.
class StreamSearch {
 public:
  StreamSearch(const PlanSimulator& simulator, const Decisions& start, double start_seconds,
               int64_t budget_bytes, const StreamSearchOptions& options)
      : simulator_(simulator),
        start_(start),
        budget_(budget_bytes),
        options_(options),
        eligible_(UpdateEligibleLayers(simulator.cost(), start)),
        L_(static_cast<int>(start.layers.size())) {
    for (int l = 0; l < L_; ++l) {
      if (eligible_[l]) movable_.push_back(l);
    }
    small_ = static_cast<int>(movable_.size()) <= kPairLayers;
    best_ = {UpdatePlacesOf(start), std::max(1, start.state_prefetch_layers),
             std::max(0, start.state_update_lag)};
    // The start is not simulated again: its time alone, marked not ok.
    best_scored_.seconds = start_seconds;
  }

  StreamSearchResult Run() {
    const int movable = static_cast<int>(movable_.size());
    if (ExhaustiveSimulations(movable, L_, options_.max_evaluations) <= options_.max_evaluations) {
      // Enumerating every placement costs no more than the local search
      // may spend: enumerate (exact).
      ForEachPlacement(best_.places, movable_,
                       [&](const std::vector<UpdatePlace>& places, int ahead, int lag) {
                         Offer({places, ahead, lag});
                       });
    } else {
      SpacedStarts();
      SearchWhichStream();
      Descend(small_);
      DescendFromStarts();
      Kicks();
    }
    StreamSearchResult out;
    out.evaluations = evaluations_;
    out.decisions = start_;
    if (!best_scored_.ok) return out;  // nothing faster than the start
    out.decisions = DecisionsOf(best_);
    out.improved = true;
    out.simulation = std::move(best_scored_.result);
    return out;
  }

 private:
  bool Spent() const { return evaluations_ >= options_.max_evaluations; }

  Decisions DecisionsOf(const Candidate& c) const {
    Decisions d = WithUpdatePlaces(start_, eligible_, c.places);
    d.state_prefetch_layers = c.ahead;
    d.state_update_lag = c.lag;
    return d;
  }

  // The candidate's simulation, or not ok when it cannot be simulated or
  // does not fit.
  Scored Fitting(const Candidate& c) {
    Scored s = Score(simulator_, DecisionsOf(c), &evaluations_);
    if (s.ok && s.peak > budget_) s.ok = false;
    return s;
  }

  // Adopts `c` when it fits and is faster than the best; nothing once the
  // simulations are spent (a move's several timings stop there too).
  void Offer(const Candidate& c) {
    if (Spent()) return;
    Scored s = Fitting(c);
    if (!s.ok || !(s.seconds < BestSeconds())) return;
    Adopt(c, std::move(s));
  }
  void Adopt(Candidate c, Scored s) {
    best_ = std::move(c);
    best_scored_ = std::move(s);
  }
  double BestSeconds() const { return best_scored_.seconds; }

  // 1. Every k-th host-updated layer streams, so that each one's copies
  //    overlap the backward of the k - 1 between, under a few prefetch
  //    distances and lags; the same with the resident layers streaming too
  //    (their memory freed for others, which the descent moves); and every
  //    k-th of all the eligible layers, the rest on the host. Each start that
  //    fits is kept for DescendFromStarts.
  void SpacedStarts() {
    std::vector<UpdatePlace> unresident = best_.places;
    for (UpdatePlace& x : unresident) {
      if (x == UpdatePlace::kResident) x = UpdatePlace::kStreamed;
    }
    const std::vector<UpdatePlace> host(L_, UpdatePlace::kHost);
    const std::vector<UpdatePlace> from = best_.places;
    // Prefetch distances and lags: the next layer's, a few layers', and
    // every update after the whole backward (the longest lag reachable).
    const int last = ReachableTimings(L_).second.back();
    const std::pair<int, int> timings[] = {{1, 0}, {1, 2}, {1, 4}, {4, 4}, {1, last}};
    for (const auto& [layers, base] :
         {std::pair{HostUpdated(), &from}, {HostUpdated(), &unresident}, {movable_, &host}}) {
      const int n = static_cast<int>(layers.size());
      // k = 0: the base alone (the unresident one), 1: every layer streams.
      for (int k : {0, 1, 2, 3, 4, 6, 8, 12, 16}) {
        if (k > std::max(n, 1)) break;
        if (k <= 1 && base != &unresident) continue;
        if (k == 0 && unresident == from) continue;
        for (const auto& [ahead, lag] : timings) {
          if (lag == last && last <= 4) continue;  // one of the above
          // A quarter of the budget, and the first start whatever the budget.
          if (evaluations_ >= std::max<int64_t>(1, options_.max_evaluations / 4)) return;
          Candidate c{*base, std::min(ahead, std::max(1, L_ - 1)), lag};
          for (int i = 0; k > 0 && i < n; i += k) c.places[layers[i]] = UpdatePlace::kStreamed;
          Scored s = Fitting(c);
          if (!s.ok) continue;
          starts_.push_back({s.seconds, c});
          if (s.seconds < BestSeconds()) Adopt(c, std::move(s));
        }
      }
    }
  }

  // Layers the two-place start updates on the host.
  std::vector<int> HostUpdated() const {
    std::vector<int> out;
    for (int l : movable_) {
      if (start_.layers[l].update == tandem::v1::PLACEMENT_HOST) out.push_back(l);
    }
    return out;
  }

  // 2. update_placement.h's local search over which host-updated layers
  //    stream (runs by reuse distance from either end, greedy fill,
  //    descent), under the best prefetch distance and lag so far, with a
  //    quarter of the simulations.
  void SearchWhichStream() {
    const std::vector<int> candidates = HostUpdated();
    if (candidates.empty()) return;
    std::vector<bool> subset(L_, false);
    for (int l : candidates) subset[l] = true;
    const Candidate from{UpdatePlacesOf(start_), best_.ahead, best_.lag};
    auto streaming = [&](const std::vector<bool>& streamed) {
      Candidate c = from;
      for (int l : candidates) {
        if (streamed[l]) c.places[l] = UpdatePlace::kStreamed;
      }
      return c;
    };
    const int64_t limit = evaluations_ + options_.max_evaluations / 4;
    PlacementScorer scorer = [&](const std::vector<bool>& streamed, bool) {
      // Past its share every placement scores as unusable, so that the
      // search's start phases end too.
      if (evaluations_ >= limit) return PlacementScore{HUGE_VAL, INT64_MAX};
      const Scored s = Score(simulator_, DecisionsOf(streaming(streamed)), &evaluations_);
      return PlacementScore{s.seconds, s.peak};
    };
    PlacementSearchOptions search;
    search.max_evaluations = limit;
    search.max_kick_evaluations = 0;
    const PlacementSearchResult found = SearchUpdatePlacement(subset, budget_, scorer, search);
    if (found.feasible && found.iteration_seconds < BestSeconds()) {
      Offer(streaming(found.on_accelerator));
    }
  }

  // The prefetch distances and lags a move that streams is tried with: the
  // best's and their neighbours (halved, doubled); with `all`, on small
  // chains, every one ExhaustivePlaces covers.
  std::vector<std::pair<int, int>> Timings(bool all) const {
    std::vector<std::pair<int, int>> out = {{best_.ahead, best_.lag}};
    auto add = [&](int a, int q) {
      if (a < 1 || (a > 1 && a >= L_) || q < 0 || q > L_) return;
      if (std::find(out.begin(), out.end(), std::pair{a, q}) == out.end()) out.push_back({a, q});
    };
    add(best_.ahead / 2, best_.lag);
    add(best_.ahead * 2, best_.lag);
    add(best_.ahead, best_.lag / 2);
    add(best_.ahead, std::max(1, best_.lag * 2));
    if (all && small_) {
      for (int a = 1; a == 1 || a < L_; a *= 2) {
        for (int q = 0; q <= L_; q = std::max(1, q * 2)) add(a, q);
      }
    }
    return out;
  }

  // Offers `places` under each of `timings` (under none but 1 and 0 when
  // nothing streams).
  void OfferTimed(const std::vector<UpdatePlace>& places,
                  const std::vector<std::pair<int, int>>& timings) {
    if (!Streams(places)) return Offer({places, 1, 0});
    for (auto [a, q] : timings) Offer({places, a, q});
  }

  // 3. Steepest descent from the best: single-layer moves to either other
  //    place and the best's timing changed; the fastest move that fits (each
  //    is offered against the best so far, which only falls), until none
  //    improves. At a local optimum of those, with `pairs`, pair moves.
  void Descend(bool pairs) {
    while (!Spent()) {
      const Candidate at = best_;
      const double before = BestSeconds();
      const std::vector<std::pair<int, int>> near = Timings(false), single = Timings(true);
      const bool streams = Streams(at.places);
      if (streams) {
        for (size_t t = 1; t < single.size(); ++t)
          Offer({at.places, single[t].first, single[t].second});
      }
      for (int l : movable_) {
        if (Spent()) break;
        for (UpdatePlace p : kPlaces) {
          if (p == at.places[l]) continue;
          std::vector<UpdatePlace> places = at.places;
          places[l] = p;
          if (p == UpdatePlace::kStreamed || streams) {
            OfferTimed(places, single);
          } else {
            Offer({places, at.ahead, at.lag});
          }
        }
      }
      if (BestSeconds() < before) continue;
      if (!pairs) break;
      for (size_t i = 0; i < movable_.size() && !Spent(); ++i) {
        for (size_t k = i + 1; k < movable_.size(); ++k) {
          for (UpdatePlace p : kPlaces) {
            for (UpdatePlace q : kPlaces) {
              if (p == at.places[movable_[i]] || q == at.places[movable_[k]]) continue;
              std::vector<UpdatePlace> places = at.places;
              places[movable_[i]] = p;
              places[movable_[k]] = q;
              OfferTimed(places, near);
            }
          }
        }
      }
      if (!(BestSeconds() < before)) break;
    }
  }

  // Makes `from` (simulated as `scored`) the best, descends from it (with
  // pair moves or not), and keeps the outcome only when it is faster than
  // the best before; returns whether it was.
  bool Explore(const Candidate& from, Scored scored, bool pairs) {
    const Candidate kept = best_;
    const double kept_seconds = BestSeconds();
    Scored kept_scored = best_scored_;
    Adopt(from, std::move(scored));
    Descend(pairs);
    if (BestSeconds() < kept_seconds) return true;
    Adopt(kept, std::move(kept_scored));
    return false;
  }

  // Descents from the kDescents fastest starts of step 1 other than the best
  // (a slower start may descend further).
  void DescendFromStarts() {
    std::stable_sort(starts_.begin(), starts_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 0; i < starts_.size() && i < kDescents && !Spent(); ++i) {
      const Candidate& c = starts_[i].second;
      if (c == best_) continue;
      Scored s = Fitting(c);
      if (s.ok) Explore(c, std::move(s), small_);
    }
  }

  // 4. Kicks, on small chains: each single move from the best, taken even
  //    when it is slower, then descended from without pair moves; the first
  //    that ends faster than the best is kept, and the kicks start again.
  void Kicks() {
    for (bool kicked = small_; kicked && !Spent();) {
      kicked = false;
      const Candidate at = best_;
      for (size_t i = 0; i < movable_.size() && !kicked; ++i) {
        for (UpdatePlace p : kPlaces) {
          if (p == at.places[movable_[i]] || Spent()) continue;
          Candidate c = at;
          c.places[movable_[i]] = p;
          Scored s = Fitting(c);
          if (s.ok && Explore(c, std::move(s), false)) {
            kicked = true;
            break;
          }
        }
      }
    }
  }

  const PlanSimulator& simulator_;
  const Decisions& start_;
  const int64_t budget_;
  const StreamSearchOptions options_;
  const std::vector<bool> eligible_;
  const int L_;
  std::vector<int> movable_;
  bool small_ = false;
  Candidate best_;
  Scored best_scored_;
  std::vector<std::pair<double, Candidate>> starts_;
  int64_t evaluations_ = 0;
};

}  // namespace

StreamSearchResult SearchStreamedState(const PlanSimulator& simulator, const Decisions& start,
                                       double start_seconds, int64_t budget_bytes,
                                       const StreamSearchOptions& options) {
  return StreamSearch(simulator, start, start_seconds, budget_bytes, options).Run();
}

ExhaustiveResult ExhaustivePlaces(const PlanSimulator& simulator, const Decisions& base,
                                  int64_t budget_bytes) {
  const std::vector<bool> eligible = UpdateEligibleLayers(simulator.cost(), base);
  const int L = static_cast<int>(base.layers.size());
  std::vector<int> e;
  for (int l = 0; l < L; ++l) {
    if (eligible[l]) e.push_back(l);
  }
  ExhaustiveResult out;
  ForEachPlacement(std::vector<UpdatePlace>(L, UpdatePlace::kHost), e,
                   [&](const std::vector<UpdatePlace>& places, int ahead, int lag) {
                     Decisions d = WithUpdatePlaces(base, eligible, places);
                     d.state_prefetch_layers = ahead;
                     d.state_update_lag = lag;
                     const Scored s = Score(simulator, d, &out.evaluations);
                     if (!s.ok || s.peak > budget_bytes) return;
                     if (!out.feasible || s.seconds < out.iteration_seconds) {
                       out.feasible = true;
                       out.iteration_seconds = s.seconds;
                       out.places = places;
                       out.prefetch_layers = ahead;
                       out.update_lag = lag;
                     }
                   });
  return out;
}

}  // namespace tandem::planner
