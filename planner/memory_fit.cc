#include "planner/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::planner {
namespace {

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;

bool Fits(const SimulationResult& r, const MemoryBudget& budget) {
  return r.prediction.accelerator_peak_bytes() <= budget.accelerator_bytes &&
         (budget.host_bytes <= 0 || r.prediction.host_peak_bytes() <= budget.host_bytes);
}

Decisions Apply(Decisions s, const std::vector<MemoryAction>& actions, int count) {
  for (int i = 0; i < count; ++i) {
    const MemoryAction& a = actions[i];
    LayerDecisions& l = s.layers[a.layer];
    switch (a.kind) {
      case MemoryAction::kOffload:
        l.activation = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
        break;
      case MemoryAction::kRecompute:
        l.activation = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
        break;
      case MemoryAction::kStream:
        l.parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
        break;
    }
  }
  return s;
}

double Ratio(const MemoryAction& a) {
  return a.seconds_lost > 0 ? a.bytes_saved / a.seconds_lost
                            : std::numeric_limits<double>::infinity();
}

// The ranking's order: more bytes saved per second lost, then more bytes.
bool SavesMorePerSecond(const MemoryAction& a, const MemoryAction& b) {
  if (Ratio(a) != Ratio(b)) return Ratio(a) > Ratio(b);
  return a.bytes_saved > b.bytes_saved;
}

constexpr tandem::v1::LinkDirection kD2h = tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST;
constexpr tandem::v1::LinkDirection kH2d = tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE;

// One micro-batch of the schedule on the accelerator, as the savings are
// priced against it.
struct MicroBatchTimes {
  int layers = 0;
  int micro_batch_size = 0;
  double micro_batches = 0;
  std::vector<double> fwd, bwd;
  // Compute between layer l's forward and its backward: layers after it.
  std::vector<double> after;
  // Each copy engine has one micro-batch's compute to hide copies behind,
  // less the gradient and weight copies the step already puts on it. Copies
  // past that are paid in full: offloads and streams are charged in the
  // order they hide best (earliest layers first, then largest weights).
  double link_left = 0;
};

MicroBatchTimes TimeMicroBatch(const CostModel& cost, const Decisions& s) {
  MicroBatchTimes t;
  const int L = static_cast<int>(s.layers.size());
  t.layers = L;
  t.micro_batch_size = s.micro_batch_size;
  t.micro_batches = s.micro_batches();
  t.fwd.resize(L);
  t.bwd.resize(L);
  double compute = 0, chain_copies = 0;
  for (int l = 0; l < L; ++l) {
    t.fwd[l] = cost.ForwardSeconds(l, kAcc, t.micro_batch_size);
    t.bwd[l] = cost.BackwardSeconds(l, kAcc, t.micro_batch_size);
    compute += t.fwd[l] + t.bwd[l];
    if (s.layers[l].update != kAcc && cost.ParameterBytes(l) > 0) {
      chain_copies += std::max(cost.CopySeconds(kD2h, cost.GradientBytes(l)),
                               cost.CopySeconds(kH2d, cost.ParameterBytes(l)));
    }
  }
  t.after.assign(L + 1, 0.0);
  for (int l = L - 1; l >= 0; --l) t.after[l] = t.after[l + 1] + t.fwd[l] + t.bwd[l];
  t.link_left = std::max(0.0, compute - chain_copies / t.micro_batches);
  return t;
}

// The seconds offloading each layer's activations loses (-1 where it has
// none), the copies charged against t->link_left in layer order.
std::vector<double> OffloadSeconds(const CostModel& cost, MicroBatchTimes* t) {
  const int L = t->layers;
  const double M = t->micro_batches;
  std::vector<double> lost(L, -1.0);
  for (int l = 0; l < L; ++l) {
    const int64_t act = cost.ActivationBytes(l, t->micro_batch_size);
    if (act <= 0) continue;
    const double out = cost.CopySeconds(kD2h, act), in = cost.CopySeconds(kH2d, act);
    // The copy out overlaps everything after the layer; the copy back is
    // issued one layer ahead, so only the next layer's backward hides it.
    const double hidden_out = t->after[l + 1];
    const double hidden_in = l + 1 < L ? t->bwd[l + 1] : 0.0;
    t->link_left -= std::max(out, in);
    lost[l] = t->link_left >= 0
                  ? M * (std::max(0.0, out - hidden_out) + std::max(0.0, in - hidden_in))
                  : M * (out + in);
  }
  return lost;
}

// Per layer, the better of recomputing and offloading its activations.
std::vector<MemoryAction> ActivationActions(const CostModel& cost, const MicroBatchTimes& t,
                                            bool recompute,
                                            const std::vector<double>& offload_lost) {
  const int m = t.micro_batch_size;
  std::vector<MemoryAction> actions;
  for (int l = 0; l < t.layers; ++l) {
    const int64_t act = cost.ActivationBytes(l, m);
    const int64_t ckpt = l == 0 ? 0 : std::min(act, cost.OutputBytes(l - 1, m));
    std::vector<MemoryAction> options;
    if (recompute && act - ckpt > 0) {
      options.push_back({l, MemoryAction::kRecompute, static_cast<double>(act - ckpt),
                         t.micro_batches * t.fwd[l]});
    }
    if (offload_lost[l] >= 0) {
      options.push_back({l, MemoryAction::kOffload, static_cast<double>(act), offload_lost[l]});
    }
    if (options.empty()) continue;
    std::sort(options.begin(), options.end(), SavesMorePerSecond);
    actions.push_back(options[0]);
  }
  return actions;
}

// Streaming the weights of the resident layers updated on the host, largest
// first, their copies charged against the link time offloads left over.
void AddStreamActions(const CostModel& cost, const Decisions& s, MicroBatchTimes* t,
                      std::vector<MemoryAction>* actions) {
  const int L = t->layers;
  const double M = t->micro_batches;
  std::vector<int> by_size;
  for (int l = 0; l < L; ++l) {
    const LayerDecisions& d = s.layers[l];
    if (cost.ParameterBytes(l) > 0 && d.update != kAcc &&
        d.parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) {
      by_size.push_back(l);
    }
  }
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](int x, int y) { return cost.ParameterBytes(x) > cost.ParameterBytes(y); });
  for (int l : by_size) {
    const double copy = cost.CopySeconds(kH2d, cost.ParameterBytes(l));
    const double before_forward = l > 0 ? t->fwd[l - 1] : 0.0;
    const double before_backward = l + 1 < L ? t->bwd[l + 1] : t->fwd[l];
    t->link_left -= 2 * copy;
    const double lost =
        t->link_left >= 0
            ? M * (std::max(0.0, copy - before_forward) + std::max(0.0, copy - before_backward))
            : M * 2 * copy;
    actions->push_back(
        {l, MemoryAction::kStream, static_cast<double>(cost.ParameterBytes(l)), lost});
  }
}

}  // namespace

std::vector<MemoryAction> RankMemoryActions(const CostModel& cost, const Decisions& s,
                                            const MemoryChoices& choices) {
  MicroBatchTimes times = TimeMicroBatch(cost, s);
  std::vector<double> offload_lost(times.layers, -1.0);
  if (choices.offload) offload_lost = OffloadSeconds(cost, &times);
  std::vector<MemoryAction> actions =
      ActivationActions(cost, times, choices.recompute, offload_lost);
  if (choices.stream) AddStreamActions(cost, s, &times, &actions);
  std::stable_sort(actions.begin(), actions.end(), SavesMorePerSecond);
  return actions;
}

int MaxMicroBatches(int layers) {
  const int64_t by_calls = kMaxLayerCallsPerStep / std::max(1, layers);
  return static_cast<int>(std::clamp<int64_t>(by_calls, 1, kMaxMicroBatchesPerStep));
}

int SmallestMicroBatch(int samples, int layers) {
  const int max_micro_batches = MaxMicroBatches(layers);
  return (samples + max_micro_batches - 1) / max_micro_batches;
}

absl::Status CheckMicroBatchBound(int samples, int micro_batch_size, int layers) {
  const int max_micro_batches = MaxMicroBatches(layers);
  if (micro_batch_size <= 0 || samples / micro_batch_size <= max_micro_batches) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      micro_batch_size, " makes ", samples / micro_batch_size, " micro-batches of ", layers,
      " layers per step; the planner simulates at most ", max_micro_batches, " for this model (",
      kMaxLayerCallsPerStep, " layer calls per step, at most ", kMaxMicroBatchesPerStep,
      " micro-batches): use a micro-batch of at least ", SmallestMicroBatch(samples, layers)));
}

std::vector<int> MicroBatchSizes(int samples, int fixed, int max_micro_batches) {
  const int smallest = (samples + max_micro_batches - 1) / std::max(1, max_micro_batches);
  if (fixed > 0) {
    if (samples % fixed == 0 && fixed >= smallest) return {fixed};
    return {};
  }
  // Divisors from the number of micro-batches up: O(max_micro_batches).
  std::vector<int> sizes;
  int last_divisor = samples;
  for (int k = 1; k <= max_micro_batches && k <= samples; ++k) {
    if (samples % k != 0) continue;
    const int d = samples / k;
    last_divisor = d;
    if (sizes.empty() || 2 * d <= sizes.back()) sizes.push_back(d);
  }
  if (sizes.back() != last_divisor) sizes.push_back(last_divisor);
  return sizes;
}

MemoryFitter::MemoryFitter(const PlanSimulator& simulator, const Decisions& base,
                           const MemoryChoices& choices, int fixed_micro_batch_size,
                           int64_t host_memory_budget_bytes)
    : simulator_(simulator),
      base_(base),
      choices_(choices),
      host_memory_budget_bytes_(host_memory_budget_bytes) {
  const int max_micro_batches = MaxMicroBatches(static_cast<int>(base.layers.size()));
  for (int m : MicroBatchSizes(base.replica_samples(), fixed_micro_batch_size, max_micro_batches)) {
    sizes_.emplace_back();
    sizes_.back().micro_batch_size = m;
  }
}

const std::vector<MemoryAction>& MemoryFitter::Actions(Size* size) {
  if (!size->ranked) {
    Decisions s = base_;
    s.micro_batch_size = size->micro_batch_size;
    size->actions = RankMemoryActions(simulator_.cost(), s, choices_);
    size->ranked = true;
  }
  return size->actions;
}

Decisions MemoryFitter::PlanAt(const Size& size, int actions) const {
  Decisions s = base_;
  s.micro_batch_size = size.micro_batch_size;
  return Apply(std::move(s), size.actions, actions);
}

const MemoryFitter::Candidate& MemoryFitter::Simulated(Size* size, int actions) {
  Candidate& c = size->plans[actions];
  if (c.simulated) return c;
  SimulationOptions quiet;
  quiet.record_timeline = false;
  absl::StatusOr<SimulationResult> r = simulator_.Simulate(PlanAt(*size, actions), quiet);
  ++plans_evaluated_;
  c.simulated = true;
  c.ok = r.ok();
  if (c.ok) c.simulation = *std::move(r);
  return c;
}

bool MemoryFitter::HostFits(const SimulationResult& r) const {
  return host_memory_budget_bytes_ <= 0 ||
         r.prediction.host_peak_bytes() <= host_memory_budget_bytes_;
}

FitResult MemoryFitter::Fit(int64_t accelerator_bytes) {
  const CostModel& cost = simulator_.cost();
  const MemoryBudget budget = {accelerator_bytes, host_memory_budget_bytes_};
  const int64_t evaluated_before = plans_evaluated_;
  FitResult result;
  int64_t smallest_peak = std::numeric_limits<int64_t>::max();
  bool have_best = false;
  // Every plan simulated for this budget passes here: the smallest peak is
  // the answer when nothing fits.
  auto consider = [&](Size* size, int actions) -> const Candidate& {
    const Candidate& c = Simulated(size, actions);
    if (c.ok && !have_best && c.simulation.prediction.accelerator_peak_bytes() < smallest_peak) {
      smallest_peak = c.simulation.prediction.accelerator_peak_bytes();
      result.schedule = PlanAt(*size, actions);
      result.simulation = c.simulation;
    }
    return c;
  };
  auto record = [&](const Size& size, int actions, const SimulationResult& r) {
    if (!have_best ||
        r.prediction.iteration_seconds() < result.simulation.prediction.iteration_seconds()) {
      result.schedule = PlanAt(size, actions);
      result.simulation = r;
    }
    have_best = true;
  };

  for (Size& size : sizes_) {
    const int m = size.micro_batch_size;
    // Compute alone bounds the iteration from below; smaller micro-batches
    // only raise it.
    double compute = 0;
    for (int l = 0; l < cost.num_layers(); ++l) {
      compute += cost.ForwardSeconds(l, kAcc, m) + cost.BackwardSeconds(l, kAcc, m);
    }
    const int micro_batches = base_.replica_samples() / m;
    compute *= micro_batches;
    if (have_best && result.simulation.prediction.iteration_seconds() <= compute) break;

    const Candidate& none = consider(&size, 0);
    if (none.ok && Fits(none.simulation, budget)) {
      record(size, 0, none.simulation);
      break;
    }
    const int n = static_cast<int>(Actions(&size).size());
    if (n == 0) continue;
    const Candidate& all = consider(&size, n);
    if (!all.ok || !Fits(all.simulation, budget)) continue;
    int lo = 0, hi = n;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      const Candidate& c = consider(&size, mid);
      if (c.ok && Fits(c.simulation, budget)) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
    record(size, hi, size.plans[hi].simulation);
  }
  result.feasible = have_best;
  result.plans_evaluated = plans_evaluated_ - evaluated_before;
  return result;
}

MemoryFitter::Minimum MemoryFitter::MinimumBudget() {
  Minimum minimum;
  int64_t least_host = std::numeric_limits<int64_t>::max();
  for (Size& size : sizes_) {
    const int n = static_cast<int>(Actions(&size).size());
    for (int actions : {0, n}) {
      if (actions == n && n == 0) continue;
      const Candidate& c = Simulated(&size, actions);
      if (!c.ok) continue;
      const tandem::v1::PlanPrediction& p = c.simulation.prediction;
      least_host = std::min(least_host, p.host_peak_bytes());
      if (!HostFits(c.simulation)) continue;
      if (minimum.accelerator_bytes == 0 ||
          p.accelerator_peak_bytes() < minimum.accelerator_bytes) {
        minimum.accelerator_bytes = std::max<int64_t>(1, p.accelerator_peak_bytes());
      }
    }
  }
  minimum.host_bytes = least_host == std::numeric_limits<int64_t>::max() ? 0 : least_host;
  return minimum;
}

FitResult FitToBudget(const PlanSimulator& simulator, const Decisions& base,
                      const MemoryBudget& budget, const MemoryChoices& choices,
                      int fixed_micro_batch_size) {
  return MemoryFitter(simulator, base, choices, fixed_micro_batch_size, budget.host_bytes)
      .Fit(budget.accelerator_bytes);
}

}  // namespace tandem::planner
