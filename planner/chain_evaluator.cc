#include "planner/chain_evaluator.h"

#include <algorithm>

#include "planner/steady_state.h"

namespace tandem::planner {

ChainEvaluator::ChainEvaluator(const CostModel& cost, const Decisions& base)
    : chain_(cost, base), clip_(cost.clips_gradients()) {
  const int L = chain_.num_layers();
  const int M = chain_.micro_batches();
  layers_.resize(L);
  double forward = 0, backward_no_updates = 0, chain_seconds = 0;
  for (int l = 0; l < L; ++l) {
    const ResidentLayer& x = chain_.layer(l);
    Layer& y = layers_[l];
    y.recompute_seconds = x.recompute ? x.fwd : 0.0;
    y.backward_seconds = x.bwd;
    y.upd_acc = x.upd_acc;
    y.upd_host = x.upd_host;
    y.grad_d2h = x.grad_d2h;
    y.param_h2d = x.param_h2d;
    y.grad = x.grad;
    y.opt = x.opt;
    y.has_params = x.has_params;
    y.forward_start = forward;
    forward += x.fwd;
    backward_no_updates += x.bwd + (x.recompute ? x.fwd : 0.0);
    if (x.has_params) chain_seconds += x.upd_acc + x.grad_d2h + x.upd_host + x.param_h2d;
    resident_bytes_ += x.param;
  }
  program_before_last_backward_ = M * forward + (M - 1) * backward_no_updates;
  double after = 0;
  for (int l = 0; l < L; ++l) {
    layers_[l].compute_after = after;
    after += layers_[l].recompute_seconds + layers_[l].backward_seconds;
  }

  // Every iteration's program and chain run in less than all of its spans
  // back to back; simulated times stay below 64 such iterations.
  const double longest = M * (forward + backward_no_updates) + chain_seconds;
  time_tolerance_ = 1e-7 * longest;
  // A span this long or longer ends strictly after it starts, in doubles.
  const double visible = 64 * 1e-13 * longest;

  // The compute stream's changes of one iteration with no gradient leaving:
  // (a) at span starts before the last micro-batch's backward, (b) at its
  // BACKWARD starts less the gradients of the layers above.
  int64_t level = 0;
  auto instant = [&](double duration) {
    if (duration > visible) early_level_bytes_ = std::max(early_level_bytes_, level);
  };
  for (int j = 0; j < M; ++j) {
    for (int l = 0; l < L; ++l) {
      const ResidentLayer& x = chain_.layer(l);
      level += x.act + x.ws;
      instant(x.fwd);
      level -= x.ws;
      if (l > 0 && chain_.layer(l - 1).recompute) {
        level -= chain_.layer(l - 1).act - chain_.layer(l - 1).ckpt;
      }
      if (l == L - 1 && x.recompute) level -= x.act - x.ckpt;
    }
    const bool last = j == M - 1;
    int64_t gone = 0;
    for (int l = L - 1; l >= 0; --l) {
      const ResidentLayer& x = chain_.layer(l);
      if (x.recompute) {
        level += x.act - x.ckpt + x.ws;
        if (!last) instant(x.fwd);
        level -= x.ws;
      }
      level += x.ws + (j == 0 ? x.grad : 0);
      if (last) {
        layers_[l].level_at_backward = level - gone;
        layers_[l].level_counts = x.bwd > visible;
      } else {
        instant(x.bwd);
      }
      level -= x.ws + x.act;
      if (last && x.has_params) gone += x.grad;
    }
  }
}

double ChainEvaluator::ClosedFormSeconds(const std::vector<bool>& acc) const {
  if (clip_) return ClippedClosedFormSeconds(acc);
  double t = program_before_last_backward_;
  double d2h_free = 0, pool_free = 0, h2d_free = 0, latest = 0;
  for (int l = static_cast<int>(layers_.size()) - 1; l >= 0; --l) {
    const Layer& x = layers_[l];
    t = t + x.recompute_seconds + x.backward_seconds;
    if (!x.has_params) continue;
    if (acc[l]) {
      t += x.upd_acc;
      continue;
    }
    d2h_free = std::max(t, d2h_free) + x.grad_d2h;
    pool_free = std::max(d2h_free, pool_free) + x.upd_host;
    h2d_free = std::max(pool_free, h2d_free) + x.param_h2d;
    latest = std::max(latest, h2d_free - x.forward_start);
  }
  return std::max(t, latest);
}

double ChainEvaluator::ClippedClosedFormSeconds(const std::vector<bool>& acc) const {
  // The gradients go down during the last backward; the norm waits for the
  // last of them; then every update, L-1 first: the accelerator's on the
  // stream, the host's chains from the norm.
  const int L = static_cast<int>(layers_.size());
  double t = program_before_last_backward_, d2h_free = 0;
  for (int l = L - 1; l >= 0; --l) {
    const Layer& x = layers_[l];
    t = t + x.recompute_seconds + x.backward_seconds;
    if (x.has_params && !acc[l]) d2h_free = std::max(t, d2h_free) + x.grad_d2h;
  }
  const double norm = std::max(t, d2h_free);
  t = norm;
  double pool_free = 0, h2d_free = 0, latest = 0;
  for (int l = L - 1; l >= 0; --l) {
    const Layer& x = layers_[l];
    if (!x.has_params) continue;
    if (acc[l]) {
      t += x.upd_acc;
      continue;
    }
    pool_free = std::max(norm, pool_free) + x.upd_host;
    h2d_free = std::max(pool_free, h2d_free) + x.param_h2d;
    latest = std::max(latest, h2d_free - x.forward_start);
  }
  return std::max(t, latest);
}

ChainEvaluator::Estimate ChainEvaluator::Estimated(const std::vector<bool>& acc) {
  const int L = static_cast<int>(layers_.size());
  queue_end_.clear();
  queue_bytes_.clear();
  size_t head = 0;
  // Under clipping the accelerator-updated layers' gradients stay until
  // their updates, after the last backward.
  int64_t waiting = 0, held = 0, optimizer = 0, dynamic = early_level_bytes_;
  double t = program_before_last_backward_;
  double d2h_free = 0, pool_free = 0, h2d_free = 0, latest = 0;
  for (int l = L - 1; l >= 0; --l) {
    const Layer& x = layers_[l];
    const double backward_start = t + x.recompute_seconds;
    while (head < queue_end_.size() && queue_end_[head] <= backward_start + time_tolerance_) {
      waiting -= queue_bytes_[head++];
    }
    if (x.level_counts) dynamic = std::max(dynamic, x.level_at_backward + waiting + held);
    t = backward_start + x.backward_seconds;
    if (!x.has_params) continue;
    if (acc[l]) {
      if (!clip_) t += x.upd_acc;
      if (clip_) held += x.grad;
      optimizer += x.opt;
      continue;
    }
    d2h_free = std::max(t, d2h_free) + x.grad_d2h;
    if (!clip_) {
      pool_free = std::max(d2h_free, pool_free) + x.upd_host;
      h2d_free = std::max(pool_free, h2d_free) + x.param_h2d;
      latest = std::max(latest, h2d_free - x.forward_start);
    }
    if (x.grad != 0) {
      queue_end_.push_back(d2h_free);
      queue_bytes_.push_back(x.grad);
      waiting += x.grad;
    }
  }
  return {clip_ ? ClippedClosedFormSeconds(acc) : std::max(t, latest),
          resident_bytes_ + optimizer + dynamic};
}

PlacementScore ChainEvaluator::Score(const std::vector<bool>& acc, bool need_peak) {
  const bool delayed = chain_.delayed_parameter_update();
  if (!need_peak) {
    return {delayed ? chain_.Run(acc, false).iteration_seconds : ClosedFormSeconds(acc), -1};
  }
  auto cached = peaks_.find(acc);
  if (cached != peaks_.end()) return cached->second;
  const Estimate estimate = Estimated(acc);
  if (estimate.peak_lower_bound_bytes > peak_limit_) {
    return {delayed ? chain_.Run(acc, false).iteration_seconds : estimate.iteration_seconds,
            estimate.peak_lower_bound_bytes};
  }
  ++exact_runs_;
  const ResidentChain::Timing exact = chain_.Run(acc, true);
  const PlacementScore score = {exact.iteration_seconds, exact.accelerator_peak_bytes};
  peaks_.emplace(acc, score);
  return score;
}

}  // namespace tandem::planner
