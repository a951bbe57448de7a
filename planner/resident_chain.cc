#include "planner/resident_chain.h"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tandem::planner {
namespace {

using tandem::v1::TimelinePhase;
using tandem::v1::TimelineResource;

constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;

}  // namespace

// What the full simulation keeps besides the times: the reported iteration's
// spans, busy time, stall and bytes, the copy-engine and host-pool spans that
// may overlap its window, and per layer the figures its reuse distance and
// slack are read from.
struct ResidentChain::Record : ChainTimeline {
  struct Interval {
    double start, end;
  };
  double compute_busy = 0;
  double stall = 0;
  int64_t h2d_bytes = 0, d2h_bytes = 0;
  std::vector<Interval> d2h, pool, h2d;
  std::vector<double> backward_end, delivered, prefix_after, prefix_before;
  int64_t peak = 0;

  // A compute span of the reported iteration: all of it lies in the window.
  void Compute(TimelinePhase phase, int layer, int micro_batch, double start, double end,
               int64_t bytes = 0) {
    if (end > start) compute_busy += end - start;
    Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, phase, layer, micro_batch, start, end,
         bytes);
  }
};

bool ResidentChain::Covers(const Decisions& s) {
  if (s.strategy == tandem::v1::STRATEGY_HETERO_DP || s.layers.empty()) return false;
  for (const LayerDecisions& l : s.layers) {
    if (l.compute != kAcc || l.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR ||
        l.activation == tandem::v1::ACTIVATION_POLICY_OFFLOAD || l.stream_state) {
      return false;
    }
  }
  return true;
}

ResidentChain::ResidentChain(const CostModel& cost, const Decisions& base)
    : clip_(cost.clips_gradients()),
      micro_batches_(base.micro_batches()),
      delayed_(base.delayed_parameter_update),
      batch_size_(base.batch_size) {
  const int m = base.micro_batch_size;
  const int L = cost.num_layers();
  layers_.resize(L);
  for (int l = 0; l < L; ++l) {
    ResidentLayer& x = layers_[l];
    static_cast<ChainLayerCosts&>(x) =
        ChainLayerCostsOf(cost, l, m, base.host_update_threads,
                          base.layers[l].activation == tandem::v1::ACTIVATION_POLICY_RECOMPUTE);
    x.param_h2d = cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, x.param);
    static_accelerator_params_ += x.param;
  }
}

// One RunOnce, walked in the event graph's creation order: what it feeds,
// where each resource is, and the iteration under way.
struct ResidentChain::Pass {
  const std::vector<bool>& acc;
  WindowLevel* memory;
  Record* record;
  // A host update's weights are waited for `lag` iterations after its
  // gradient (2 with delayed parameter updates).
  int lag;
  // Gradient frees on the D2H engine come later than the backward that
  // issues them but in FIFO order: they wait here until the compute stream's
  // changes reach their time. The first not yet fed is next_free.
  std::vector<MemoryChange>* pending_frees;
  size_t next_free = 0;
  // Under clipping: when each host-updated layer's gradient copy down ended
  // (scratch of the chain's, by layer).
  std::vector<double>& d2h_of;
  // The compute stream's clock, and when each copy engine and the host pool
  // are next free.
  double t = 0, d2h_free = 0, pool_free = 0, h2d_free = 0;
  // The program's durations summed in order (the event graph's
  // program_prefix), for reuse distances.
  double prefix = 0;
  // The iteration under way: the record when it is the reported one; whether
  // its chain spans may overlap the reported window; where its host-updated
  // weights return, and where those of the iteration `lag` before returned
  // (null for the first ones).
  Record* window = nullptr;
  bool keep_chain = false;
  double* returned_now = nullptr;
  const double* returned_then = nullptr;

  void FlushFrees(double until) {
    while (next_free < pending_frees->size() && (*pending_frees)[next_free].time_seconds <= until) {
      FeedNextFree();
    }
  }
  void FeedNextFree() {
    memory->Feed((*pending_frees)[next_free].time_seconds, (*pending_frees)[next_free].delta_bytes);
    ++next_free;
  }
  void Change(double at, int64_t delta) {
    if (memory == nullptr || delta == 0) return;
    FlushFrees(at);
    memory->Feed(at, delta);
  }
  // The reported iteration starts at `start`.
  void OpenWindow(double start) {
    if (memory != nullptr) memory->SetWindowStart(start);
    if (record != nullptr) record->t0 = start;
  }
};

void ResidentChain::RunOnce(const std::vector<bool>& acc, int n, WindowLevel* memory,
                            Record* record) {
  const int lag = delayed_ ? 2 : 1;
  starts_.assign(n, 0.0);
  finishes_.assign(n, 0.0);
  returned_.assign(static_cast<size_t>(lag + 1) * num_layers(), 0.0);
  pending_frees_.clear();
  d2h_of_.assign(num_layers(), 0.0);
  Pass p{acc, memory, record, lag, &pending_frees_, 0, d2h_of_};
  for (int i = 0; i < n; ++i) {
    BeginIteration(&p, i, n);
    starts_[i] = ForwardStart(p, 0, 0);
    if (i == n - 2) p.OpenWindow(starts_[i]);
    if (i == n - 1) {
      StopAt(&p, starts_[i]);
      return;
    }
    for (int j = 0; j < micro_batches_; ++j) {
      Forwards(&p, j);
      Backwards(&p, j);
    }
    // Its last operation: the compute stream's, or the last weights copied
    // up (every chain ends there, and the last one last).
    finishes_[i] = std::max(p.t, p.h2d_free);
  }
}

void ResidentChain::BeginIteration(Pass* p, int i, int n) {
  const int L = num_layers();
  const int lag = p->lag;
  const int k = n - 2;
  p->window = p->record != nullptr && i == k ? p->record : nullptr;
  p->keep_chain = p->record != nullptr && i >= k - 2;
  p->returned_now = &returned_[static_cast<size_t>(i % (lag + 1)) * L];
  p->returned_then =
      i - lag >= 0 ? &returned_[static_cast<size_t>((i - lag) % (lag + 1)) * L] : nullptr;
}

double ResidentChain::ForwardStart(const Pass& p, int j, int l) const {
  const ResidentLayer& x = layers_[l];
  const bool waits = j == 0 && p.returned_then != nullptr && x.has_params && !p.acc[l];
  return waits ? std::max(p.t, p.returned_then[l]) : p.t;
}

void ResidentChain::StopAt(Pass* p, double start) {
  // Nothing at or after the last iteration's start is reported; only where
  // its forwards sit in the program (reuse distances).
  if (p->record != nullptr) {
    for (int f = 0; f < num_layers(); ++f) {
      p->record->prefix_before[f] = p->prefix;
      p->prefix += layers_[f].fwd;
    }
  }
  if (p->memory == nullptr) return;
  while (p->next_free < p->pending_frees->size() &&
         p->memory->Inside((*p->pending_frees)[p->next_free].time_seconds, start)) {
    p->FeedNextFree();
  }
  const int64_t peak = p->memory->Finish(start);
  if (p->record != nullptr) p->record->peak = peak;
}

void ResidentChain::Forwards(Pass* p, int j) {
  const int L = num_layers();
  for (int l = 0; l < L; ++l) {
    const ResidentLayer& x = layers_[l];
    const double start = ForwardStart(*p, j, l);
    // Waiting for the layer's weights stalls the stream.
    if (p->window != nullptr && start > p->t) p->window->stall += start - p->t;
    const double end = start + x.fwd;
    p->Change(start, x.act + x.ws);
    p->Change(end, -x.ws);
    if (l > 0 && layers_[l - 1].recompute) {
      p->Change(end, -(layers_[l - 1].act - layers_[l - 1].ckpt));
    }
    if (l == L - 1 && x.recompute) p->Change(end, -(x.act - x.ckpt));
    if (p->window != nullptr) {
      p->window->Compute(tandem::v1::TIMELINE_PHASE_FORWARD, l, j, start, end);
    }
    p->prefix += x.fwd;
    p->t = end;
  }
}

void ResidentChain::Backwards(Pass* p, int j) {
  for (int l = num_layers() - 1; l >= 0; --l) {
    const ResidentLayer& x = layers_[l];
    if (x.recompute) {
      const double start = p->t, end = p->t + x.fwd;
      p->Change(start, x.act - x.ckpt + x.ws);
      p->Change(end, -x.ws);
      if (p->window != nullptr) {
        p->window->Compute(tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, j, start, end);
      }
      p->prefix += x.fwd;
      p->t = end;
    }
    const double start = p->t, end = p->t + x.bwd;
    p->Change(start, x.ws + (j == 0 ? x.grad : 0));
    p->Change(end, -x.ws - x.act);
    if (p->window != nullptr) {
      p->window->Compute(tandem::v1::TIMELINE_PHASE_BACKWARD, l, j, start, end);
    }
    p->prefix += x.bwd;
    p->t = end;
    if (j != micro_batches_ - 1) continue;
    if (p->window != nullptr) {
      p->window->backward_end[l] = end;
      p->window->prefix_after[l] = p->prefix;
    }
    if (!x.has_params) continue;
    if (clip_) {
      // Its gradient goes down now; the updates wait for the norm.
      if (!p->acc[l]) GradientDown(p, l, j);
    } else if (p->acc[l]) {
      AcceleratorUpdate(p, l, j);
    } else {
      HostUpdate(p, l, j);
    }
  }
  if (clip_ && j == micro_batches_ - 1) UpdatesAfterTheNorm(p, j);
}

void ResidentChain::UpdatesAfterTheNorm(Pass* p, int j) {
  // GRADIENT_NORM on the compute stream, once the last backward and every
  // gradient copy down have ended (the D2H engine's last); it takes no time.
  const double norm = std::max(p->t, p->d2h_free);
  if (p->window != nullptr) {
    p->window->Compute(tandem::v1::TIMELINE_PHASE_UPDATE, -1, j, norm, norm);
  }
  p->t = norm;
  for (int l = num_layers() - 1; l >= 0; --l) {
    if (!layers_[l].has_params) continue;
    if (p->acc[l]) {
      AcceleratorUpdate(p, l, j);
    } else {
      HostUpdateFrom(p, l, j, std::max(p->d2h_of[l], norm));
    }
  }
}

void ResidentChain::AcceleratorUpdate(Pass* p, int l, int j) {
  const ResidentLayer& x = layers_[l];
  const double update_end = p->t + x.upd_acc;
  p->Change(update_end, -x.grad);
  if (p->window != nullptr) {
    p->window->Compute(tandem::v1::TIMELINE_PHASE_UPDATE, l, j, p->t, update_end, x.update_bytes);
  }
  p->prefix += x.upd_acc;
  if (p->window != nullptr) p->window->prefix_after[l] = p->prefix;
  p->t = update_end;
}

void ResidentChain::HostUpdate(Pass* p, int l, int j) {
  GradientDown(p, l, j);
  HostUpdateFrom(p, l, j, p->d2h_free);
}

void ResidentChain::GradientDown(Pass* p, int l, int j) {
  const ResidentLayer& x = layers_[l];
  const double d2h_start = std::max(p->t, p->d2h_free);
  p->d2h_free = d2h_start + x.grad_d2h;
  p->d2h_of[l] = p->d2h_free;
  if (p->memory != nullptr && x.grad != 0) p->pending_frees->push_back({p->d2h_free, -x.grad});
  if (p->keep_chain) p->record->d2h.push_back({d2h_start, p->d2h_free});
  if (p->window == nullptr) return;
  p->window->Span(tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H,
                  l, j, d2h_start, p->d2h_free, x.grad);
  p->window->d2h_bytes += x.grad;
}

void ResidentChain::HostUpdateFrom(Pass* p, int l, int j, double ready) {
  const ResidentLayer& x = layers_[l];
  const double pool_start = std::max(ready, p->pool_free);
  p->pool_free = pool_start + x.upd_host;
  const double h2d_start = std::max(p->pool_free, p->h2d_free);
  p->h2d_free = h2d_start + x.param_h2d;
  p->returned_now[l] = p->h2d_free;
  if (p->keep_chain) {
    p->record->pool.push_back({pool_start, p->pool_free});
    p->record->h2d.push_back({h2d_start, p->h2d_free});
  }
  Record* window = p->window;
  if (window == nullptr) return;
  window->Span(tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE, l, j,
               pool_start, p->pool_free, x.update_bytes);
  window->Span(tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l,
               j, h2d_start, p->h2d_free, x.param);
  window->h2d_bytes += x.param;
  window->delivered[l] = p->h2d_free;
}

std::vector<double> ResidentChain::ResourceWork(const std::vector<bool>& acc) const {
  double compute = 0, d2h = 0, pool = 0, h2d = 0;
  for (int j = 0; j < micro_batches_; ++j) {
    for (const ResidentLayer& x : layers_) compute += x.fwd + (x.recompute ? x.fwd : 0) + x.bwd;
  }
  for (int l = 0; l < num_layers(); ++l) {
    const ResidentLayer& x = layers_[l];
    if (!x.has_params) continue;
    if (acc[l]) {
      compute += x.upd_acc;
    } else {
      d2h += x.grad_d2h;
      pool += x.upd_host;
      h2d += x.param_h2d;
    }
  }
  std::vector<double> work(tandem::v1::TimelineResource_ARRAYSIZE, 0.0);
  work[tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE] = compute;
  work[tandem::v1::TIMELINE_RESOURCE_COPY_D2H] = d2h;
  work[tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE] = pool;
  work[tandem::v1::TIMELINE_RESOURCE_COPY_H2D] = h2d;
  return work;
}

ResidentChain::Timing ResidentChain::Run(const std::vector<bool>& acc, bool need_peak) {
  int64_t base = static_accelerator_params_;
  for (int l = 0; l < num_layers(); ++l) {
    if (layers_[l].has_params && acc[l]) base += layers_[l].opt;
  }
  const std::vector<double> work = ResourceWork(acc);
  const double busiest = *std::max_element(work.begin(), work.end());
  int n = InitialSimulatedIterations(delayed_);
  Timing timing;
  while (true) {
    WindowLevel memory(base, nullptr);
    RunOnce(acc, n, need_peak ? &memory : nullptr, nullptr);
    if (need_peak) timing.accelerator_peak_bytes = memory.peak();
    if (!KeepSimulating(starts_, finishes_, busiest)) break;
    n *= 2;
  }
  timing.iteration_seconds = ReportedPeriod(starts_, finishes_, busiest);
  return timing;
}

SimulationResult ResidentChain::Simulate(const std::vector<bool>& acc, bool record_timeline) {
  const int L = num_layers();
  int64_t static_acc = static_accelerator_params_, static_host = 0;
  for (int l = 0; l < L; ++l) {
    const ResidentLayer& x = layers_[l];
    if (!x.has_params) continue;
    if (acc[l]) {
      static_acc += x.opt;
    } else {
      static_host += x.param + x.grad + x.opt;
    }
  }
  SimulationResult result;
  Record record;
  std::vector<double> work = ResourceWork(acc);
  const double busiest = *std::max_element(work.begin(), work.end());
  int n = InitialSimulatedIterations(delayed_);
  while (true) {
    result = SimulationResult();
    record = Record();
    record.timeline = record_timeline ? &result.timeline : nullptr;
    record.backward_end.assign(L, 0.0);
    record.delivered.assign(L, 0.0);
    record.prefix_after.assign(L, 0.0);
    record.prefix_before.assign(L, 0.0);
    WindowLevel memory(static_acc,
                       record_timeline ? result.timeline.mutable_accelerator_memory() : nullptr);
    RunOnce(acc, n, &memory, &record);
    if (!KeepSimulating(starts_, finishes_, busiest)) break;
    n *= 2;
  }
  const double t0 = starts_[n - 2], t1 = starts_[n - 1];
  const double period = t1 - t0;
  result.iterations_simulated = n;
  result.accelerator_resident_bytes = static_acc;
  result.resource_work_seconds = std::move(work);

  // Busy time of each FIFO resource inside the window, its spans in creation
  // order as the event graph sums them.
  auto busy = [&](const std::vector<Record::Interval>& spans) {
    double sum = 0;
    for (const Record::Interval& s : spans) {
      const double a = std::max(s.start, t0), b = std::min(s.end, t1);
      if (b > a) sum += b - a;
    }
    return sum;
  };
  tandem::v1::PlanPrediction& p = result.prediction;
  const double reported = ReportedPeriod(starts_, finishes_, busiest);
  p.set_iteration_seconds(reported);
  p.set_samples_per_second(reported > 0 ? batch_size_ / reported : 0.0);
  p.set_accelerator_idle_seconds(period - record.compute_busy);
  p.set_h2d_idle_seconds(period - busy(record.h2d));
  p.set_d2h_idle_seconds(period - busy(record.d2h));
  p.set_host_update_idle_seconds(period - busy(record.pool));
  p.set_host_compute_idle_seconds(period - 0.0);
  p.set_accelerator_stall_seconds(record.stall);
  p.set_h2d_bytes(record.h2d_bytes);
  p.set_d2h_bytes(record.d2h_bytes);
  p.set_accelerator_peak_bytes(record.peak);
  tandem::v1::Timeline* timeline = record_timeline ? &result.timeline : nullptr;
  p.set_host_peak_bytes(
      PeakInWindow({}, static_host, t0, t1, timeline ? timeline->mutable_host_memory() : nullptr));
  if (timeline != nullptr) {
    timeline->set_iteration_seconds(period);
    timeline->set_source("simulated");
  }

  result.layers.resize(L);
  for (int l = 0; l < L; ++l) {
    LayerTiming& timing = result.layers[l];
    timing.reuse_distance_seconds = record.prefix_before[l] - record.prefix_after[l];
    if (!layers_[l].has_params || acc[l]) continue;
    const double deadline = timing.reuse_distance_seconds + (delayed_ ? period : 0.0);
    timing.slack_seconds = deadline - (record.delivered[l] - record.backward_end[l]);
  }
  return result;
}

}  // namespace tandem::planner
