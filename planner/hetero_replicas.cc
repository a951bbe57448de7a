#include "planner/hetero_replicas.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tandem::planner {
namespace {

using tandem::v1::TimelinePhase;
using tandem::v1::TimelineResource;

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr tandem::v1::Placement kHost = tandem::v1::PLACEMENT_HOST;

}  // namespace

// What the second run, with the window [t0, t1) known, collects: the
// reported iteration's spans and bytes, each resource's busy time inside the
// window (its spans in creation order, as the event graph sums them), each
// compute stream's memory, and per layer the program positions reuse
// distances are read from.
struct HeteroReplicas::Record : ChainTimeline {
  Record(double start, double end, int64_t static_acc, int64_t static_host,
         tandem::v1::Timeline* out)
      : ChainTimeline{out, start},
        t1(end),
        acc_memory(static_acc, out ? out->mutable_accelerator_memory() : nullptr),
        host_memory(static_host, out ? out->mutable_host_memory() : nullptr) {
    acc_memory.SetWindowStart(t0);
    host_memory.SetWindowStart(t0);
  }
  double t1;
  WindowLevel acc_memory, host_memory;
  double acc_busy = 0, host_busy = 0, d2h_busy = 0, pool_busy = 0, h2d_busy = 0;
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  std::vector<double> prefix_after, prefix_before;

  void Busy(double* busy, double start, double end) const {
    const double a = std::max(start, t0), b = std::min(end, t1);
    if (b > a) *busy += b - a;
  }
  // A compute stream's changes come in time order; those at or after the
  // window's end do not count.
  static void Change(WindowLevel* memory, double t, int64_t delta, double window_end) {
    if (delta != 0 && memory->Inside(t, window_end)) memory->Feed(t, delta);
  }
};

HeteroReplicas::HeteroReplicas(const CostModel& cost, const Decisions& s)
    : clip_(cost.clips_gradients()), micro_batches_(s.micro_batches()), batch_size_(s.batch_size) {
  const int L = cost.num_layers();
  const int m = s.micro_batch_size;
  const int host_samples = s.batch_size - s.accelerator_batch_share;
  layers_.resize(L);
  for (int l = 0; l < L; ++l) {
    Layer& x = layers_[l];
    static_cast<ChainLayerCosts&>(x) =
        ChainLayerCostsOf(cost, l, m, s.host_update_threads,
                          s.layers[l].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE);
    x.grad_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, x.grad);
    if (host_samples > 0) {
      x.host_fwd = cost.ForwardSeconds(l, kHost, host_samples);
      x.host_bwd = cost.BackwardSeconds(l, kHost, host_samples);
      x.host_act = cost.ActivationBytes(l, host_samples);
      x.host_ws = cost.WorkspaceBytes(l, host_samples);
    }
    x.average = cost.GradientAverageSeconds(l, s.host_update_threads);
    static_accelerator_ += x.param + x.opt;
    static_host_ += x.param + x.grad + x.opt;
  }
  for (int l = L - 1; l >= 0; --l) {
    if (layers_[l].has_params) synced_.push_back(l);
  }
}

namespace {

// A span on the accelerator's compute stream: busy time always, the span
// itself in the reported window.
template <typename Record>
void AcceleratorSpan(Record* record, Record* window, TimelinePhase phase, int l, int j, double s,
                     double e, int64_t bytes) {
  if (record != nullptr) record->Busy(&record->acc_busy, s, e);
  if (window != nullptr) {
    window->Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, phase, l, j, s, e, bytes);
  }
}

}  // namespace

void HeteroReplicas::RunOnce(int n, Record* record) {
  const int L = static_cast<int>(layers_.size());
  starts_.assign(n, 0.0);
  acc_backward_end_.assign(L, 0.0);
  host_backward_end_.assign(L, 0.0);
  down_end_.assign(L, 0.0);
  average_end_.assign(L, 0.0);
  up_end_.assign(L, 0.0);
  host_update_end_.assign(L, 0.0);
  Clocks c;
  for (int i = 0; i < n; ++i) {
    // Iteration i starts at the earlier of the replicas' first forwards.
    double host_start = c.host;
    if (i > 0 && layers_[0].has_params) host_start = std::max(host_start, host_update_end_[0]);
    starts_[i] = std::min(c.acc, host_start);
    if (i == n - 1) {
      // Nothing at or after the last iteration's start is reported; only
      // where its forwards sit in the program (reuse distances).
      if (record != nullptr) {
        for (int f = 0; f < L; ++f) {
          record->prefix_before[f] = c.prefix;
          c.prefix += layers_[f].fwd;
        }
      }
      return;
    }
    Record* window = record != nullptr && i == n - 2 ? record : nullptr;
    AcceleratorPass(c, record, window);
    HostPass(i, c, record, window);
    SyncGradients(c, record, window);
  }
}

void HeteroReplicas::AcceleratorPass(Clocks& c, Record* record, Record* window) {
  const int L = static_cast<int>(layers_.size());
  const int M = micro_batches_;
  auto change = [&](double t, int64_t delta) {
    if (record != nullptr) Record::Change(&record->acc_memory, t, delta, record->t1);
  };
  for (int j = 0; j < M; ++j) {
    for (int l = 0; l < L; ++l) {
      const Layer& x = layers_[l];
      const double s = c.acc, e = s + x.fwd;
      change(s, x.act + x.ws);
      change(e, -x.ws);
      if (l > 0 && layers_[l - 1].recompute) {
        change(e, -(layers_[l - 1].act - layers_[l - 1].ckpt));
      }
      if (l == L - 1 && x.recompute) change(e, -(x.act - x.ckpt));
      AcceleratorSpan(record, window, tandem::v1::TIMELINE_PHASE_FORWARD, l, j, s, e, 0);
      c.prefix += x.fwd;
      c.acc = e;
    }
    for (int l = L - 1; l >= 0; --l) {
      const Layer& x = layers_[l];
      if (x.recompute) {
        const double s = c.acc, e = s + x.fwd;
        change(s, x.act - x.ckpt + x.ws);
        change(e, -x.ws);
        AcceleratorSpan(record, window, tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, j, s, e, 0);
        c.prefix += x.fwd;
        c.acc = e;
      }
      const double s = c.acc, e = s + x.bwd;
      change(s, x.ws + (j == 0 ? x.grad : 0));
      change(e, -x.ws - x.act);
      AcceleratorSpan(record, window, tandem::v1::TIMELINE_PHASE_BACKWARD, l, j, s, e, 0);
      c.prefix += x.bwd;
      c.acc = e;
      if (j == M - 1) {
        acc_backward_end_[l] = e;
        if (window != nullptr) window->prefix_after[l] = c.prefix;
      }
    }
  }
}

void HeteroReplicas::HostPass(int i, Clocks& c, Record* record, Record* window) {
  // One micro-batch, each first forward after the layer's update of the
  // iteration before.
  const int L = static_cast<int>(layers_.size());
  auto change = [&](double t, int64_t delta) {
    if (record != nullptr) Record::Change(&record->host_memory, t, delta, record->t1);
  };
  auto span = [&](TimelinePhase phase, int l, double s, double e) {
    if (record != nullptr) record->Busy(&record->host_busy, s, e);
    if (window != nullptr) {
      window->Span(tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE, phase, l, 0, s, e, 0);
    }
  };
  for (int l = 0; l < L; ++l) {
    const Layer& x = layers_[l];
    double s = c.host;
    if (i > 0 && x.has_params) s = std::max(s, host_update_end_[l]);
    const double e = s + x.host_fwd;
    change(s, x.host_act + x.host_ws);
    change(e, -x.host_ws);
    span(tandem::v1::TIMELINE_PHASE_FORWARD, l, s, e);
    c.host = e;
  }
  for (int l = L - 1; l >= 0; --l) {
    const Layer& x = layers_[l];
    const double s = c.host, e = s + x.host_bwd;
    change(s, x.host_ws);
    change(e, -x.host_ws - x.host_act);
    span(tandem::v1::TIMELINE_PHASE_BACKWARD, l, s, e);
    host_backward_end_[l] = e;
    c.host = e;
  }
}

void HeteroReplicas::SyncGradients(Clocks& c, Record* record, Record* window) {
  SyncStarts starts;
  TimeSync(c, &starts);
  if (record != nullptr) RecordSync(starts, record, window);
  // The accelerator's updates close its program, each once its averaged
  // gradient is back (and, clipped, the norm is known).
  const int M = micro_batches_;
  for (const int l : synced_) {
    const Layer& x = layers_[l];
    const double s = std::max(c.acc, std::max(up_end_[l], starts.norm)), e = s + x.upd_acc;
    if (record != nullptr) Record::Change(&record->acc_memory, e, -x.grad, record->t1);
    AcceleratorSpan(record, window, tandem::v1::TIMELINE_PHASE_UPDATE, l, M - 1, s, e,
                    x.update_bytes);
    c.prefix += x.upd_acc;
    c.acc = e;
  }
}

void HeteroReplicas::TimeSync(Clocks& c, SyncStarts* starts) {
  // Downloads in backward order; the host pool merges the averages and the
  // host updates by (ready time, creation order), an update (created right
  // after its average) winning ties against any later average; clipped, it
  // runs every average, then the norm (no time), then every host update;
  // uploads in backward order.
  const int L = static_cast<int>(layers_.size());
  starts->down.assign(L, 0.0);
  starts->average.assign(L, 0.0);
  starts->up.assign(L, 0.0);
  starts->host_update.assign(L, 0.0);
  const size_t P = synced_.size();
  for (const int l : synced_) {
    starts->down[l] = std::max(acc_backward_end_[l], c.d2h_free);
    c.d2h_free = starts->down[l] + layers_[l].grad_d2h;
    down_end_[l] = c.d2h_free;
  }
  size_t averaged = 0, updated = 0;
  // Clipped, the norm follows the last average (or whatever the pool ran).
  if (clip_ && P == 0) starts->norm = c.pool_free;
  while (updated < P) {
    bool average = averaged < P;
    if (average && !clip_ && updated < averaged) {
      const int la = synced_[averaged], lu = synced_[updated];
      average = std::max(down_end_[la], host_backward_end_[la]) < average_end_[lu];
    }
    if (average) {
      const int l = synced_[averaged++];
      starts->average[l] = std::max(c.pool_free, std::max(down_end_[l], host_backward_end_[l]));
      c.pool_free = starts->average[l] + layers_[l].average;
      average_end_[l] = c.pool_free;
      continue;
    }
    if (clip_ && updated == 0) starts->norm = c.pool_free;
    const int l = synced_[updated++];
    starts->host_update[l] =
        std::max(c.pool_free, clip_ ? std::max(average_end_[l], starts->norm) : average_end_[l]);
    c.pool_free = starts->host_update[l] + layers_[l].upd_host;
    host_update_end_[l] = c.pool_free;
  }
  for (const int l : synced_) {
    starts->up[l] = std::max(average_end_[l], c.h2d_free);
    c.h2d_free = starts->up[l] + layers_[l].grad_h2d;
    up_end_[l] = c.h2d_free;
  }
}

void HeteroReplicas::RecordSync(const SyncStarts& starts, Record* record, Record* window) const {
  // In the program's creation order: each layer's sync and (unclipped) its
  // host update; clipped, the norm and the host updates after them all.
  const int M = micro_batches_;
  auto host_update = [&](int l) {
    record->Busy(&record->pool_busy, starts.host_update[l], host_update_end_[l]);
    if (window == nullptr) return;
    window->Span(tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE, l, 0,
                 starts.host_update[l], host_update_end_[l], layers_[l].update_bytes);
  };
  for (const int l : synced_) {
    const Layer& x = layers_[l];
    record->Busy(&record->d2h_busy, starts.down[l], down_end_[l]);
    record->Busy(&record->pool_busy, starts.average[l], average_end_[l]);
    record->Busy(&record->h2d_busy, starts.up[l], up_end_[l]);
    if (window != nullptr) {
      window->Span(tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC,
                   l, M - 1, starts.down[l], down_end_[l], x.grad);
      window->Span(tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE,
                   tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, 0, starts.average[l],
                   average_end_[l], 3 * x.grad);
      window->Span(tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC,
                   l, M - 1, starts.up[l], up_end_[l], x.grad);
      window->d2h_bytes += x.grad;
      window->h2d_bytes += x.grad;
    }
    if (!clip_) host_update(l);
  }
  if (!clip_) return;
  if (window != nullptr) {
    window->Span(tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE, -1,
                 0, starts.norm, starts.norm, 0);
  }
  for (const int l : synced_) host_update(l);
}

// The run is repeated until settled (times only); then once more at that
// length with the window known, to record it.
SimulationResult HeteroReplicas::Simulate(bool record_timeline) {
  const int L = static_cast<int>(layers_.size());
  int n = InitialSimulatedIterations(/*delayed_parameter_update=*/false);
  while (true) {
    RunOnce(n, nullptr);
    // Without PeriodSettled's bound on the work: the replicas need not keep
    // pace, and the period is the earlier one's (simulator.cc does the same).
    if (!KeepSimulating(starts_, {}, 0.0)) break;
    n *= 2;
  }
  const double t0 = starts_[n - 2], t1 = starts_[n - 1];
  const double period = t1 - t0;
  SimulationResult result;
  Record record(t0, t1, static_accelerator_, static_host_,
                record_timeline ? &result.timeline : nullptr);
  record.prefix_after.assign(L, 0.0);
  record.prefix_before.assign(L, 0.0);
  RunOnce(n, &record);
  result.iterations_simulated = n;
  result.accelerator_resident_bytes = static_accelerator_;

  tandem::v1::PlanPrediction& p = result.prediction;
  const double reported = ReportedPeriod(starts_, {}, 0.0);
  p.set_iteration_seconds(reported);
  p.set_samples_per_second(reported > 0 ? batch_size_ / reported : 0.0);
  p.set_accelerator_idle_seconds(period - record.acc_busy);
  p.set_h2d_idle_seconds(period - record.h2d_busy);
  p.set_d2h_idle_seconds(period - record.d2h_busy);
  p.set_host_update_idle_seconds(period - record.pool_busy);
  p.set_host_compute_idle_seconds(period - record.host_busy);
  p.set_accelerator_stall_seconds(0);
  p.set_h2d_bytes(record.h2d_bytes);
  p.set_d2h_bytes(record.d2h_bytes);
  p.set_accelerator_peak_bytes(record.acc_memory.Finish(t1));
  p.set_host_peak_bytes(record.host_memory.Finish(t1));
  if (record_timeline) {
    result.timeline.set_iteration_seconds(period);
    result.timeline.set_source("simulated");
  }
  result.layers.resize(L);
  for (int l = 0; l < L; ++l) {
    result.layers[l].reuse_distance_seconds = record.prefix_before[l] - record.prefix_after[l];
  }
  return result;
}

}  // namespace tandem::planner
