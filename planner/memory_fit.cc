#include "planner/memory_fit.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

namespace tandem::planner {
namespace {

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr int64_t kMiB = int64_t{1} << 20;

bool Fits(const SimulationResult& r, const MemoryBudget& budget) {
  return r.prediction.accelerator_peak_bytes() <= budget.accelerator_bytes &&
         (budget.host_bytes <= 0 || r.prediction.host_peak_bytes() <= budget.host_bytes);
}

Schedule Apply(Schedule s, const std::vector<MemoryAction>& actions, int count) {
  for (int i = 0; i < count; ++i) {
    const MemoryAction& a = actions[i];
    LayerSchedule& l = s.layers[a.layer];
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

}  // namespace

std::vector<MemoryAction> RankMemoryActions(const CostModel& cost, const Schedule& s,
                                            const MemoryChoices& choices) {
  const int L = static_cast<int>(s.layers.size());
  const int m = s.micro_batch_size;
  const double M = s.micro_batches();
  const auto d2h = tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST;
  const auto h2d = tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE;
  std::vector<double> fwd(L), bwd(L);
  double compute = 0, chain_copies = 0;
  for (int l = 0; l < L; ++l) {
    fwd[l] = cost.ForwardSeconds(l, kAcc, m);
    bwd[l] = cost.BackwardSeconds(l, kAcc, m);
    compute += fwd[l] + bwd[l];
    if (s.layers[l].update != kAcc && cost.ParameterBytes(l) > 0) {
      chain_copies += std::max(cost.CopySeconds(d2h, cost.GradientBytes(l)),
                               cost.CopySeconds(h2d, cost.ParameterBytes(l)));
    }
  }
  // Compute between layer l's forward and its backward: layers after it.
  std::vector<double> after(L + 1, 0.0);
  for (int l = L - 1; l >= 0; --l) after[l] = after[l + 1] + fwd[l] + bwd[l];
  // Each copy engine has one micro-batch's compute to hide copies behind,
  // less the gradient and weight copies the step already puts on it. Copies
  // past that are paid in full: offloads and streams are charged in the
  // order they hide best (earliest layers first, then largest weights).
  double link_left = std::max(0.0, compute - chain_copies / M);
  std::vector<double> offload_lost(L, -1.0);
  if (choices.offload) {
    for (int l = 0; l < L; ++l) {
      const int64_t act = cost.ActivationBytes(l, m);
      if (act <= 0) continue;
      const double out = cost.CopySeconds(d2h, act), in = cost.CopySeconds(h2d, act);
      // The copy out overlaps everything after the layer; the copy back is
      // issued one layer ahead, so only the next layer's backward hides it.
      const double hidden_out = after[l + 1];
      const double hidden_in = l + 1 < L ? bwd[l + 1] : 0.0;
      link_left -= std::max(out, in);
      offload_lost[l] = link_left >= 0
                            ? M * (std::max(0.0, out - hidden_out) + std::max(0.0, in - hidden_in))
                            : M * (out + in);
    }
  }

  std::vector<MemoryAction> actions;
  for (int l = 0; l < L; ++l) {
    const int64_t act = cost.ActivationBytes(l, m);
    const int64_t ckpt = l == 0 ? 0 : std::min(act, cost.OutputBytes(l - 1, m));
    std::vector<MemoryAction> options;
    if (choices.recompute && act - ckpt > 0) {
      options.push_back({l, MemoryAction::kRecompute, static_cast<double>(act - ckpt), M * fwd[l]});
    }
    if (offload_lost[l] >= 0) {
      options.push_back({l, MemoryAction::kOffload, static_cast<double>(act), offload_lost[l]});
    }
    if (options.empty()) continue;
    std::sort(options.begin(), options.end(), [](const MemoryAction& x, const MemoryAction& y) {
      return Ratio(x) != Ratio(y) ? Ratio(x) > Ratio(y) : x.bytes_saved > y.bytes_saved;
    });
    actions.push_back(options[0]);
  }
  if (choices.stream) {
    std::vector<int> by_size;
    for (int l = 0; l < L; ++l) {
      const LayerSchedule& d = s.layers[l];
      if (cost.ParameterBytes(l) > 0 && d.update != kAcc &&
          d.parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) {
        by_size.push_back(l);
      }
    }
    std::stable_sort(by_size.begin(), by_size.end(),
                     [&](int x, int y) { return cost.ParameterBytes(x) > cost.ParameterBytes(y); });
    for (int l : by_size) {
      const double copy = cost.CopySeconds(h2d, cost.ParameterBytes(l));
      const double before_forward = l > 0 ? fwd[l - 1] : 0.0;
      const double before_backward = l + 1 < L ? bwd[l + 1] : fwd[l];
      link_left -= 2 * copy;
      const double lost =
          link_left >= 0
              ? M * (std::max(0.0, copy - before_forward) + std::max(0.0, copy - before_backward))
              : M * 2 * copy;
      actions.push_back(
          {l, MemoryAction::kStream, static_cast<double>(cost.ParameterBytes(l)), lost});
    }
  }
  std::stable_sort(actions.begin(), actions.end(),
                   [](const MemoryAction& a, const MemoryAction& b) {
                     if (Ratio(a) != Ratio(b)) return Ratio(a) > Ratio(b);
                     return a.bytes_saved > b.bytes_saved;
                   });
  return actions;
}

std::vector<int> MicroBatchSizes(int samples, int fixed) {
  if (fixed > 0) {
    if (samples % fixed == 0) return {fixed};
    return {};
  }
  std::vector<int> sizes;
  for (int d = samples; d >= 1; --d) {
    if (samples % d != 0) continue;
    if (sizes.empty() || 2 * d <= sizes.back()) sizes.push_back(d);
  }
  if (sizes.back() != 1) sizes.push_back(1);
  return sizes;
}

FitResult FitToBudget(const PlanSimulator& simulator, const Schedule& base,
                      const MemoryBudget& budget, const MemoryChoices& choices,
                      int fixed_micro_batch_size) {
  const CostModel& cost = simulator.cost();
  FitResult result;
  result.smallest_peak_bytes = std::numeric_limits<int64_t>::max();
  SimulationOptions quiet;
  quiet.record_timeline = false;
  bool have_best = false;
  auto simulate = [&](const Schedule& s) {
    ++result.plans_evaluated;
    absl::StatusOr<SimulationResult> r = simulator.Simulate(s, quiet);
    if (!r.ok()) return std::pair<bool, SimulationResult>{false, SimulationResult{}};
    const int64_t peak = r->prediction.accelerator_peak_bytes();
    if (peak < result.smallest_peak_bytes) {
      result.smallest_peak_bytes = peak;
      if (!have_best) result.schedule = s, result.simulation = *r;
    }
    return std::pair<bool, SimulationResult>{true, *std::move(r)};
  };
  auto record = [&](const Schedule& s, const SimulationResult& r) {
    if (!have_best ||
        r.prediction.iteration_seconds() < result.simulation.prediction.iteration_seconds()) {
      result.schedule = s;
      result.simulation = r;
    }
    have_best = true;
  };

  for (int m : MicroBatchSizes(base.replica_samples(), fixed_micro_batch_size)) {
    Schedule s = base;
    s.micro_batch_size = m;
    // Compute alone bounds the iteration from below; smaller micro-batches
    // only raise it.
    double compute = 0;
    for (int l = 0; l < cost.num_layers(); ++l) {
      compute += cost.ForwardSeconds(l, kAcc, m) + cost.BackwardSeconds(l, kAcc, m);
    }
    compute *= s.micro_batches();
    if (have_best && result.simulation.prediction.iteration_seconds() <= compute) break;

    auto [ok, none] = simulate(s);
    if (ok && Fits(none, budget)) {
      record(s, none);
      break;
    }
    const std::vector<MemoryAction> actions = RankMemoryActions(cost, s, choices);
    const int n = static_cast<int>(actions.size());
    if (n == 0) continue;
    auto [all_ok, all] = simulate(Apply(s, actions, n));
    if (!all_ok || !Fits(all, budget)) continue;
    int lo = 0, hi = n;
    SimulationResult at_hi = all;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      auto [mid_ok, r] = simulate(Apply(s, actions, mid));
      if (mid_ok && Fits(r, budget)) {
        hi = mid;
        at_hi = std::move(r);
      } else {
        lo = mid;
      }
    }
    record(Apply(s, actions, hi), at_hi);
  }
  result.feasible = have_best;
  if (result.smallest_peak_bytes == std::numeric_limits<int64_t>::max()) {
    result.smallest_peak_bytes = 0;
  }
  return result;
}

int64_t SmallestPeakGuess(const PlanSimulator& simulator, const Schedule& base,
                          const MemoryChoices& choices, int fixed_micro_batch_size) {
  const std::vector<int> sizes = MicroBatchSizes(base.replica_samples(), fixed_micro_batch_size);
  if (sizes.empty()) return 0;
  Schedule s = base;
  s.micro_batch_size = sizes.back();
  const std::vector<MemoryAction> actions = RankMemoryActions(simulator.cost(), s, choices);
  SimulationOptions quiet;
  quiet.record_timeline = false;
  absl::StatusOr<SimulationResult> r =
      simulator.Simulate(Apply(s, actions, static_cast<int>(actions.size())), quiet);
  return r.ok() ? r->prediction.accelerator_peak_bytes() : 0;
}

int64_t MinimumFeasibleBudget(const std::function<bool(int64_t)>& feasible,
                              int64_t infeasible_bytes, int64_t guess_bytes) {
  constexpr int64_t kLimit = int64_t{1} << 52;
  int64_t lo = std::max<int64_t>(0, infeasible_bytes);
  int64_t hi = std::max(guess_bytes, lo + kMiB);
  while (!feasible(hi)) {
    lo = hi;
    if (hi >= kLimit) return 0;
    hi = std::min(kLimit, 2 * hi);
  }
  // The usual case: the guess is the answer.
  if (hi - kMiB > lo && !feasible(hi - kMiB)) return hi;
  while (hi - lo > kMiB) {
    const int64_t mid = lo + (hi - lo) / 2;
    (feasible(mid) ? hi : lo) = mid;
  }
  // Bisection assumed feasibility grows with the budget; make sure one MiB
  // less really fails.
  for (int i = 0; i < 64 && hi > kMiB && feasible(hi - kMiB); ++i) hi -= kMiB;
  return hi;
}

}  // namespace tandem::planner
