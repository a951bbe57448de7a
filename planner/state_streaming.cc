#include "planner/state_streaming.h"

#include <algorithm>
#include <array>
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

// What the compute stream's own program holds on the accelerator whatever
// the update places (schedule/lower.cc's memory events; micro-batches run
// one after another, each forward then backward):
//
//  - at the start of FORWARD(l, j): its activations and workspace (and a
//    streamed layer's weights), what each layer before it keeps until its
//    backward (a KEEP layer its activations, a RECOMPUTE layer its
//    checkpoint, and layer l-1's whole activations while l runs; an
//    OFFLOAD layer counts 0: they may be on the host), and with j >= 1
//    every layer's gradient (allocated by BACKWARD(·, 0), freed only after
//    the last micro-batch's backward);
//  - at the start of BACKWARD(l, j): the same from the layers before it,
//    layer l's whole activations (kept, recomputed or fetched back, all
//    deps of the backward), workspace and gradient, and the gradients of
//    the other layers that no update or copy can have freed yet: with two
//    micro-batches those of the layers after l (j = 0) or before it
//    (j = 1), with three or more every one.
//
// Only for programs whose every layer computes on the accelerator (else
// the forward's own activations and workspace alone, the most over l).
int64_t ForcedBytes(const CostModel& cost, const Decisions& d) {
  const int L = static_cast<int>(d.layers.size());
  const int m = d.micro_batch_size, M = d.micro_batches();
  int64_t most = 0;
  bool all_accelerator = true;
  for (int l = 0; l < L; ++l) {
    if (d.layers[l].compute != tandem::v1::PLACEMENT_ACCELERATOR) {
      all_accelerator = false;
      continue;
    }
    most = std::max(most, cost.ActivationBytes(l, m) + cost.WorkspaceBytes(l, m));
  }
  if (!all_accelerator || L == 0) return most;
  std::vector<int64_t> grads_before(L + 1, 0);  // of layers [0, l)
  for (int l = 0; l < L; ++l) grads_before[l + 1] = grads_before[l] + cost.GradientBytes(l);
  const int64_t all_grads = grads_before[L];
  int64_t kept = 0;  // by the layers before l, until their backwards
  // What a recomputing layer l-1 holds beyond its checkpoint while l runs.
  int64_t previous_whole = 0;
  for (int l = 0; l < L; ++l) {
    const LayerDecisions& x = d.layers[l];
    const int64_t act = cost.ActivationBytes(l, m);
    const int64_t checkpoint = l == 0 ? 0 : std::min(act, cost.OutputBytes(l - 1, m));
    const int64_t weights =
        x.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED ? cost.ParameterBytes(l) : 0;
    const int64_t own = act + cost.WorkspaceBytes(l, m) + weights;
    most = std::max(most, kept + previous_whole + own + (M >= 2 ? all_grads : 0));
    int64_t grads = cost.GradientBytes(l);
    if (M == 2) {
      grads = std::max(all_grads - grads_before[l], grads_before[l + 1]);
    } else if (M > 2) {
      grads = all_grads;
    }
    most = std::max(most, kept + own + grads);
    const bool recomputes = x.activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
    if (x.activation == tandem::v1::ACTIVATION_POLICY_KEEP) kept += act;
    if (recomputes) kept += checkpoint;
    previous_whole = recomputes ? act - checkpoint : 0;
  }
  return most;
}

// The branch and bound's lower bounds (state_streaming.h, step 3) on the
// iteration and the accelerator peak of every placement that completes a
// partial one. Built from 1 + 2n simulations: `origin` (every movable layer
// on the host) and each movable layer moved alone to either other place.
// The iteration's bound is the larger of two:
//
//  - Resource work. An op's duration depends on its own layer's place only,
//    so one iteration's work on each resource is the origin's plus what
//    each layer's place adds; a steady period is at least each resource's
//    work (the simulator's ReportedPeriod holds it to that). An undecided
//    layer adds its least.
//  - The compute stream's wait for a host update (HostWait). A host-updated
//    layer's weights come back after its gradient's copy down, its host
//    update and its copy up (`chain`, their three durations: what updating
//    it resident saves on those resources), behind the host-updated layers
//    whose gradients were ready first. Until then the stream can only run
//    the program up to that layer's next forward: at most a reuse distance
//    at the origin plus the accelerator updates the other layers add (an
//    undecided layer its most). The rest is idle, and a period is the
//    stream's work plus its idle time, the gap being shorter than a period;
//    with delayed updates the wait spans two iterations, so half of what a
//    second iteration's work leaves.
//
// The peak's (PeakBound): the bytes the placement keeps on the accelerator
// throughout, plus the larger of what the compute stream's own forwards and
// backwards hold whatever the places (ForcedBytes: activations, workspace,
// and the gradients no update can have freed yet) and what a streamed
// layer's update holds (its state and gradient). Each bound of a partial placement holds for every
// placement that completes it (the decided layers' terms hold whatever the
// others do, and an undecided layer counts at its least).
class PlacementBound {
 public:
  static constexpr int kResources = 5;
  using Work = std::array<double, kResources>;
  struct Choice {
    UpdatePlace place;
    Work added;  // on each resource, against the host
    // Bytes the place keeps on the accelerator throughout (resident state),
    // against the host, and bytes it brings in for a while (streamed state).
    int64_t resident_bytes = 0;
    int64_t streamed_bytes = 0;
  };
  // What the decided layers add up to.
  struct Partial {
    Work added{};
    // Accelerator work the decided layers add (a compute stream's gap holds
    // at most that).
    double accelerator_added = 0;
    // Per movable layer: decided to update on the host.
    std::vector<bool> host;
    int64_t resident_bytes = 0;
    int64_t most_streamed_bytes = 0;
  };

  // False when a simulation fails where it may not (the origin) or lacks
  // the per-resource work.
  bool Build(const PlanSimulator& simulator, const Decisions& origin,
             const std::vector<int>& movable, int64_t* evaluations) {
    const int n = static_cast<int>(movable.size());
    const Scored at_origin = Score(simulator, origin, evaluations);
    if (!at_origin.ok || !WorkOf(at_origin.result, &base_)) return false;
    resident_base_ = at_origin.result.accelerator_resident_bytes;
    forced_bytes_ = ForcedBytes(simulator.cost(), origin);
    delayed_ = origin.delayed_parameter_update;
    if (at_origin.result.layers.size() != origin.layers.size()) return false;
    choices_.assign(n, {});
    chain_.assign(n, {0, 0, 0});
    reuse_.assign(n, 0);
    for (int i = 0; i < n; ++i) {
      reuse_[i] = at_origin.result.layers[movable[i]].reuse_distance_seconds;
      choices_[i].push_back({UpdatePlace::kHost, Work{}});
      for (UpdatePlace p : {UpdatePlace::kResident, UpdatePlace::kStreamed}) {
        Decisions d = origin;
        d.layers[movable[i]].update = tandem::v1::PLACEMENT_ACCELERATOR;
        d.layers[movable[i]].stream_state = p == UpdatePlace::kStreamed;
        const Scored s = Score(simulator, d, evaluations);
        // A place the simulator refuses is left out: every placement
        // holding it would be refused too.
        if (!s.ok) continue;
        Work w;
        if (!WorkOf(s.result, &w)) return false;
        for (int r = 0; r < kResources; ++r) w[r] -= base_[r];
        const int64_t resident = s.result.accelerator_resident_bytes - resident_base_;
        // A streamed update holds the state it brought and the gradient it
        // reads.
        const int64_t streamed = p == UpdatePlace::kStreamed
                                     ? simulator.cost().OptimizerStateBytes(movable[i]) +
                                           simulator.cost().GradientBytes(movable[i])
                                     : 0;
        choices_[i].push_back({p, w, resident, streamed});
        if (p == UpdatePlace::kResident) {
          chain_[i] = {std::max(0.0, -w[kD2h]), std::max(0.0, -w[kPool]), std::max(0.0, -w[kH2d])};
        }
      }
    }
    // The layers whose places change the sums most first, so that the
    // bound grows early.
    order_.resize(n);
    for (int i = 0; i < n; ++i) order_[i] = i;
    std::vector<double> spread(n, 0.0);
    for (int i = 0; i < n; ++i) {
      for (const Choice& c : choices_[i]) {
        for (double x : c.added) spread[i] = std::max(spread[i], std::abs(x));
      }
    }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](int a, int b) { return spread[a] > spread[b]; });
    least_.assign(n + 1, Work{});
    most_accelerator_.assign(n + 1, 0.0);
    least_resident_.assign(n + 1, 0);
    for (int k = n - 1; k >= 0; --k) {
      double most = 0;
      for (int r = 0; r < kResources; ++r) {
        double m = HUGE_VAL;
        for (const Choice& c : choices_[order_[k]]) m = std::min(m, c.added[r]);
        least_[k][r] = least_[k + 1][r] + m;
      }
      int64_t least_bytes = INT64_MAX;
      for (const Choice& c : choices_[order_[k]]) {
        most = std::max(most, c.added[kCompute]);
        least_bytes = std::min(least_bytes, c.resident_bytes);
      }
      most_accelerator_[k] = most_accelerator_[k + 1] + most;
      least_resident_[k] = least_resident_[k + 1] + least_bytes;
    }
    return true;
  }

  // The order layers are decided in (indices into `movable`).
  const std::vector<int>& order() const { return order_; }
  const std::vector<Choice>& choices(int i) const { return choices_[i]; }

  // `partial` with layer i at its choice c.
  Partial With(const Partial& partial, int i, size_t c) const {
    Partial out = partial;
    const Choice& choice = choices_[i][c];
    for (int r = 0; r < kResources; ++r) out.added[r] += choice.added[r];
    out.accelerator_added += std::max(0.0, choice.added[kCompute]);
    out.resident_bytes += choice.resident_bytes;
    out.most_streamed_bytes = std::max(out.most_streamed_bytes, choice.streamed_bytes);
    if (out.host.empty()) out.host.assign(choices_.size(), false);
    out.host[i] = choice.place == UpdatePlace::kHost;
    return out;
  }

  // For the layers order()[..k) decided as `partial`.
  double Bound(const Partial& partial, int k) const {
    double bound = 0;
    for (int r = 0; r < kResources; ++r) {
      bound = std::max(bound, base_[r] + partial.added[r] + least_[k][r]);
    }
    const double wait = HostWait(partial.host);
    if (wait > 0) {
      const double compute = base_[kCompute] + partial.added[kCompute] + least_[k][kCompute];
      double idle = wait - partial.accelerator_added - most_accelerator_[k];
      if (delayed_) {
        const double most_compute =
            base_[kCompute] + partial.added[kCompute] + most_accelerator_[k];
        idle = (idle - most_compute) / 2;
      }
      bound = std::max(bound, compute + idle);
    }
    return bound;
  }

  // The least accelerator peak of any placement completing `partial` (the
  // layers order()[..k) decided): the bytes it keeps throughout, plus the
  // larger of what the compute stream holds anyway (ForcedBytes) and, while
  // a streamed layer updates, that layer's state and gradient.
  int64_t PeakBound(const Partial& partial, int k) const {
    return resident_base_ + partial.resident_bytes + least_resident_[k] +
           std::max(forced_bytes_, partial.most_streamed_bytes);
  }

  // Both bounds of the complete placement `places` (by index into
  // `movable`).
  PlacementLowerBounds BoundsOf(const std::vector<UpdatePlace>& places) const {
    Partial partial;
    for (int i : order_) {
      for (size_t c = 0; c < choices_[i].size(); ++c) {
        if (choices_[i][c].place == places[i]) partial = With(partial, i, c);
      }
    }
    const int n = static_cast<int>(order_.size());
    return {Bound(partial, n), PeakBound(partial, n)};
  }

 private:
  enum : int { kCompute, kH2d, kD2h, kPool, kHostCompute };

  // The most the weights of a layer in `host` can come back after the
  // stream could have run the program up to that layer's next forward,
  // without the accelerator updates. The layers j >= l of `host` (gradients
  // ready in backward order, so j's first) pass the copy engine down, the
  // pool and the copy engine up one after the other, in that order; were
  // all ready when j's is, l's weights would be back no sooner than that
  // three-stage flow shop's makespan after j's backward ended. The program
  // from there to l's next forward is at most j's reuse distance at the
  // origin.
  double HostWait(const std::vector<bool>& host) const {
    double worst = -HUGE_VAL;
    const int n = static_cast<int>(host.size());
    for (int l = 0; l < n; ++l) {
      if (!host[l]) continue;
      for (int j = l; j < n; ++j) {
        if (!host[j]) continue;
        double down = 0, pool = 0, up = 0;
        for (int x = j; x >= l; --x) {
          if (!host[x]) continue;
          down += chain_[x][0];
          pool = std::max(pool, down) + chain_[x][1];
          up = std::max(up, pool) + chain_[x][2];
        }
        worst = std::max(worst, up - reuse_[j]);
      }
    }
    return worst;
  }

  // One iteration's work on each resource (false when the simulator did
  // not sum it).
  static bool WorkOf(const SimulationResult& r, Work* w) {
    if (r.resource_work_seconds.empty()) return false;
    constexpr tandem::v1::TimelineResource kKinds[kResources] = {
        tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
        tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE,
        tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE};
    for (int i = 0; i < kResources; ++i) (*w)[i] = r.resource_work_seconds[kKinds[i]];
    return true;
  }

  Work base_{};
  int64_t resident_base_ = 0, forced_bytes_ = 0;
  bool delayed_ = false;
  std::vector<std::vector<Choice>> choices_;
  // Per movable layer updated on the host: its gradient's copy down, its
  // host update and its weights' copy up (what updating it resident saves
  // on those resources; 0 where it cannot be resident), and its reuse
  // distance at the origin.
  std::vector<std::array<double, 3>> chain_;
  std::vector<double> reuse_;
  std::vector<int> order_;
  // Per k: the least the layers order_[k..] add on each resource, and the
  // most they add to the compute stream.
  std::vector<Work> least_;
  std::vector<double> most_accelerator_;
  std::vector<int64_t> least_resident_;
};
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

// Where a timing puts `places`' streamed layers' operations
// (schedule/lower.h, STREAMED OPTIMIZER STATE): each one's STATE_H2D waits
// for BACKWARD(min(L-1, l + ahead)), and its update follows BACKWARD(max(l -
// lag, 0)) where updates lag (lag > 0 and `lags_apply`: the job does not clip
// its gradients), its own backward where not. Those are all the program
// takes of the timing: two timings whose positions are equal lower to the
// same step.
std::vector<int> TimingPositions(const std::vector<UpdatePlace>& places, int ahead, int lag,
                                 bool lags_apply) {
  const int L = static_cast<int>(places.size());
  const bool lagged = lags_apply && lag > 0;
  std::vector<int> key = {lagged ? 1 : 0};
  for (int l = 0; l < L; ++l) {
    if (places[l] != UpdatePlace::kStreamed) continue;
    key.push_back(std::min(L - 1, l + std::max(1, ahead)));
    key.push_back(lagged ? std::max(l - lag, 0) : l);
  }
  return key;
}

// Calls `visit(ahead, lag)` for every reachable timing of `places` (once,
// at 1 and 0, where nothing streams: the distance and lag change nothing
// then) until it returns false. `distinct`: only the first of the timings
// that lower to the same step (TimingPositions), the others' simulations
// being the same.
template <typename Visit>
void ForEachTiming(const std::vector<UpdatePlace>& places, bool distinct, bool lags_apply,
                   Visit visit) {
  if (!Streams(places)) {
    visit(1, 0);
    return;
  }
  const auto [aheads, lags] = ReachableTimings(static_cast<int>(places.size()));
  std::vector<std::vector<int>> seen;
  for (int ahead : aheads) {
    for (int lag : lags) {
      if (distinct) {
        std::vector<int> key = TimingPositions(places, ahead, lag, lags_apply);
        if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
        seen.push_back(std::move(key));
      }
      if (!visit(ahead, lag)) return;
    }
  }
}

// Calls `visit(places, ahead, lag)` for every placement of the layers in
// `movable` over `base` (the others keep theirs) under every reachable
// timing (ForEachTiming, `distinct` as there), in ExhaustivePlaces' order.
template <typename Visit>
void ForEachPlacement(std::vector<UpdatePlace> places, const std::vector<int>& movable,
                      bool distinct, bool lags_apply, Visit visit) {
  int64_t combinations = 1;
  for (size_t i = 0; i < movable.size(); ++i) combinations *= 3;
  for (int64_t c = 0; c < combinations; ++c) {
    int64_t code = c;
    for (int l : movable) {
      places[l] = static_cast<UpdatePlace>(code % 3);
      code /= 3;
    }
    ForEachTiming(places, distinct, lags_apply, [&](int ahead, int lag) {
      visit(places, ahead, lag);
      return true;
    });
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
    bool exact = false;
    int64_t exact_evaluations = 0;
    if (ExhaustiveSimulations(movable, L_, options_.max_evaluations) <= options_.max_evaluations) {
      // Enumerating every placement costs no more than the local search
      // may spend: enumerate (exact; Offer stops only past that budget).
      ForEachPlacement(best_.places, movable_, /*distinct=*/true, LagsApply(),
                       [&](const std::vector<UpdatePlace>& places, int ahead, int lag) {
                         Offer({places, ahead, lag});
                       });
      exact = true;
    } else {
      SpacedStarts();
      SearchWhichStream();
      Descend(small_);
      DescendFromStarts();
      Kicks();
      if (movable <= options_.exact_layers) {
        const int64_t before = evaluations_;
        exact = BranchAndBound();
        exact_evaluations = evaluations_ - before;
      }
    }
    StreamSearchResult out;
    out.evaluations = evaluations_;
    out.exact = exact;
    out.exact_evaluations = exact_evaluations;
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

  // 3. Branch and bound (state_streaming.h) over every placement of the
  //    movable layers, seeded with the best so far; true when it ended
  //    within its simulations and no simulated time fell below its bound.
  bool BranchAndBound() {
    const int64_t most = evaluations_ + options_.max_exact_evaluations;
    Candidate origin = best_;
    for (int l : movable_) origin.places[l] = UpdatePlace::kHost;
    origin.ahead = 1;
    origin.lag = 0;
    PlacementBound bound;
    if (!bound.Build(simulator_, DecisionsOf(origin), movable_, &evaluations_)) return false;
    BoundSearch search{&bound, origin, most};
    Branch(&search, 0, PlacementBound::Partial{});
    return search.sound && !search.stopped;
  }

  struct BoundSearch {
    const PlacementBound* bound;
    Candidate at;  // the placement being built
    int64_t most;
    bool sound = true;
    // The simulations ran out before every placement was covered.
    bool stopped = false;
  };

  // Places the layers bound->order()[k..] given those before (`partial`).
  void Branch(BoundSearch* s, int k, const PlacementBound::Partial& partial) {
    if (evaluations_ >= s->most) s->stopped = true;
    if (s->stopped || !s->sound) return;
    const double bound = s->bound->Bound(partial, k);
    if (bound >= BestSeconds()) return;
    const int64_t peak = s->bound->PeakBound(partial, k);
    if (peak > budget_) return;
    const std::vector<int>& order = s->bound->order();
    if (k == static_cast<int>(order.size())) return Leaf(s, bound, peak);
    const int i = order[k];
    for (size_t c = 0; c < s->bound->choices(i).size(); ++c) {
      s->at.places[movable_[i]] = s->bound->choices(i)[c].place;
      Branch(s, k + 1, s->bound->With(partial, i, c));
    }
  }

  // Simulates the complete placement s->at under every reachable timing.
  void Leaf(BoundSearch* s, double bound, int64_t peak) {
    ForEachTiming(s->at.places, /*distinct=*/true, LagsApply(), [&](int ahead, int lag) {
      if (evaluations_ >= s->most) {
        s->stopped = true;
        return false;
      }
      Candidate c{s->at.places, ahead, lag};
      Scored scored = Score(simulator_, DecisionsOf(c), &evaluations_);
      if (!scored.ok) return true;
      // The bound is sound by construction (PlacementBound); a time below it
      // would void the proof, and is looked for all the same.
      if (scored.seconds < bound * (1 - 1e-9) || scored.peak < peak) s->sound = false;
      if (scored.peak <= budget_ && scored.seconds < BestSeconds()) {
        Adopt(std::move(c), std::move(scored));
      }
      return true;
    });
  }

  // Whether the update lag moves updates: not under clipping (lower.h).
  bool LagsApply() const { return !simulator_.cost().clips_gradients(); }

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

int64_t LeastAcceleratorPeakBytes(const CostModel& cost, const Decisions& d) {
  int64_t weights = 0;
  for (int l = 0; l < static_cast<int>(d.layers.size()); ++l) {
    const LayerDecisions& x = d.layers[l];
    if (x.compute != tandem::v1::PLACEMENT_ACCELERATOR) return ForcedBytes(cost, d);
    if (x.parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) {
      weights += cost.ParameterBytes(l);
    }
  }
  return weights + ForcedBytes(cost, d);
}

StreamSearchResult SearchStreamedState(const PlanSimulator& simulator, const Decisions& start,
                                       double start_seconds, int64_t budget_bytes,
                                       const StreamSearchOptions& options) {
  // Nothing fits: not one simulation (a start where no two-place placement
  // fits is searched from every layer on the host).
  if (LeastAcceleratorPeakBytes(simulator.cost(), start) > budget_bytes) {
    StreamSearchResult none;
    none.decisions = start;
    return none;
  }
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
  ForEachPlacement(std::vector<UpdatePlace>(L, UpdatePlace::kHost), e, /*distinct=*/false,
                   /*lags_apply=*/true,
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

absl::StatusOr<PlacementLowerBounds> StreamedPlacementLowerBounds(
    const PlanSimulator& simulator, const Decisions& base, const std::vector<UpdatePlace>& places) {
  const std::vector<bool> eligible = UpdateEligibleLayers(simulator.cost(), base);
  std::vector<int> movable;
  for (size_t l = 0; l < eligible.size(); ++l) {
    if (eligible[l]) movable.push_back(static_cast<int>(l));
  }
  Decisions origin = WithUpdatePlaces(
      base, eligible, std::vector<UpdatePlace>(base.layers.size(), UpdatePlace::kHost));
  origin.state_prefetch_layers = 1;
  origin.state_update_lag = 0;
  PlacementBound bound;
  int64_t evaluations = 0;
  if (!bound.Build(simulator, origin, movable, &evaluations)) {
    return absl::FailedPreconditionError("the placement bound needs per-resource work");
  }
  std::vector<UpdatePlace> mine;
  for (int l : movable) mine.push_back(places[l]);
  return bound.BoundsOf(mine);
}

}  // namespace tandem::planner
