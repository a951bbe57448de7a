#include "planner/strategies.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "planner/memory_fit.h"
#include "planner/state_streaming.h"
#include "planner/update_placement.h"

namespace tandem::planner {
namespace {

using tandem::v1::PLACEMENT_ACCELERATOR;
using tandem::v1::PLACEMENT_HOST;

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Every layer computes on the accelerator with resident state; `update`
// says where layers with parameters update.
Decisions AcceleratorBase(const StrategyContext& c, tandem::v1::Strategy strategy,
                          tandem::v1::Placement update) {
  const CostModel& cost = c.cost();
  Decisions s;
  s.strategy = strategy;
  s.layers.resize(cost.num_layers());
  for (int l = 0; l < cost.num_layers(); ++l) {
    const bool has_params = cost.ParameterBytes(l) > 0 || cost.GradientBytes(l) > 0;
    s.layers[l].update = has_params ? update : PLACEMENT_ACCELERATOR;
  }
  s.batch_size = c.batch_size;
  s.micro_batch_size = c.batch_size;
  s.delayed_parameter_update = c.delayed_parameter_update && update == PLACEMENT_HOST;
  s.host_update_threads = c.host_update_threads;
  return s;
}

// What a fitted schedule did to save memory, for notes.
std::string Describe(const Decisions& s) {
  int offload = 0, recompute = 0, streamed = 0, on_accelerator = 0;
  for (const LayerDecisions& l : s.layers) {
    offload += l.activation == tandem::v1::ACTIVATION_POLICY_OFFLOAD;
    recompute += l.activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
    streamed += l.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
    on_accelerator += l.update == PLACEMENT_ACCELERATOR;
  }
  return absl::StrCat("micro-batch ", s.micro_batch_size, " x ", s.micro_batches(), "; ", offload,
                      " offloaded, ", recompute, " recomputed, ", streamed, " streamed layers");
}

void Adopt(const Decisions& s, const SimulationResult& r, StrategyOutcome* out) {
  out->schedule = s;
  out->schedule.strategy = out->strategy;
  out->simulation = r;
  out->simulated = true;
}

// Simulates the chosen plan once more, recording its timeline (the search
// simulates without). Infeasible plans keep their prediction without one:
// nobody runs them, and at the minimum budget they can have many
// micro-batches.
void Finalize(const StrategyContext& c, StrategyOutcome* out) {
  if (!out->simulated || !out->feasible) return;
  absl::StatusOr<SimulationResult> r = c.simulator->Simulate(out->schedule);
  if (r.ok()) out->simulation = *std::move(r);
}

// Fills the minimum budget and the plan it would run, when the strategy does
// not fit. `fitter` solves the strategy's memory problem at any budget; `fit`
// is what it answered at the budget, if it was asked.
void ResolveInfeasible(const StrategyContext& c, const FitResult& fit, MemoryFitter* fitter,
                       StrategyOutcome* out) {
  out->feasible = false;
  if (fit.plans_evaluated > 0) Adopt(fit.schedule, fit.simulation, out);
  const MemoryFitter::Minimum minimum = fitter->MinimumBudget();
  if (minimum.accelerator_bytes == 0) {
    out->min_accelerator_memory_bytes = 0;
    out->note = absl::StrCat("does not fit any accelerator budget: host memory needs ",
                             FormatBytes(minimum.host_bytes), ", host budget ",
                             FormatBytes(c.host_memory_budget_bytes));
    return;
  }
  out->min_accelerator_memory_bytes = minimum.accelerator_bytes;
  FitResult at_min = fitter->Fit(minimum.accelerator_bytes);
  if (at_min.feasible) Adopt(at_min.schedule, at_min.simulation, out);
  out->note = absl::StrCat("needs ", FormatBytes(minimum.accelerator_bytes),
                           " of accelerator memory (", Describe(out->schedule), "); budget ",
                           FormatBytes(c.accelerator_memory_budget_bytes));
}

StrategyOutcome NoAccelerator(tandem::v1::Strategy strategy, const StrategyContext& c) {
  StrategyOutcome out;
  out.strategy = strategy;
  out.schedule = AcceleratorBase(c, strategy, PLACEMENT_ACCELERATOR);
  out.method = "none";
  out.note = "the cost source has no accelerator";
  return out;
}

// Bytes every plan of `base` holds on the accelerator for the whole step:
// resident weights and accelerator-side optimizer state. A budget below it
// cannot fit, whatever else is decided.
int64_t ResidentBytes(const CostModel& cost, const Decisions& base) {
  int64_t bytes = 0;
  for (int l = 0; l < cost.num_layers(); ++l) {
    if (base.layers[l].parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) {
      bytes += cost.ParameterBytes(l);
    }
    if (base.layers[l].update == PLACEMENT_ACCELERATOR) bytes += cost.OptimizerStateBytes(l);
  }
  return bytes;
}

StrategyOutcome SolveWithMemoryFit(const StrategyContext& c, tandem::v1::Strategy strategy,
                                   const Decisions& base, const MemoryChoices& choices,
                                   bool find_min_budget, bool record_timeline = true) {
  Stopwatch clock;
  StrategyOutcome out;
  out.strategy = strategy;
  out.method = "memory-fit";
  MemoryFitter fitter(*c.simulator, base, choices, c.micro_batch_size, c.host_memory_budget_bytes);
  const bool resident_too_big =
      !choices.stream && ResidentBytes(c.cost(), base) > c.accelerator_memory_budget_bytes;
  if (resident_too_big && !find_min_budget) {
    out.schedule = base;
    out.note =
        absl::StrCat("resident state alone needs ", FormatBytes(ResidentBytes(c.cost(), base)),
                     "; budget ", FormatBytes(c.accelerator_memory_budget_bytes));
    out.solve_seconds = clock.seconds();
    return out;
  }
  // When the resident state alone is over budget no fit can succeed: go
  // straight to the smallest budget that works.
  FitResult fit;
  if (!resident_too_big) fit = fitter.Fit(c.accelerator_memory_budget_bytes);
  if (fit.feasible) {
    out.feasible = true;
    Adopt(fit.schedule, fit.simulation, &out);
    out.note = Describe(fit.schedule);
  } else {
    ResolveInfeasible(c, fit, &fitter, &out);
  }
  out.plans_evaluated = fitter.plans_evaluated();
  if (record_timeline) Finalize(c, &out);
  out.solve_seconds = clock.seconds();
  return out;
}

// reuse_distance when zero_offload does not fit: every layer updating on the
// host is the least accelerator memory this strategy can use, so it fits
// exactly when zero_offload does.
void AsZeroOffload(const StrategyContext& c, const StrategyOutcome& zero_offload,
                   StrategyOutcome* out) {
  out->feasible = false;
  out->schedule = zero_offload.schedule;
  out->schedule.strategy = out->strategy;
  out->simulation = zero_offload.simulation;
  out->simulated = zero_offload.simulated;
  out->min_accelerator_memory_bytes = zero_offload.min_accelerator_memory_bytes;
  out->note = absl::StrCat("as zero_offload: ", zero_offload.note);
  if (out->simulation.timeline.spans().empty()) Finalize(c, out);
}

// A plan competing for reuse_distance.
struct CompetingPlan {
  Decisions schedule;
  SimulationResult simulation;
  // zero_offload's or gpu_only's, not copied.
  const SimulationResult* borrowed = nullptr;
  std::string origin;
  const SimulationResult& result() const { return borrowed ? *borrowed : simulation; }
};

// The reuse_distance search: the plans that compete (zero_offload's, the
// search's per memory configuration, then gpu_only's), the memory
// configurations searched, and how the placements were found. Search results
// are simulated without a timeline; the winner gets one at the end.
struct ReuseSearch {
  std::vector<CompetingPlan> candidates;
  std::vector<Decisions> configs;
  int64_t search_nodes = 0;
  bool simulator_scored = false;
};

constexpr char kStreamedOrigin[] =
    "search over three update places; no branch and bound past 12 movable layers";
constexpr char kStreamedBoundedOrigin[] =
    "search over three update places; its branch and bound stopped short";
constexpr char kStreamedExactOrigin[] = "search over three update places, exact";
// The streamed-state search's simulations cost O(layers) each: it gets
// kStreamLayerEvaluations layer-simulations up to kStreamFullLayers layers
// (200 simulations there), and past that a number falling with the square
// of the layers, so that the solve of a long chain stays within ~10 ms (3
// simulations at 1,000 layers: a spaced start, and a descent step); at least
// kStreamMinEvaluations, at most the search's default.
constexpr int64_t kStreamLayerEvaluations = 20000;
constexpr int64_t kStreamFullLayers = 100;
constexpr int64_t kStreamMinEvaluations = 3;

int64_t StreamEvaluations(int64_t layers, int64_t most) {
  const int64_t l = std::max<int64_t>(1, layers);
  const int64_t squared = kStreamLayerEvaluations * kStreamFullLayers / l / l;
  return std::clamp<int64_t>(std::min(kStreamLayerEvaluations / l, squared), kStreamMinEvaluations,
                             most);
}

// The fastest placement of `config`'s eligible updates within the budget:
// the exact chain search where the chain evaluator covers the configuration.
PlacementSearchResult PlaceUpdates(const StrategyContext& c, const Decisions& config,
                                   const std::vector<bool>& eligible, ReuseSearch* search,
                                   StrategyOutcome* out) {
  PlacementSearchResult found;
  if (ChainEvaluator::Supports(c.cost(), config)) {
    ChainEvaluator evaluator(c.cost(), config);
    found = SearchChainUpdatePlacement(&evaluator, eligible, c.accelerator_memory_budget_bytes);
    search->search_nodes += found.search_nodes;
    out->placement_proven_optimal = out->placement_proven_optimal && found.proven_optimal;
  } else {
    // Offloaded activations or streamed weights share the copy engines
    // with the gradient chain: score with the simulator itself, fewer times.
    PlacementSearchOptions options;
    options.max_evaluations = 400;
    options.max_kick_evaluations = 0;
    found = SearchUpdatePlacement(eligible, c.accelerator_memory_budget_bytes,
                                  SimulatorPlacementScorer(*c.simulator, config), options);
    out->placement_proven_optimal = false;
    search->simulator_scored = true;
  }
  out->plans_evaluated += found.evaluations;
  return found;
}

bool WithinBudgets(const StrategyContext& c, const tandem::v1::PlanPrediction& p) {
  return p.accelerator_peak_bytes() <= c.accelerator_memory_budget_bytes &&
         (c.host_memory_budget_bytes <= 0 || p.host_peak_bytes() <= c.host_memory_budget_bytes);
}

// The third place, state streamed in for an accelerator update, from the
// two-place answer `s` (simulated as `r`): a candidate when it is faster. It
// can only shorten the step by the time the accelerator waits, so it is not
// searched when that is under 1% of it.
// `r` null: no two-place answer fits, and the search starts from `s` (every
// layer on the host) as from an infinitely slow start, so that any placement
// that fits is a candidate: streamed state may fit where no two-place
// placement does.
void AddStreamedCandidate(const StrategyContext& c, const Decisions& s, const SimulationResult* r,
                          ReuseSearch* search, StrategyOutcome* out) {
  if (!c.stream_optimizer_state) return;
  if (r != nullptr &&
      r->prediction.accelerator_idle_seconds() <= 0.01 * r->prediction.iteration_seconds()) {
    return;
  }
  StreamSearchOptions options;
  options.max_evaluations = StreamEvaluations(c.cost().num_layers(), options.max_evaluations);
  StreamSearchResult streamed = SearchStreamedState(
      *c.simulator, s, r != nullptr ? r->prediction.iteration_seconds() : HUGE_VAL,
      c.accelerator_memory_budget_bytes, options);
  out->plans_evaluated += streamed.evaluations;
  if (streamed.improved && WithinBudgets(c, streamed.simulation.prediction)) {
    const char* origin = streamed.exact                   ? kStreamedExactOrigin
                         : streamed.exact_evaluations > 0 ? kStreamedBoundedOrigin
                                                          : kStreamedOrigin;
    search->candidates.push_back(
        {std::move(streamed.decisions), std::move(streamed.simulation), nullptr, origin});
  }
}

// Searches zero_offload's memory configuration and, when host updates still
// stall the accelerator there, the same with half the micro-batch; each
// placement found, simulated, competes with zero_offload's plan.
ReuseSearch SearchConfigurations(const StrategyContext& c, const StrategyOutcome& zero_offload,
                                 StrategyOutcome* out) {
  SimulationOptions quiet;
  quiet.record_timeline = false;
  ReuseSearch search;
  search.candidates.push_back(
      {zero_offload.schedule, {}, &zero_offload.simulation, "no layer gains from the accelerator"});
  search.configs = {zero_offload.schedule};
  const int m = zero_offload.schedule.micro_batch_size;
  out->placement_proven_optimal = true;
  for (size_t config_index = 0; config_index < search.configs.size(); ++config_index) {
    Decisions config = search.configs[config_index];
    config.strategy = out->strategy;
    const std::vector<bool> eligible = UpdateEligibleLayers(c.cost(), config);
    const PlacementSearchResult found = PlaceUpdates(c, config, eligible, &search, out);
    if (!found.feasible) {
      AddStreamedCandidate(
          c,
          WithUpdatePlaces(config, eligible,
                           std::vector<UpdatePlace>(eligible.size(), UpdatePlace::kHost)),
          nullptr, &search, out);
      continue;
    }
    Decisions s = config;
    for (int l = 0; l < c.cost().num_layers(); ++l) {
      if (eligible[l]) {
        s.layers[l].update = found.on_accelerator[l] ? PLACEMENT_ACCELERATOR : PLACEMENT_HOST;
      }
    }
    absl::StatusOr<SimulationResult> r = c.simulator->Simulate(s, quiet);
    ++out->plans_evaluated;
    if (!r.ok() || !WithinBudgets(c, r->prediction)) continue;
    // When host updates still stall the accelerator, the budget stopped the
    // search: try again with half the micro-batch, whose activations leave
    // room for more optimizer state.
    const bool stalled = r->prediction.accelerator_stall_seconds() > 0;
    bool host_updates = false;
    for (int l = 0; l < c.cost().num_layers(); ++l) {
      host_updates |= eligible[l] && !found.on_accelerator[l];
    }
    if (host_updates) AddStreamedCandidate(c, s, &*r, &search, out);
    search.candidates.push_back({s, *std::move(r), nullptr, "search over update placements"});
    if (config_index == 0 && stalled && c.micro_batch_size == 0 && m % 2 == 0 &&
        2 * zero_offload.schedule.micro_batches() <= MaxMicroBatches(c.cost().num_layers())) {
      Decisions half = zero_offload.schedule;
      half.micro_batch_size = m / 2;
      search.configs.push_back(half);
    }
  }
  return search;
}

// Adopts the fastest of `candidates` (the first of equals), with a timeline;
// returns where it came from.
std::string AdoptFastest(const StrategyContext& c, std::vector<CompetingPlan>* candidates,
                         StrategyOutcome* out) {
  size_t best = 0;
  for (size_t i = 1; i < candidates->size(); ++i) {
    if ((*candidates)[i].result().prediction.iteration_seconds() <
        (*candidates)[best].result().prediction.iteration_seconds()) {
      best = i;
    }
  }
  out->feasible = true;
  CompetingPlan& winner = (*candidates)[best];
  out->schedule = std::move(winner.schedule);
  out->schedule.strategy = out->strategy;
  if (winner.borrowed != nullptr) {
    out->simulation = *winner.borrowed;
  } else {
    out->simulation = std::move(winner.simulation);
  }
  out->simulated = true;
  if (out->simulation.timeline.spans().empty()) Finalize(c, out);
  return winner.origin;
}

// "3 of 12 layers with parameters update on the accelerator [0,4,7] (...); ..."
std::string ReuseDistanceNote(const CostModel& cost, const StrategyOutcome& out,
                              const StrategyOutcome& zero_offload, const std::string& origin,
                              const ReuseSearch& search) {
  const int L = cost.num_layers();
  std::vector<int> on_accelerator;
  std::string streamed;
  int streamed_count = 0;
  for (int l = 0; l < L; ++l) {
    if (cost.ParameterBytes(l) > 0 && out.schedule.layers[l].update == PLACEMENT_ACCELERATOR) {
      on_accelerator.push_back(l);
      if (out.schedule.layers[l].stream_state && streamed_count++ < 12) {
        absl::StrAppend(&streamed, streamed.empty() ? "" : ",", l);
      }
    }
  }
  if (streamed_count > 12) absl::StrAppend(&streamed, ",...");
  int with_params = 0;
  for (int l = 0; l < L; ++l) with_params += cost.ParameterBytes(l) > 0;
  std::string which;
  for (size_t i = 0; i < on_accelerator.size() && i < 12; ++i) {
    absl::StrAppend(&which, i ? "," : "", on_accelerator[i]);
  }
  if (on_accelerator.size() > 12) absl::StrAppend(&which, ",...");
  return absl::StrCat(
      on_accelerator.size(), " of ", with_params, " layers with parameters update on the ",
      "accelerator [", which, "]",
      streamed_count > 0
          ? absl::StrCat(", ", streamed_count, " of them with streamed state [", streamed, "]")
          : "",
      " (", origin, "); ", FormatSeconds(out.simulation.prediction.iteration_seconds()),
      " vs zero_offload ", FormatSeconds(zero_offload.simulation.prediction.iteration_seconds()),
      "; ", Describe(out.schedule), "; ",
      origin == kStreamedOrigin || origin == kStreamedBoundedOrigin
          ? "placement by local search over three places"
      : origin == kStreamedExactOrigin
          ? "placement over three places proven optimal for this micro-batch (branch and bound)"
      : out.placement_proven_optimal
          ? absl::StrCat("placement proven optimal (", search.search_nodes, " search nodes)")
      : search.simulator_scored
          ? "placement by local search (offloaded activations or streamed weights: no exact search)"
          : absl::StrCat("placement by local search (exact search stopped after ",
                         search.search_nodes, " nodes)"));
}

// Forward and backward of one pass over `samples` samples on `device`.
double ComputeSeconds(const CostModel& cost, tandem::v1::Placement device, int samples) {
  double t = 0;
  for (int l = 0; l < cost.num_layers(); ++l) {
    t += cost.ForwardSeconds(l, device, samples) + cost.BackwardSeconds(l, device, samples);
  }
  return t;
}

// The accelerator shares of a batch that hetero_dp tries, in order: the
// smallest whose compute is no shorter than the host's on the rest (compute
// times are monotone in samples) and the one below it, the balanced ones;
// then halvings down to 1.
struct AcceleratorShares {
  std::vector<int> shares;
  size_t balanced = 0;
};

AcceleratorShares SharesToTry(const CostModel& cost, int batch_size) {
  const int B = batch_size;
  int lo = 1, hi = B - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (ComputeSeconds(cost, PLACEMENT_ACCELERATOR, mid) >=
        ComputeSeconds(cost, PLACEMENT_HOST, B - mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  std::vector<int> shares = {lo};
  if (lo - 1 >= 1) shares.push_back(lo - 1);
  const size_t balanced = shares.size();
  for (int a = lo / 2; a >= 1; a /= 2) shares.push_back(a);
  if (shares.back() != 1) shares.push_back(1);
  return {std::move(shares), balanced};
}

// One MemoryFitter per accelerator share, made on first use.
class ShareFitters {
 public:
  ShareFitters(const StrategyContext& c, const Decisions& base, const MemoryChoices& choices)
      : c_(c), base_(base), choices_(choices) {}

  MemoryFitter& Of(int share) {
    auto it = fitters_.find(share);
    if (it != fitters_.end()) return it->second;
    Decisions s = base_;
    s.accelerator_batch_share = share;
    const int fixed =
        c_.micro_batch_size > 0 && share % c_.micro_batch_size == 0 ? c_.micro_batch_size : 0;
    return fitters_
        .try_emplace(share, *c_.simulator, s, choices_, fixed, c_.host_memory_budget_bytes)
        .first->second;
  }

  int64_t plans_evaluated() const {
    int64_t total = 0;
    for (const auto& [share, fitter] : fitters_) total += fitter.plans_evaluated();
    return total;
  }

 private:
  const StrategyContext& c_;
  const Decisions& base_;
  MemoryChoices choices_;
  std::map<int, MemoryFitter> fitters_;
};

// Fits each share to the budget, adopting the fastest plan that fits; past
// the balanced shares, stops at the first share that fits. `last` is the
// last share's fit.
bool FitFastestShare(const StrategyContext& c, const AcceleratorShares& shares,
                     ShareFitters* fitters, FitResult* last, StrategyOutcome* out) {
  bool found = false;
  for (size_t i = 0; i < shares.shares.size(); ++i) {
    if (found && i >= shares.balanced) break;
    FitResult fit = fitters->Of(shares.shares[i]).Fit(c.accelerator_memory_budget_bytes);
    *last = fit;
    if (!fit.feasible) continue;
    if (!found || fit.simulation.prediction.iteration_seconds() <
                      out->simulation.prediction.iteration_seconds()) {
      Adopt(fit.schedule, fit.simulation, out);
    }
    found = true;
  }
  return found;
}

// "accelerator takes 40 of 64 samples, host 24; gradient sync spans ..."
std::string SplitNote(int batch_size, const StrategyOutcome& out) {
  double sync = 0;
  for (const tandem::v1::TimelineSpan& span : out.simulation.timeline.spans()) {
    if (span.phase() == tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC) {
      sync += span.end_seconds() - span.start_seconds();
    }
  }
  return absl::StrCat("accelerator takes ", out.schedule.accelerator_batch_share, " of ",
                      batch_size, " samples, host ",
                      batch_size - out.schedule.accelerator_batch_share, "; gradient sync spans ",
                      FormatSeconds(sync), " per step; ", Describe(out.schedule));
}

}  // namespace

std::string StrategyName(tandem::v1::Strategy strategy) {
  switch (strategy) {
    case tandem::v1::STRATEGY_AUTO:
      return "auto";
    case tandem::v1::STRATEGY_GPU_ONLY:
      return "gpu_only";
    case tandem::v1::STRATEGY_CPU_ONLY:
      return "cpu_only";
    case tandem::v1::STRATEGY_ZERO_OFFLOAD:
      return "zero_offload";
    case tandem::v1::STRATEGY_REUSE_DISTANCE:
      return "reuse_distance";
    case tandem::v1::STRATEGY_HETERO_DP:
      return "hetero_dp";
    default:
      return "unspecified";
  }
}

StrategyOutcome SolveGpuOnly(const StrategyContext& c, bool find_min_budget) {
  if (!c.cost().has_accelerator()) return NoAccelerator(tandem::v1::STRATEGY_GPU_ONLY, c);
  MemoryChoices choices;
  choices.recompute = true;
  return SolveWithMemoryFit(
      c, tandem::v1::STRATEGY_GPU_ONLY,
      AcceleratorBase(c, tandem::v1::STRATEGY_GPU_ONLY, PLACEMENT_ACCELERATOR), choices,
      find_min_budget);
}

StrategyOutcome SolveZeroOffload(const StrategyContext& c, bool record_timeline) {
  if (!c.cost().has_accelerator()) return NoAccelerator(tandem::v1::STRATEGY_ZERO_OFFLOAD, c);
  MemoryChoices choices;
  choices.offload = choices.recompute = choices.stream = true;
  return SolveWithMemoryFit(c, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                            AcceleratorBase(c, tandem::v1::STRATEGY_ZERO_OFFLOAD, PLACEMENT_HOST),
                            choices, /*find_min_budget=*/true, record_timeline);
}

StrategyOutcome SolveCpuOnly(const StrategyContext& c) {
  Stopwatch clock;
  StrategyOutcome out;
  out.strategy = tandem::v1::STRATEGY_CPU_ONLY;
  out.method = "fixed";
  Decisions s;
  s.strategy = out.strategy;
  s.layers.resize(c.cost().num_layers());
  for (LayerDecisions& l : s.layers) {
    l.compute = PLACEMENT_HOST;
    l.parameter_home = tandem::v1::PARAMETER_HOME_HOST;
    l.update = PLACEMENT_HOST;
  }
  s.batch_size = c.batch_size;
  s.micro_batch_size = c.micro_batch_size > 0 ? c.micro_batch_size : c.batch_size;
  s.host_update_threads = c.host_update_threads;
  out.schedule = s;
  SimulationOptions quiet;
  quiet.record_timeline = false;
  absl::StatusOr<SimulationResult> r = c.simulator->Simulate(s, quiet);
  out.plans_evaluated = 1;
  if (!r.ok()) {
    out.note = std::string(r.status().message());
  } else {
    Adopt(s, *r, &out);
    const int64_t host = r->prediction.host_peak_bytes();
    out.feasible = c.host_memory_budget_bytes <= 0 || host <= c.host_memory_budget_bytes;
    out.note = out.feasible
                   ? absl::StrCat("host holds ", FormatBytes(host))
                   : absl::StrCat("host memory needs ", FormatBytes(host), ", host budget ",
                                  FormatBytes(c.host_memory_budget_bytes));
  }
  Finalize(c, &out);
  out.solve_seconds = clock.seconds();
  return out;
}

StrategyOutcome SolveReuseDistance(const StrategyContext& c, const StrategyOutcome& zero_offload,
                                   const StrategyOutcome& gpu_only) {
  Stopwatch clock;
  StrategyOutcome out;
  out.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
  out.method = "reuse-distance search";
  if (!c.cost().has_accelerator()) return NoAccelerator(out.strategy, c);
  if (!zero_offload.feasible) {
    AsZeroOffload(c, zero_offload, &out);
    out.solve_seconds = clock.seconds();
    return out;
  }
  ReuseSearch search = SearchConfigurations(c, zero_offload, &out);
  if (gpu_only.feasible) {
    search.candidates.push_back(
        {gpu_only.schedule, {}, &gpu_only.simulation, "every layer fits on the accelerator"});
  }
  const std::string origin = AdoptFastest(c, &search.candidates, &out);
  // The exact two-place search does not cover a streamed winner; the
  // three-place one covers only its own configuration (micro-batch), and
  // runs only where the two-place plan leaves the accelerator waiting.
  if (origin == kStreamedOrigin || origin == kStreamedBoundedOrigin ||
      origin == kStreamedExactOrigin) {
    out.placement_proven_optimal = false;
  }
  out.note = ReuseDistanceNote(c.cost(), out, zero_offload, origin, search);
  out.solve_seconds = clock.seconds();
  return out;
}

StrategyOutcome SolveHeteroDp(const StrategyContext& c) {
  Stopwatch clock;
  StrategyOutcome out;
  out.strategy = tandem::v1::STRATEGY_HETERO_DP;
  out.method = "split search + memory-fit";
  if (!c.cost().has_accelerator()) return NoAccelerator(out.strategy, c);
  Decisions base = AcceleratorBase(c, out.strategy, PLACEMENT_ACCELERATOR);
  if (c.batch_size < 2) {
    out.schedule = base;
    out.note = "a batch of 1 sample cannot be split between two replicas";
    return out;
  }
  AcceleratorShares shares = SharesToTry(c.cost(), c.batch_size);
  MemoryChoices choices;
  choices.recompute = true;
  ShareFitters fitters(c, base, choices);
  // The replica keeps every weight and optimizer state resident: over the
  // budget, no share fits.
  if (ResidentBytes(c.cost(), base) > c.accelerator_memory_budget_bytes) shares.shares.clear();
  FitResult last;
  if (FitFastestShare(c, shares, &fitters, &last, &out)) {
    out.feasible = true;
    Finalize(c, &out);
    out.note = SplitNote(c.batch_size, out);
  } else {
    // The smallest budget is the one-sample share's: every other share needs
    // at least its activations.
    ResolveInfeasible(c, last, &fitters.Of(1), &out);
  }
  out.plans_evaluated += fitters.plans_evaluated();
  out.solve_seconds = clock.seconds();
  return out;
}

tandem::v1::Plan ToPlan(const StrategyContext& c, StrategyOutcome o) {
  const CostModel& cost = c.cost();
  tandem::v1::Plan plan;
  Decisions s = o.schedule;
  s.strategy = o.strategy;
  if (s.layers.empty()) s.layers.resize(cost.num_layers());
  WriteDecisionsToPlan(s, &plan);
  plan.set_accelerator(cost.accelerator_kind());
  const bool host_compute = !s.layers.empty() && s.layers[0].compute == PLACEMENT_HOST;
  for (int l = 0; l < cost.num_layers(); ++l) {
    tandem::v1::LayerPlan* lp = plan.mutable_layers(l);
    lp->set_name(cost.layer_name(l));
    if (o.simulated && l < static_cast<int>(o.simulation.layers.size())) {
      lp->set_reuse_distance_seconds(o.simulation.layers[l].reuse_distance_seconds);
      lp->set_slack_seconds(o.simulation.layers[l].slack_seconds);
    }
    if (host_compute || !cost.has_accelerator()) continue;
    const LayerDecisions& d = s.layers[l];
    const int m = std::max(1, s.micro_batch_size);
    tandem::v1::LayerMemory* mem = lp->mutable_accelerator_memory();
    mem->set_parameter_bytes(cost.ParameterBytes(l));
    mem->set_gradient_bytes(cost.GradientBytes(l));
    mem->set_optimizer_state_bytes(d.update == PLACEMENT_ACCELERATOR ? cost.OptimizerStateBytes(l)
                                                                     : 0);
    mem->set_activation_bytes(cost.ActivationBytes(l, m));
    mem->set_workspace_bytes(cost.WorkspaceBytes(l, m));
    mem->set_output_bytes(cost.OutputBytes(l, m));
  }
  plan.set_accelerator_memory_budget_bytes(c.accelerator_memory_budget_bytes);
  plan.set_host_memory_budget_bytes(c.host_memory_budget_bytes);
  plan.set_feasible(o.feasible);
  plan.set_min_accelerator_memory_bytes(o.feasible ? 0 : o.min_accelerator_memory_bytes);
  if (o.simulated) {
    *plan.mutable_prediction() = std::move(o.simulation.prediction);
    *plan.mutable_timeline() = std::move(o.simulation.timeline);
  }
  tandem::v1::SolverStats* solver = plan.mutable_solver();
  solver->set_solve_seconds(o.solve_seconds);
  solver->set_plans_evaluated(o.plans_evaluated);
  solver->set_method(o.method);
  solver->set_note(o.note);
  return plan;
}

}  // namespace tandem::planner
