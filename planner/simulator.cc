#include "planner/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "planner/hetero_replicas.h"
#include "planner/resident_chain.h"
#include "planner/steady_state.h"
#include "schedule/lower.h"
#include "schedule/simulate.h"
#include "spec/precision.h"

namespace tandem::planner {
namespace {

using tandem::v1::Placement;
using tandem::v1::TimelineResource;

constexpr Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr Placement kHost = tandem::v1::PLACEMENT_HOST;

using schedule::Mode;
using schedule::Op;
using schedule::OpKind;

// Per-layer durations at the decisions' sample counts, and the bytes the
// schedule accounts.
struct LayerNumbers {
  double fwd = 0, bwd = 0, upd_acc = 0, upd_host = 0;
  double grad_d2h = 0, grad_h2d = 0, param_h2d = 0, act_d2h = 0, act_h2d = 0;
  double state_h2d = 0, state_d2h = 0;
  double host_fwd = 0, host_bwd = 0, average = 0;
  schedule::LayerSizes sizes;
};

std::vector<LayerNumbers> Numbers(const CostModel& cost, const Decisions& s, Mode mode) {
  const int L = static_cast<int>(s.layers.size());
  const bool host_layers = mode == Mode::kHost;
  const int m = s.micro_batch_size;
  const int host_samples =
      mode == Mode::kHetero ? s.batch_size - s.accelerator_batch_share : (host_layers ? m : 0);
  std::vector<LayerNumbers> numbers(L);
  for (int l = 0; l < L; ++l) {
    LayerNumbers& n = numbers[l];
    schedule::LayerSizes& z = n.sizes;
    z.parameters = cost.ParameterBytes(l);
    z.gradients = cost.GradientBytes(l);
    z.optimizer_state = cost.OptimizerStateBytes(l);
    z.update = cost.UpdateBytes(l);
    n.upd_host = cost.UpdateSeconds(l, kHost, s.host_update_threads);
    if (!host_layers) {
      n.fwd = cost.ForwardSeconds(l, kAcc, m);
      n.bwd = cost.BackwardSeconds(l, kAcc, m);
      n.upd_acc = cost.UpdateSeconds(l, kAcc, s.host_update_threads);
      n.grad_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, z.gradients);
      n.grad_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, z.gradients);
      n.param_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, z.parameters);
      n.state_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, z.optimizer_state);
      n.state_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, z.optimizer_state);
      // A streamed update of a bf16 gradient widens it to fp32 first.
      z.update_staging = IsMixed(cost.precision()) ? 2 * z.gradients : 0;
      z.activations = cost.ActivationBytes(l, m);
      z.workspace = cost.WorkspaceBytes(l, m);
      z.checkpoint = l == 0 ? 0 : std::min(z.activations, cost.OutputBytes(l - 1, m));
      n.act_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, z.activations);
      n.act_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, z.activations);
    }
    if (host_samples > 0) {
      n.host_fwd = cost.ForwardSeconds(l, kHost, host_samples);
      n.host_bwd = cost.BackwardSeconds(l, kHost, host_samples);
      z.host_activations = cost.ActivationBytes(l, host_samples);
      z.host_workspace = cost.WorkspaceBytes(l, host_samples);
      z.host_checkpoint =
          l == 0 ? 0 : std::min(z.host_activations, cost.OutputBytes(l - 1, host_samples));
    }
    n.average = cost.GradientAverageSeconds(l, s.host_update_threads);
  }
  return numbers;
}

// How long `op` takes under the cost model (and, for a rank's collectives
// and partitioned updates, `options`).
double OpSeconds(const schedule::Schedule& schedule, const Op& op, const LayerNumbers& n,
                 const SimulationOptions& options) {
  const bool host = op.replica == schedule::kHostReplica;
  switch (op.kind) {
    case OpKind::kForward:
    case OpKind::kRecompute:
      return host ? n.host_fwd : n.fwd;
    case OpKind::kBackward:
      return host ? n.host_bwd : n.bwd;
    case OpKind::kUpdate:
      if (!host) return n.upd_acc;
      // A partitioned rank steps its piece of the layer.
      return options.partition_host_state && options.ranks > 1 ? n.upd_host / options.ranks
                                                               : n.upd_host;
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      return options.collective_seconds(op.kind, op.bytes);
    case OpKind::kGradientAverage:
      return n.average;
    case OpKind::kGradientNorm:
      // One read of every gradient (CostModel::clips_gradients), not timed.
      return 0;
    default:
      break;
  }
  const bool down = schedule.resources[op.resource].kind != tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
  switch (op.tensor) {
    case schedule::TensorKind::kWeights:
      return n.param_h2d;
    case schedule::TensorKind::kActivation:
      return down ? n.act_d2h : n.act_h2d;
    case schedule::TensorKind::kOptimizerState:
      return down ? n.state_d2h : n.state_h2d;
    default:
      return down ? n.grad_d2h : n.grad_h2d;
  }
}

// Reuse distance and slack of every layer in the reported iteration
// (simulator.h). `place` is each operation's position in its resource's order.
std::vector<LayerTiming> LayerTimings(const Decisions& s, const schedule::Schedule& sched,
                                      const schedule::Timing& run,
                                      const std::vector<double>& seconds,
                                      const std::vector<LayerNumbers>& numbers,
                                      const std::vector<int>& place, double period) {
  const int k = run.iterations - 2;
  const int iterations = run.iterations;
  std::vector<LayerTiming> out;
  // Prefix sums of the layer-computing program's durations, iteration by iteration.
  const std::vector<int>& program = sched.order[sched.program_resource];
  const int plen = static_cast<int>(program.size());
  std::vector<double> prefix = {0.0};
  for (int i = 0; i < iterations; ++i) {
    for (int o : program) prefix.push_back(prefix.back() + seconds[o]);
  }
  auto program_pos = [&](int i, int o) { return i * plen + place[o]; };
  const int L = static_cast<int>(s.layers.size());
  const Mode mode = sched.mode;
  out.resize(L);
  for (int l = 0; l < L; ++l) {
    const schedule::LayerMarks& marks = sched.layers[l];
    if (marks.reuse_start < 0 || marks.first_forward < 0) continue;
    LayerTiming& timing = out[l];
    timing.reuse_distance_seconds = prefix[program_pos(k + 1, marks.first_forward)] -
                                    prefix[program_pos(k, marks.reuse_start) + 1];
    if (mode == Mode::kHetero || !numbers[l].sizes.has_parameters()) continue;
    if (mode == Mode::kAccelerator && s.layers[l].update != kHost) continue;
    double delivered = 0;
    if (marks.weights_return >= 0) {
      delivered = run.end[run.Index(k, marks.weights_return)];
    } else {
      delivered = run.end[run.Index(k, marks.host_update)] +
                  (mode == Mode::kHost ? 0.0 : numbers[l].param_h2d);
    }
    const double deadline =
        timing.reuse_distance_seconds +
        (mode == Mode::kAccelerator && s.delayed_parameter_update ? period : 0.0);
    timing.slack_seconds = deadline - (delivered - run.end[run.Index(k, marks.reuse_start)]);
  }
  return out;
}

// The spans of iteration `k`, relative to its start `t0`.
void WriteSpans(const schedule::Schedule& sched, const schedule::Timing& run, int k, double t0,
                double period, tandem::v1::Timeline* timeline) {
  timeline->set_iteration_seconds(period);
  timeline->set_source("simulated");
  for (int o = 0; o < sched.num_ops(); ++o) {
    const Op& op = sched.ops[o];
    const int x = run.Index(k, o);
    tandem::v1::TimelineSpan* out = timeline->add_spans();
    out->set_resource(sched.resources[op.resource].kind);
    out->set_lane(0);
    out->set_layer(op.layer);
    out->set_phase(op.phase);
    out->set_start_seconds(run.start[x] - t0);
    out->set_end_seconds(run.end[x] - t0);
    out->set_bytes(op.bytes);
    out->set_micro_batch(op.micro_batch);
  }
}

// Each operation's place in its resource's order.
std::vector<int> Places(const schedule::Schedule& sched) {
  std::vector<int> place(sched.num_ops(), -1);
  for (const std::vector<int>& order : sched.order) {
    for (size_t t = 0; t < order.size(); ++t) place[order[t]] = static_cast<int>(t);
  }
  return place;
}

// The reported window [t0, t1 = t0 + period) of a run: its iteration k.
struct Window {
  int k;
  double t0, period, t1;
};

// Each resource's idle time in the window, the bytes the reported iteration
// copies each way, and the accelerator's stall on host updates.
void SetResourceFigures(const schedule::Schedule& sched, const schedule::Timing& run,
                        const Window& w, const std::vector<int>& place,
                        tandem::v1::PlanPrediction* p) {
  const int per = sched.num_ops();
  const int acc = sched.ResourceOf(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE);
  // The operation before `x` (unrolled) on its resource, -1 for the first.
  auto previous = [&](int x) {
    const int i = x / per, o = x % per;
    const std::vector<int>& order = sched.order[sched.ops[o].resource];
    if (place[o] > 0) return run.Index(i, order[place[o] - 1]);
    return i > 0 ? run.Index(i - 1, order.back()) : -1;
  };
  // Busy seconds by resource kind (TimelineResource values are small).
  std::vector<double> busy(tandem::v1::TimelineResource_ARRAYSIZE, 0.0);
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  double stall = 0;
  // Each operation's resource kind, looked up once rather than per iteration.
  std::vector<TimelineResource> kinds(per);
  for (int o = 0; o < per; ++o) kinds[o] = sched.resources[sched.ops[o].resource].kind;
  for (int i = 0, x = 0; i < run.iterations; ++i) {
    for (int o = 0; o < per; ++o, ++x) {
      const double a = std::max(run.start[x], w.t0), b = std::min(run.end[x], w.t1);
      if (b > a) busy[kinds[o]] += b - a;
    }
  }
  for (int o = 0; o < per; ++o) {
    const Op& op = sched.ops[o];
    const int x = run.Index(w.k, o);
    if (kinds[o] == tandem::v1::TIMELINE_RESOURCE_COPY_H2D) h2d_bytes += op.bytes;
    if (kinds[o] == tandem::v1::TIMELINE_RESOURCE_COPY_D2H) d2h_bytes += op.bytes;
    if (op.resource == acc && run.binding[x] >= 0 &&
        sched.ops[run.binding[x] % per].delivers_update) {
      const int prev = previous(x);
      const double free_at = prev >= 0 ? run.end[prev] : 0.0;
      stall += std::max(0.0, run.start[x] - free_at);
    }
  }
  const double period = w.period;
  p->set_accelerator_idle_seconds(period - busy[tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE]);
  p->set_h2d_idle_seconds(period - busy[tandem::v1::TIMELINE_RESOURCE_COPY_H2D]);
  p->set_d2h_idle_seconds(period - busy[tandem::v1::TIMELINE_RESOURCE_COPY_D2H]);
  p->set_host_update_idle_seconds(period - busy[tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE]);
  p->set_host_compute_idle_seconds(period - busy[tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE]);
  p->set_accelerator_stall_seconds(stall);
  p->set_h2d_bytes(h2d_bytes);
  p->set_d2h_bytes(d2h_bytes);
}

// The accelerator's and the host's memory peaks in the window (and their
// samples into `timeline`, when given). Every change at or before the
// window's start goes into the level there; only those inside the window
// are kept for the peak, in time order: the run's starts and ends merged.
void SetMemoryPeaks(const schedule::Schedule& sched, const schedule::Timing& run, const Window& w,
                    tandem::v1::Timeline* timeline, tandem::v1::PlanPrediction* p) {
  const int per = sched.num_ops();
  int64_t resident[2] = {0, 0};
  for (size_t pool = 0; pool < sched.pools.size(); ++pool) {
    resident[sched.pools[pool].host ? 1 : 0] += sched.resident_bytes[pool];
  }
  std::vector<MemoryChange> changes[2];
  // The events of operation `x` at its start or its end, at time `at`.
  auto add = [&](int x, bool at_end, double at) {
    for (const schedule::MemoryEvent& m : sched.ops[x % per].memory) {
      if (m.at_end != at_end) continue;
      const int side = sched.pools[m.pool].host ? 1 : 0;
      if (at <= w.t0) {
        resident[side] += m.delta;
      } else {
        changes[side].push_back({at, m.delta});
      }
    }
  };
  const std::vector<int>&started = run.started, &ended = run.ended;
  size_t a = 0, b = 0;
  while (a < started.size() || b < ended.size()) {
    const double start = a < started.size() ? run.start[started[a]] : HUGE_VAL;
    const double end = b < ended.size() ? run.end[ended[b]] : HUGE_VAL;
    // Past the window (a window of no length still takes what is at its start).
    const double next = std::min(start, end);
    if (next >= w.t1 && next > w.t0) break;
    if (start <= end) {
      add(started[a++], false, start);
    } else {
      add(ended[b++], true, end);
    }
  }
  p->set_accelerator_peak_bytes(
      PeakInWindow(changes[0], resident[0], w.t0, w.t1,
                   timeline ? timeline->mutable_accelerator_memory() : nullptr));
  p->set_host_peak_bytes(PeakInWindow(changes[1], resident[1], w.t0, w.t1,
                                      timeline ? timeline->mutable_host_memory() : nullptr));
}

// Reads the reported iteration (the second to last) out of a run of the
// schedule: the prediction, the timeline, reuse distances and slack.
SimulationResult Report(const Decisions& s, const schedule::Schedule& sched,
                        const schedule::Timing& run, const std::vector<double>& starts,
                        const std::vector<double>& seconds,
                        const std::vector<LayerNumbers>& numbers,
                        const std::vector<double>& finishes, double busiest,
                        const SimulationOptions& options) {
  const int k = run.iterations - 2;
  const double period = starts[k + 1] - starts[k];
  const Window w{k, starts[k], period, starts[k] + period};
  const std::vector<int> place = Places(sched);
  SimulationResult result;
  result.iterations_simulated = run.iterations;
  tandem::v1::PlanPrediction& p = result.prediction;
  const double reported = ReportedPeriod(starts, finishes, busiest);
  p.set_iteration_seconds(reported);
  p.set_samples_per_second(reported > 0 ? s.batch_size / reported : 0.0);
  SetResourceFigures(sched, run, w, place, &p);
  tandem::v1::Timeline* timeline = options.record_timeline ? &result.timeline : nullptr;
  SetMemoryPeaks(sched, run, w, timeline, &p);
  if (timeline != nullptr) WriteSpans(sched, run, k, w.t0, period, timeline);
  result.layers = LayerTimings(s, sched, run, seconds, numbers, place, period);
  return result;
}

// The step program of `s` as the simulator times it: the layers' sizes from
// `numbers`, the ranks and the clipping of `options` and `cost`.
absl::StatusOr<schedule::Schedule> LowerFor(const CostModel& cost, const Decisions& s,
                                            const std::vector<LayerNumbers>& numbers,
                                            const SimulationOptions& options) {
  std::vector<schedule::LayerSizes> sizes(numbers.size());
  for (size_t l = 0; l < numbers.size(); ++l) sizes[l] = numbers[l].sizes;
  schedule::LowerOptions lower;
  lower.has_accelerator = cost.has_accelerator();
  lower.ranks = std::max(1, options.ranks);
  lower.bucket_bytes = options.bucket_bytes;
  lower.partition_host_state = options.ranks > 1 && options.partition_host_state;
  lower.clip_gradients = cost.clips_gradients();
  return schedule::Lower(s, sizes, lower);
}

}  // namespace

absl::Status PlanSimulator::Validate(const Decisions& s) const {
  return schedule::Validate(s, cost_.num_layers(), cost_.has_accelerator());
}

absl::StatusOr<SimulationResult> PlanSimulator::Simulate(const tandem::v1::Plan& plan,
                                                         const SimulationOptions& options) const {
  absl::StatusOr<Decisions> schedule = DecisionsFromPlan(plan, cost_.num_layers());
  if (!schedule.ok()) return schedule.status();
  return Simulate(*schedule, options);
}

absl::StatusOr<SimulationResult> PlanSimulator::Simulate(const Decisions& s,
                                                         const SimulationOptions& options) const {
  if (stop_ && stop_()) return absl::CancelledError("planning stopped: the caller has gone");
  if (absl::Status v = Validate(s); !v.ok()) return v;
  const bool ranks = options.ranks > 1;
  if (ranks && !options.collective_seconds) {
    return absl::InvalidArgumentError("ranks > 1: the collectives need their seconds");
  }
  const bool recurrence = !options.use_event_graph && !ranks;
  if (recurrence && ResidentChain::Covers(s)) {
    std::vector<bool> on_accelerator(s.layers.size());
    for (size_t l = 0; l < s.layers.size(); ++l) on_accelerator[l] = s.layers[l].update == kAcc;
    return ResidentChain(cost_, s).Simulate(on_accelerator, options.record_timeline);
  }
  if (recurrence && HeteroReplicas::Covers(s)) {
    return HeteroReplicas(cost_, s).Simulate(options.record_timeline);
  }
  const std::vector<LayerNumbers> numbers = Numbers(cost_, s, schedule::ModeOf(s));
  absl::StatusOr<schedule::Schedule> lowered = LowerFor(cost_, s, numbers, options);
  if (!lowered.ok()) return lowered.status();
  const schedule::Schedule& sched = *lowered;
  std::vector<double> seconds(sched.num_ops());
  for (int o = 0; o < sched.num_ops(); ++o) {
    const Op& op = sched.ops[o];
    seconds[o] = op.layer >= 0 ? OpSeconds(sched, op, numbers[op.layer], options) : 0.0;
  }

  // Lower makes one resource of each kind. hetero_dp's replicas need not
  // keep pace where nothing syncs them (hetero_replicas.h), and its period
  // is the earlier replica's: neither path bounds it by the work or tracks
  // when its iterations end, nor reports the work.
  const bool hetero = HeteroReplicas::Covers(s);
  std::vector<double> work;
  double busiest = 0;
  if (!hetero) {
    work.assign(tandem::v1::TimelineResource_ARRAYSIZE, 0.0);
    for (int o = 0; o < sched.num_ops(); ++o) {
      work[sched.resources[sched.ops[o].resource].kind] += seconds[o];
    }
    busiest = *std::max_element(work.begin(), work.end());
  }
  int iterations = InitialSimulatedIterations(s.delayed_parameter_update);
  absl::StatusOr<schedule::Timing> run;
  std::vector<double> starts, finishes;
  while (true) {
    run = schedule::Simulate(sched, seconds, iterations);
    if (!run.ok()) return run.status();
    starts.assign(iterations, 0.0);
    for (int i = 0; i < iterations; ++i) {
      double t = run->start[run->Index(i, sched.lead[0])];
      for (int op : sched.lead) t = std::min(t, run->start[run->Index(i, op)]);
      starts[i] = t;
    }
    if (!hetero) {
      finishes.assign(iterations, 0.0);
      for (int i = 0; i < iterations; ++i) {
        for (int o = 0; o < sched.num_ops(); ++o) {
          finishes[i] = std::max(finishes[i], run->end[run->Index(i, o)]);
        }
      }
    }
    if (!KeepSimulating(starts, finishes, busiest)) break;
    iterations *= 2;
  }
  SimulationResult result =
      Report(s, sched, *run, starts, seconds, numbers, finishes, busiest, options);
  result.resource_work_seconds = std::move(work);
  for (size_t pool = 0; pool < sched.pools.size(); ++pool) {
    if (!sched.pools[pool].host) result.accelerator_resident_bytes += sched.resident_bytes[pool];
  }
  return result;
}

}  // namespace tandem::planner
