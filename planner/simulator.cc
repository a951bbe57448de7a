#include "planner/simulator.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "planner/hetero_replicas.h"
#include "planner/resident_chain.h"
#include "planner/steady_state.h"

namespace tandem::planner {
namespace {

using tandem::v1::ActivationPolicy;
using tandem::v1::ParameterHome;
using tandem::v1::Placement;
using tandem::v1::TimelinePhase;
using tandem::v1::TimelineResource;

constexpr Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr Placement kHost = tandem::v1::PLACEMENT_HOST;

enum Resource : int8_t {
  kAccCompute = 0,
  kH2D = 1,
  kD2H = 2,
  kHostUpdate = 3,
  kHostCompute = 4,
  kNumResources = 5,
};

TimelineResource ToProto(Resource r) {
  switch (r) {
    case kAccCompute:
      return tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
    case kH2D:
      return tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
    case kD2H:
      return tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
    case kHostUpdate:
      return tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE;
    default:
      return tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE;
  }
}

enum class Mode { kAccelerator, kHost, kHetero };

struct Span {
  Resource resource;
  TimelinePhase phase;
  int32_t layer;
  int32_t iteration;
  int32_t micro_batch;
  double duration;
  int64_t bytes;
  // A copy that brings freshly updated weights to the accelerator.
  bool delivers_update;
};

struct Edge {
  int32_t prerequisite;
  int32_t dependent;
  bool on_start;
};

struct MemEffect {
  int32_t span;
  bool at_end;
  bool host;
  int64_t delta;
};

// Per-layer durations and sizes at the schedule's sample counts.
struct LayerNumbers {
  double fwd = 0, bwd = 0, upd_acc = 0, upd_host = 0;
  double grad_d2h = 0, grad_h2d = 0, param_h2d = 0, act_d2h = 0, act_h2d = 0;
  double host_fwd = 0, host_bwd = 0, average = 0;
  int64_t param = 0, grad = 0, opt = 0, update_bytes = 0;
  int64_t act = 0, ckpt = 0, ws = 0;
  int64_t host_act = 0, host_ckpt = 0, host_ws = 0;
  bool has_params = false;
};

class GraphBuilder {
 public:
  GraphBuilder(const CostModel& cost, const Schedule& s, Mode mode) : s_(s), mode_(mode) {
    const int L = static_cast<int>(s.layers.size());
    const bool host_layers = mode == Mode::kHost;
    const int m = s.micro_batch_size;
    const int host_samples =
        mode == Mode::kHetero ? s.batch_size - s.accelerator_batch_share : (host_layers ? m : 0);
    numbers_.resize(L);
    for (int l = 0; l < L; ++l) {
      LayerNumbers& n = numbers_[l];
      n.param = cost.ParameterBytes(l);
      n.grad = cost.GradientBytes(l);
      n.opt = cost.OptimizerStateBytes(l);
      n.update_bytes = cost.UpdateBytes(l);
      n.has_params = n.param > 0 || n.grad > 0;
      n.upd_host = cost.UpdateSeconds(l, kHost, s.host_update_threads);
      if (!host_layers) {
        n.fwd = cost.ForwardSeconds(l, kAcc, m);
        n.bwd = cost.BackwardSeconds(l, kAcc, m);
        n.upd_acc = cost.UpdateSeconds(l, kAcc, s.host_update_threads);
        n.grad_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, n.grad);
        n.grad_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, n.grad);
        n.param_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, n.param);
        n.act = cost.ActivationBytes(l, m);
        n.ws = cost.WorkspaceBytes(l, m);
        n.ckpt = l == 0 ? 0 : std::min(n.act, cost.OutputBytes(l - 1, m));
        n.act_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, n.act);
        n.act_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, n.act);
      }
      if (host_samples > 0) {
        n.host_fwd = cost.ForwardSeconds(l, kHost, host_samples);
        n.host_bwd = cost.BackwardSeconds(l, kHost, host_samples);
        n.host_act = cost.ActivationBytes(l, host_samples);
        n.host_ws = cost.WorkspaceBytes(l, host_samples);
        n.host_ckpt = l == 0 ? 0 : std::min(n.host_act, cost.OutputBytes(l - 1, host_samples));
      }
      n.average = cost.GradientAverageSeconds(l, s.host_update_threads);
    }
    // Memory held for the whole run.
    for (int l = 0; l < L; ++l) {
      const LayerNumbers& n = numbers_[l];
      const LayerSchedule& d = s.layers[l];
      if (mode == Mode::kHost) {
        static_host_ += n.param + n.grad + n.opt;
      } else if (mode == Mode::kHetero) {
        static_acc_ += n.param + n.opt;
        static_host_ += n.param + n.grad + n.opt;
      } else {
        if (d.parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) static_acc_ += n.param;
        if (n.has_params && d.update == kAcc) static_acc_ += n.opt;
        if (n.has_params && d.update == kHost) static_host_ += n.param + n.grad + n.opt;
      }
    }
  }

  void Build(int iterations) {
    const int L = static_cast<int>(s_.layers.size());
    iterations_ = iterations;
    const size_t cells = static_cast<size_t>(iterations) * L;
    fwd_first_.assign(cells, -1);
    bwd_last_.assign(cells, -1);
    chain_update_.assign(cells, -1);
    chain_return_.assign(cells, -1);
    host_update_.assign(cells, -1);
    lead_.assign(iterations, std::vector<int>());
    for (int i = 0; i < iterations; ++i) {
      if (mode_ != Mode::kHost) BuildAcceleratorReplica(i);
      if (mode_ != Mode::kAccelerator) BuildHostReplica(i);
      if (mode_ == Mode::kHetero) BuildGradientSync(i);
    }
  }

  const std::vector<Span>& spans() const { return spans_; }
  const std::vector<Edge>& edges() const { return edges_; }
  const std::vector<MemEffect>& mem() const { return mem_; }
  int64_t static_acc() const { return static_acc_; }
  int64_t static_host() const { return static_host_; }
  const std::vector<int>& lead(int i) const { return lead_[i]; }
  int fwd_first(int i, int l) const { return fwd_first_[Cell(i, l)]; }
  // BACKWARD(l, M-1) of iteration i, or the UPDATE(l) right after it when the
  // layer updates on the accelerator: where its reuse distance starts.
  int bwd_last(int i, int l) const { return bwd_last_[Cell(i, l)]; }
  int chain_update(int i, int l) const { return chain_update_[Cell(i, l)]; }
  int chain_return(int i, int l) const { return chain_return_[Cell(i, l)]; }
  // Position of a compute span in its replica's program, and the span before
  // it there (-1 for the first).
  int program_pos(int span) const { return program_pos_[span]; }
  int program_prev(int span) const { return program_prev_[span]; }
  // Sum of the first p durations of the layer-computing replica's program.
  double program_prefix(int p) const { return program_prefix_[p]; }
  const LayerNumbers& numbers(int l) const { return numbers_[l]; }

 private:
  size_t Cell(int i, int l) const { return static_cast<size_t>(i) * s_.layers.size() + l; }
  int Lag() const { return s_.delayed_parameter_update ? 2 : 1; }

  int Add(Resource r, TimelinePhase phase, int layer, int iteration, int micro_batch,
          double duration, int64_t bytes = 0, bool delivers_update = false) {
    spans_.push_back({r, phase, layer, iteration, micro_batch, duration, bytes, delivers_update});
    program_pos_.push_back(-1);
    program_prev_.push_back(-1);
    return static_cast<int>(spans_.size()) - 1;
  }
  // A span on a compute stream, in program order after `*prev`.
  int AddCompute(Resource r, TimelinePhase phase, int layer, int iteration, int micro_batch,
                 double duration, int* prev) {
    const int span = Add(r, phase, layer, iteration, micro_batch, duration);
    Dep(span, *prev);
    program_prev_[span] = *prev;
    // The layer-computing replica's program feeds the reuse distances.
    const bool main_program = (r == kAccCompute) == (mode_ != Mode::kHost);
    if (main_program) {
      program_pos_[span] = static_cast<int>(program_prefix_.size()) - 1;
      program_prefix_.push_back(program_prefix_.back() + duration);
    }
    *prev = span;
    return span;
  }
  void Dep(int dependent, int prerequisite, bool on_start = false) {
    if (prerequisite >= 0) edges_.push_back({prerequisite, dependent, on_start});
  }
  void Mem(int span, bool at_end, bool host, int64_t delta) {
    if (delta != 0) mem_.push_back({span, at_end, host, delta});
  }

  void BuildAcceleratorReplica(int i) {
    const int L = static_cast<int>(s_.layers.size());
    const int M = s_.micro_batches();
    const bool hetero = mode_ == Mode::kHetero;
    std::vector<int> offload(static_cast<size_t>(L), -1);
    for (int j = 0; j < M; ++j) {
      for (int l = 0; l < L; ++l) {
        const LayerSchedule& d = s_.layers[l];
        const LayerNumbers& n = numbers_[l];
        const bool streamed = d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
        int copy = -1;
        if (streamed) {
          copy = Add(kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, i, j, n.param_h2d, n.param,
                     j == 0);
          Dep(copy, acc_layer_op_, /*on_start=*/true);
          if (j == 0 && i - Lag() >= 0) Dep(copy, chain_update(i - Lag(), l));
          Mem(copy, false, false, n.param);
        }
        const int f =
            AddCompute(kAccCompute, tandem::v1::TIMELINE_PHASE_FORWARD, l, i, j, n.fwd, &acc_prev_);
        Dep(f, copy);
        if (!hetero && !streamed && n.has_params && d.update == kHost && j == 0 && i - Lag() >= 0) {
          Dep(f, chain_return(i - Lag(), l));
        }
        if (streamed) Mem(f, true, false, -n.param);
        Mem(f, false, false, n.act + n.ws);
        Mem(f, true, false, -n.ws);
        if (l > 0 && s_.layers[l - 1].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
          Mem(f, true, false, -(numbers_[l - 1].act - numbers_[l - 1].ckpt));
        }
        if (l == L - 1 && d.activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
          Mem(f, true, false, -(n.act - n.ckpt));
        }
        if (d.activation == tandem::v1::ACTIVATION_POLICY_OFFLOAD) {
          const int o =
              Add(kD2H, tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H, l, i, j, n.act_d2h, n.act);
          Dep(o, f);
          Mem(o, true, false, -n.act);
          Mem(o, false, true, n.act);
          offload[l] = o;
        }
        if (j == 0) fwd_first_[Cell(i, l)] = f;
        if (j == 0 && l == 0) lead_[i].push_back(f);
        acc_layer_op_ = f;
      }
      for (int l = L - 1; l >= 0; --l) {
        const LayerSchedule& d = s_.layers[l];
        const LayerNumbers& n = numbers_[l];
        const bool streamed = d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
        int copy = -1;
        if (streamed) {
          copy = Add(kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, i, j, n.param_h2d, n.param);
          Dep(copy, acc_layer_op_, /*on_start=*/true);
          Mem(copy, false, false, n.param);
        }
        int fetch = -1;
        if (d.activation == tandem::v1::ACTIVATION_POLICY_OFFLOAD) {
          fetch = Add(kH2D, tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D, l, i, j, n.act_h2d, n.act);
          Dep(fetch, acc_layer_op_, /*on_start=*/true);
          Dep(fetch, offload[l]);
          Mem(fetch, false, false, n.act);
          Mem(fetch, true, true, -n.act);
        }
        if (d.activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
          const int r = AddCompute(kAccCompute, tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, i, j,
                                   n.fwd, &acc_prev_);
          Dep(r, copy);
          Mem(r, false, false, n.act - n.ckpt + n.ws);
          Mem(r, true, false, -n.ws);
        }
        const int b = AddCompute(kAccCompute, tandem::v1::TIMELINE_PHASE_BACKWARD, l, i, j, n.bwd,
                                 &acc_prev_);
        Dep(b, copy);
        Dep(b, fetch);
        Mem(b, false, false, n.ws + (j == 0 ? n.grad : 0));
        Mem(b, true, false, -n.ws - n.act - (streamed ? n.param : 0));
        acc_layer_op_ = b;
        if (j != M - 1) continue;
        bwd_last_[Cell(i, l)] = b;
        if (hetero || !n.has_params) continue;
        if (d.update == kAcc) {
          const int u = AddCompute(kAccCompute, tandem::v1::TIMELINE_PHASE_UPDATE, l, i, j,
                                   n.upd_acc, &acc_prev_);
          spans_[u].bytes = n.update_bytes;
          Mem(u, true, false, -n.grad);
          bwd_last_[Cell(i, l)] = u;
        } else {
          const int g =
              Add(kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H, l, i, j, n.grad_d2h, n.grad);
          Dep(g, b);
          Mem(g, true, false, -n.grad);
          const int u = Add(kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, i, j, n.upd_host,
                            n.update_bytes);
          Dep(u, g);
          chain_update_[Cell(i, l)] = u;
          if (!streamed) {
            const int h = Add(kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, i, j, n.param_h2d,
                              n.param, /*delivers_update=*/true);
            Dep(h, u);
            chain_return_[Cell(i, l)] = h;
          }
        }
      }
    }
  }

  void BuildHostReplica(int i) {
    const int L = static_cast<int>(s_.layers.size());
    const bool hetero = mode_ == Mode::kHetero;
    const int M = hetero ? 1 : s_.micro_batches();
    host_backward_.assign(static_cast<size_t>(L), -1);
    for (int j = 0; j < M; ++j) {
      for (int l = 0; l < L; ++l) {
        const LayerNumbers& n = numbers_[l];
        const bool recompute =
            !hetero && s_.layers[l].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
        const int f = AddCompute(kHostCompute, tandem::v1::TIMELINE_PHASE_FORWARD, l, i, j,
                                 n.host_fwd, &host_prev_);
        if (j == 0 && i > 0 && n.has_params) Dep(f, host_update_[Cell(i - 1, l)]);
        Mem(f, false, true, n.host_act + n.host_ws);
        Mem(f, true, true, -n.host_ws);
        if (!hetero && l > 0 &&
            s_.layers[l - 1].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
          Mem(f, true, true, -(numbers_[l - 1].host_act - numbers_[l - 1].host_ckpt));
        }
        if (l == L - 1 && recompute) Mem(f, true, true, -(n.host_act - n.host_ckpt));
        if (!hetero && j == 0) fwd_first_[Cell(i, l)] = f;
        if (j == 0 && l == 0) lead_[i].push_back(f);
      }
      for (int l = L - 1; l >= 0; --l) {
        const LayerNumbers& n = numbers_[l];
        if (!hetero && s_.layers[l].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
          const int r = AddCompute(kHostCompute, tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, i, j,
                                   n.host_fwd, &host_prev_);
          Mem(r, false, true, n.host_act - n.host_ckpt + n.host_ws);
          Mem(r, true, true, -n.host_ws);
        }
        const int b = AddCompute(kHostCompute, tandem::v1::TIMELINE_PHASE_BACKWARD, l, i, j,
                                 n.host_bwd, &host_prev_);
        Mem(b, false, true, n.host_ws);
        Mem(b, true, true, -n.host_ws - n.host_act);
        if (j != M - 1) continue;
        host_backward_[l] = b;
        if (hetero) continue;
        bwd_last_[Cell(i, l)] = b;
        if (!n.has_params) continue;
        const int u = Add(kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, i, j, n.upd_host,
                          n.update_bytes);
        Dep(u, b);
        host_update_[Cell(i, l)] = u;
        chain_update_[Cell(i, l)] = u;
      }
    }
  }

  void BuildGradientSync(int i) {
    const int L = static_cast<int>(s_.layers.size());
    const int M = s_.micro_batches();
    std::vector<int> averaged(static_cast<size_t>(L), -1);
    for (int l = L - 1; l >= 0; --l) {
      const LayerNumbers& n = numbers_[l];
      if (!n.has_params) continue;
      const int down =
          Add(kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, i, M - 1, n.grad_d2h, n.grad);
      Dep(down, bwd_last(i, l));
      const int average = Add(kHostUpdate, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, i, 0,
                              n.average, 3 * n.grad);
      Dep(average, down);
      Dep(average, host_backward_[l]);
      const int up =
          Add(kH2D, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, i, M - 1, n.grad_h2d, n.grad);
      Dep(up, average);
      averaged[l] = up;
      const int u =
          Add(kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, i, 0, n.upd_host, n.update_bytes);
      Dep(u, average);
      host_update_[Cell(i, l)] = u;
    }
    for (int l = L - 1; l >= 0; --l) {
      const LayerNumbers& n = numbers_[l];
      if (!n.has_params) continue;
      const int u = AddCompute(kAccCompute, tandem::v1::TIMELINE_PHASE_UPDATE, l, i, M - 1,
                               n.upd_acc, &acc_prev_);
      spans_[u].bytes = n.update_bytes;
      Dep(u, averaged[l]);
      Mem(u, true, false, -n.grad);
    }
  }

  const Schedule& s_;
  Mode mode_;
  int iterations_ = 0;
  std::vector<LayerNumbers> numbers_;
  int64_t static_acc_ = 0;
  int64_t static_host_ = 0;

  std::vector<Span> spans_;
  std::vector<Edge> edges_;
  std::vector<MemEffect> mem_;
  std::vector<int> program_pos_;
  std::vector<int> program_prev_;
  std::vector<double> program_prefix_ = {0.0};

  int acc_prev_ = -1;
  int acc_layer_op_ = -1;
  int host_prev_ = -1;
  std::vector<int> host_backward_;
  std::vector<std::vector<int>> lead_;
  std::vector<int> fwd_first_, bwd_last_, chain_update_, chain_return_, host_update_;
};

struct EventRun {
  std::vector<double> start;
  std::vector<double> end;
  // The prerequisite whose release made the span ready last (-1: none).
  std::vector<int> binding;
};

// Discrete-event run: compute spans follow their program (a chain of
// dependencies), every resource is FIFO by the time a span became ready, ties
// in creation order.
absl::StatusOr<EventRun> RunEvents(const std::vector<Span>& spans, const std::vector<Edge>& edges) {
  const int n = static_cast<int>(spans.size());
  std::vector<int> remaining(n, 0);
  std::vector<int> offsets(n + 1, 0);
  for (const Edge& e : edges) {
    ++remaining[e.dependent];
    ++offsets[e.prerequisite + 1];
  }
  for (int i = 0; i < n; ++i) offsets[i + 1] += offsets[i];
  std::vector<int> dependents(edges.size());
  {
    std::vector<int> fill(offsets.begin(), offsets.end() - 1);
    for (const Edge& e : edges) {
      dependents[fill[e.prerequisite]++] = e.dependent * 2 + (e.on_start ? 1 : 0);
    }
  }

  EventRun run;
  run.start.assign(n, -1.0);
  run.end.assign(n, -1.0);
  run.binding.assign(n, -1);
  std::vector<double> ready(n, 0.0);

  using Entry = std::pair<double, int64_t>;
  using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>>;
  MinHeap queues[kNumResources];
  bool busy[kNumResources] = {false, false, false, false, false};
  MinHeap events;  // (time, span * 2 + is_end)

  for (int i = 0; i < n; ++i) {
    if (remaining[i] == 0) queues[spans[i].resource].push({0.0, i});
  }
  auto dispatch = [&](double t) {
    for (int r = 0; r < kNumResources; ++r) {
      if (busy[r] || queues[r].empty()) continue;
      const int s = static_cast<int>(queues[r].top().second);
      queues[r].pop();
      busy[r] = true;
      run.start[s] = t;
      run.end[s] = t + spans[s].duration;
      events.push({t, int64_t{s} * 2});
      events.push({run.end[s], int64_t{s} * 2 + 1});
    }
  };
  dispatch(0.0);
  int finished = 0;
  while (!events.empty()) {
    const double t = events.top().first;
    while (!events.empty() && events.top().first == t) {
      const int64_t code = events.top().second;
      events.pop();
      const int s = static_cast<int>(code / 2);
      const bool is_end = (code & 1) != 0;
      if (is_end) {
        busy[spans[s].resource] = false;
        ++finished;
      }
      for (int k = offsets[s]; k < offsets[s + 1]; ++k) {
        const int d = dependents[k] / 2;
        const bool on_start = (dependents[k] & 1) != 0;
        if (on_start == is_end) continue;
        if (t >= ready[d]) {
          ready[d] = t;
          run.binding[d] = s;
        }
        if (--remaining[d] == 0) queues[spans[d].resource].push({t, d});
      }
    }
    dispatch(t);
  }
  if (finished != n) {
    return absl::InternalError(
        absl::StrCat("simulation deadlocked: ", n - finished, " of ", n, " spans never ran"));
  }
  return run;
}

Mode ModeOf(const Schedule& s) {
  if (s.strategy == tandem::v1::STRATEGY_HETERO_DP) return Mode::kHetero;
  for (const LayerSchedule& l : s.layers) {
    if (l.compute != kHost) return Mode::kAccelerator;
  }
  return Mode::kHost;
}

absl::Status Invalid(int layer, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("plan.layers[", layer, "].", field, ": ", what));
}

}  // namespace

absl::Status PlanSimulator::Validate(const Schedule& s) const {
  const int L = cost_.num_layers();
  if (static_cast<int>(s.layers.size()) != L) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.layers: has ", s.layers.size(), " layers, the model has ", L));
  }
  if (s.batch_size < 1) return absl::InvalidArgumentError("plan.batch_size: must be >= 1");
  if (s.host_update_threads < 1) {
    return absl::InvalidArgumentError("plan.host_update_threads: must be >= 1");
  }
  const Mode mode = ModeOf(s);
  if (mode == Mode::kHetero &&
      (s.accelerator_batch_share < 1 || s.accelerator_batch_share >= s.batch_size)) {
    return absl::InvalidArgumentError(
        "plan.accelerator_batch_share: must be in [1, batch_size - 1] for hetero_dp");
  }
  if (s.micro_batch_size < 1 || s.replica_samples() % s.micro_batch_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.micro_batch_size: must be >= 1 and divide ", s.replica_samples(),
                     ", got ", s.micro_batch_size));
  }
  if (mode != Mode::kHost && !cost_.has_accelerator()) {
    return absl::InvalidArgumentError(
        "plan.layers: the plan computes on an accelerator the cost source does not have");
  }
  for (int l = 0; l < L; ++l) {
    const LayerSchedule& d = s.layers[l];
    const ActivationPolicy a = d.activation;
    if (a != tandem::v1::ACTIVATION_POLICY_KEEP && a != tandem::v1::ACTIVATION_POLICY_OFFLOAD &&
        a != tandem::v1::ACTIVATION_POLICY_RECOMPUTE) {
      return Invalid(l, "activation_policy", "must be KEEP, OFFLOAD or RECOMPUTE");
    }
    if (mode == Mode::kHost) {
      if (d.parameter_home != tandem::v1::PARAMETER_HOME_HOST) {
        return Invalid(l, "parameter_home", "must be HOST when computing on the host");
      }
      if (d.update != kHost) return Invalid(l, "update", "must be HOST when computing on the host");
      if (a == tandem::v1::ACTIVATION_POLICY_OFFLOAD) {
        return Invalid(l, "activation_policy", "OFFLOAD needs an accelerator");
      }
      continue;
    }
    if (d.compute != kAcc) {
      return Invalid(l, "compute",
                     "all layers compute on one side (mixed placements are not supported)");
    }
    if (mode == Mode::kHetero) {
      if (d.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR || d.update != kAcc ||
          a == tandem::v1::ACTIVATION_POLICY_OFFLOAD) {
        return Invalid(l, "parameter_home",
                       "hetero_dp's accelerator replica keeps its state resident, updates on the "
                       "accelerator and keeps or recomputes activations");
      }
      continue;
    }
    if (d.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR &&
        d.parameter_home != tandem::v1::PARAMETER_HOME_HOST_STREAMED) {
      return Invalid(l, "parameter_home", "must be ACCELERATOR or HOST_STREAMED");
    }
    if (d.update != kAcc && d.update != kHost) {
      return Invalid(l, "update", "must be ACCELERATOR or HOST");
    }
    if (d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED && d.update != kHost) {
      return Invalid(l, "update",
                     "a HOST_STREAMED layer's master weights live on the host, so it "
                     "must update on the host");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SimulationResult> PlanSimulator::Simulate(const tandem::v1::Plan& plan,
                                                         const SimulationOptions& options) const {
  absl::StatusOr<Schedule> schedule = ScheduleFromPlan(plan, cost_.num_layers());
  if (!schedule.ok()) return schedule.status();
  return Simulate(*schedule, options);
}

absl::StatusOr<SimulationResult> PlanSimulator::Simulate(const Schedule& s,
                                                         const SimulationOptions& options) const {
  if (absl::Status v = Validate(s); !v.ok()) return v;
  if (!options.use_event_graph && ResidentChain::Covers(s)) {
    std::vector<bool> on_accelerator(s.layers.size());
    for (size_t l = 0; l < s.layers.size(); ++l) on_accelerator[l] = s.layers[l].update == kAcc;
    return ResidentChain(cost_, s).Simulate(on_accelerator, options.record_timeline);
  }
  if (!options.use_event_graph && HeteroReplicas::Covers(s)) {
    return HeteroReplicas(cost_, s).Simulate(options.record_timeline);
  }
  const Mode mode = ModeOf(s);
  const int L = cost_.num_layers();

  int iterations = InitialSimulatedIterations(s.delayed_parameter_update);
  std::unique_ptr<GraphBuilder> graph;
  std::vector<double> starts;
  absl::StatusOr<EventRun> run;
  while (true) {
    graph = std::make_unique<GraphBuilder>(cost_, s, mode);
    graph->Build(iterations);
    run = RunEvents(graph->spans(), graph->edges());
    if (!run.ok()) return run.status();
    starts.assign(iterations, 0.0);
    for (int i = 0; i < iterations; ++i) {
      double t = run->start[graph->lead(i)[0]];
      for (int span : graph->lead(i)) t = std::min(t, run->start[span]);
      starts[i] = t;
    }
    if (PeriodSettled(starts) || iterations >= kMaxSimulatedIterations) break;
    iterations *= 2;
  }
  const GraphBuilder& builder = *graph;

  const std::vector<Span>& spans = builder.spans();
  const int k = iterations - 2;
  const double t0 = starts[k];
  const double period = starts[k + 1] - t0;
  const double t1 = t0 + period;

  SimulationResult result;
  result.iterations_simulated = iterations;
  tandem::v1::PlanPrediction& p = result.prediction;
  p.set_iteration_seconds(period);
  p.set_samples_per_second(period > 0 ? s.batch_size / period : 0.0);

  double busy[kNumResources] = {0, 0, 0, 0, 0};
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  double stall = 0;
  for (int i = 0; i < static_cast<int>(spans.size()); ++i) {
    const Span& span = spans[i];
    const double a = std::max(run->start[i], t0), b = std::min(run->end[i], t1);
    if (b > a) busy[span.resource] += b - a;
    if (span.iteration != k) continue;
    if (span.resource == kH2D) h2d_bytes += span.bytes;
    if (span.resource == kD2H) d2h_bytes += span.bytes;
    if (span.resource == kAccCompute && run->binding[i] >= 0 &&
        spans[run->binding[i]].delivers_update) {
      const int prev = builder.program_prev(i);
      const double free_at = prev >= 0 ? run->end[prev] : 0.0;
      stall += std::max(0.0, run->start[i] - free_at);
    }
  }
  p.set_accelerator_idle_seconds(period - busy[kAccCompute]);
  p.set_h2d_idle_seconds(period - busy[kH2D]);
  p.set_d2h_idle_seconds(period - busy[kD2H]);
  p.set_host_update_idle_seconds(period - busy[kHostUpdate]);
  p.set_host_compute_idle_seconds(period - busy[kHostCompute]);
  p.set_accelerator_stall_seconds(stall);
  p.set_h2d_bytes(h2d_bytes);
  p.set_d2h_bytes(d2h_bytes);

  std::vector<MemoryChange> changes[2];
  for (const MemEffect& m : builder.mem()) {
    const double t = m.at_end ? run->end[m.span] : run->start[m.span];
    changes[m.host ? 1 : 0].push_back({t, m.delta});
  }
  for (std::vector<MemoryChange>& c : changes) {
    std::sort(c.begin(), c.end(), [](const MemoryChange& x, const MemoryChange& y) {
      return x.time_seconds < y.time_seconds;
    });
  }
  tandem::v1::Timeline* timeline = options.record_timeline ? &result.timeline : nullptr;
  p.set_accelerator_peak_bytes(
      PeakInWindow(changes[0], builder.static_acc(), t0, t1,
                   timeline ? timeline->mutable_accelerator_memory() : nullptr));
  p.set_host_peak_bytes(PeakInWindow(changes[1], builder.static_host(), t0, t1,
                                     timeline ? timeline->mutable_host_memory() : nullptr));

  if (timeline != nullptr) {
    timeline->set_iteration_seconds(period);
    timeline->set_source("simulated");
    for (int i = 0; i < static_cast<int>(spans.size()); ++i) {
      const Span& span = spans[i];
      if (span.iteration != k) continue;
      tandem::v1::TimelineSpan* out = timeline->add_spans();
      out->set_resource(ToProto(span.resource));
      out->set_lane(0);
      out->set_layer(span.layer);
      out->set_phase(span.phase);
      out->set_start_seconds(run->start[i] - t0);
      out->set_end_seconds(run->end[i] - t0);
      out->set_bytes(span.bytes);
      out->set_micro_batch(span.micro_batch);
    }
  }

  result.layers.resize(L);
  for (int l = 0; l < L; ++l) {
    const int b = builder.bwd_last(k, l);
    const int f = builder.fwd_first(k + 1, l);
    if (b < 0 || f < 0) continue;
    LayerTiming& timing = result.layers[l];
    timing.reuse_distance_seconds = builder.program_prefix(builder.program_pos(f)) -
                                    builder.program_prefix(builder.program_pos(b) + 1);
    if (mode == Mode::kHetero || !builder.numbers(l).has_params) continue;
    if (mode == Mode::kAccelerator && s.layers[l].update != kHost) continue;
    double delivered = 0;
    if (builder.chain_return(k, l) >= 0) {
      delivered = run->end[builder.chain_return(k, l)];
    } else {
      const int u = builder.chain_update(k, l);
      delivered = run->end[u] + (mode == Mode::kHost ? 0.0 : builder.numbers(l).param_h2d);
    }
    const double deadline =
        timing.reuse_distance_seconds +
        (mode == Mode::kAccelerator && s.delayed_parameter_update ? period : 0.0);
    timing.slack_seconds = deadline - (delivered - run->end[b]);
  }
  return result;
}

}  // namespace tandem::planner
