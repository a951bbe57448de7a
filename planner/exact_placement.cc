#include "planner/exact_placement.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "planner/steady_state.h"

namespace tandem::planner {
namespace {

bool Shorter(double a, double b) { return a < b - 1e-12 * std::max(1.0, std::fabs(b)); }

// What the layers fixed so far determine.
struct State {
  double t = 0;  // compute stream
  double d2h = 0, pool = 0, h2d = 0, latest = 0;
  int64_t optimizer = 0;
  int64_t level = 0;       // the largest level reached, less static bytes
  int head = 0, tail = 0;  // D2H copies not yet ended: queue[head, tail)
  int64_t waiting = 0;     // their gradient bytes
  // Under clipping: the accelerator updates decided so far, which run after
  // the norm, and the gradients they hold until then.
  double acc_updates = 0;
  int64_t held = 0;
};

struct Child {
  State state;
  double time_bound = 0;
  bool on_accelerator = false;
  // The D2H copy this child adds to the queue (end time), if any.
  double copy_end = 0;
  bool adds_copy = false;
};

class BranchAndBound {
 public:
  BranchAndBound(ChainEvaluator* evaluator, const std::vector<bool>& eligible, int64_t budget,
                 int64_t max_nodes, int64_t max_work)
      : ev_(*evaluator),
        evaluator_(evaluator),
        layers_(evaluator->layers()),
        eligible_(eligible),
        budget_(budget),
        max_nodes_(max_nodes),
        max_work_(max_work),
        delayed_(evaluator->delayed_parameter_update()),
        clip_(evaluator->clips_gradients()) {
    const int L = static_cast<int>(layers_.size());
    later_level_.assign(L + 1, INT64_MIN);
    for (int l = 0; l < L; ++l) {
      later_level_[l + 1] = later_level_[l];
      if (layers_[l].level_counts) {
        later_level_[l + 1] = std::max(later_level_[l + 1], layers_[l].level_at_backward);
      }
    }
    run_cost_ = static_cast<int64_t>(InitialSimulatedIterations(delayed_)) *
                evaluator->micro_batches() * std::max(1, L);
    children_.resize(L);
    count_.assign(L, 0);
    next_.assign(L, 0);
    choice_.assign(L, 0);
    queue_end_.assign(L, 0.0);
    queue_bytes_.assign(L, 0);
  }

  void Seed(const std::vector<bool>& start) {
    if (start.empty()) return;
    const PlacementScore s = evaluator_->Score(start, /*need_peak=*/true);
    if (s.accelerator_peak_bytes > budget_) return;
    best_ = start;
    best_seconds_ = delayed_ ? s.iteration_seconds : ev_.ClosedFormSeconds(start);
    have_best_ = true;
  }

  ExactPlacementResult Run() {
    ExactPlacementResult result;
    const int L = static_cast<int>(layers_.size());
    const int64_t runs_before = evaluator_->exact_runs();
    State root;
    root.t = ev_.program_before_last_backward();
    root.level = ev_.early_level_bytes();
    bool complete = true;
    if (L > 0) {
      Expand(L - 1, root);
      int l = L - 1;
      while (true) {
        if (next_[l] == count_[l]) {
          if (++l == L) break;
          continue;
        }
        const Child& c = children_[l][next_[l]++];
        if (have_best_ && !Shorter(c.time_bound, best_seconds_)) continue;
        choice_[l] = c.on_accelerator;
        if (c.adds_copy) {
          queue_end_[c.state.tail - 1] = c.copy_end;
          queue_bytes_[c.state.tail - 1] = layers_[l].grad;
        }
        if (l == 0) {
          Leaf(c);
        } else {
          Expand(l - 1, c.state);
          --l;
        }
        if (nodes_ >= max_nodes_ ||
            work_ + (evaluator_->exact_runs() - runs_before) * run_cost_ > max_work_) {
          complete = false;
          break;
        }
      }
    }
    result.complete = complete;
    result.improved = improved_;
    if (improved_) result.on_accelerator = best_;
    result.nodes = nodes_;
    result.exact_runs = evaluator_->exact_runs() - runs_before;
    result.work = work_ + result.exact_runs * run_cost_;
    return result;
  }

 private:
  // The children of the node that fixes the layers above `l`.
  void Expand(int l, const State& parent) {
    ++nodes_;
    ++work_;
    const ChainEvaluator::Layer& x = layers_[l];
    State s = parent;
    const double backward_start = s.t + x.recompute_seconds;
    while (s.head < s.tail && queue_end_[s.head] <= backward_start + ev_.time_tolerance()) {
      s.waiting -= queue_bytes_[s.head++];
    }
    if (x.level_counts) s.level = std::max(s.level, x.level_at_backward + s.waiting + s.held);
    s.t = backward_start + x.backward_seconds;
    count_[l] = 0;
    next_[l] = 0;
    if (!x.has_params) {
      Offer(l, s, false, 0, false);
      return;
    }
    if (eligible_[l]) {
      State a = s;
      if (clip_) {
        a.acc_updates += x.upd_acc;
        a.held += x.grad;
      } else {
        a.t += x.upd_acc;
      }
      a.optimizer += x.opt;
      Offer(l, a, true, 0, false);
    }
    State h = s;
    h.d2h = std::max(h.t, h.d2h) + x.grad_d2h;
    // Under clipping the host chains start at the norm, known at the leaf.
    if (!clip_) {
      h.pool = std::max(h.d2h, h.pool) + x.upd_host;
      h.h2d = std::max(h.pool, h.h2d) + x.param_h2d;
      h.latest = std::max(h.latest, h.h2d - x.forward_start);
    }
    const bool adds_copy = x.grad != 0;
    if (adds_copy) {
      ++h.tail;
      h.waiting += x.grad;
    }
    Offer(l, h, false, h.d2h, adds_copy);
    if (count_[l] == 2 && children_[l][1].time_bound < children_[l][0].time_bound) {
      std::swap(children_[l][0], children_[l][1]);
    }
  }

  void Offer(int l, const State& s, bool on_accelerator, double copy_end, bool adds_copy) {
    const ChainEvaluator::Layer& x = layers_[l];
    // The gradients clipping holds stay past every later backward.
    const int64_t level = std::max(s.level, later_level_[l] + s.held);
    if (ev_.resident_bytes() + s.optimizer + level > budget_) return;
    // With delayed updates the simulator reports the period at which two
    // consecutive iterations agree, which may still be a transient (a copy
    // engine's backlog growing too slowly to stall yet): only the compute
    // stream bounds it. Under clipping it runs the rest of backward, waits
    // for the norm (every gradient down) and runs the accelerator updates.
    const double bound = clip_      ? std::max(s.t + x.compute_after, s.d2h) + s.acc_updates
                         : delayed_ ? s.t + x.compute_after
                                    : std::max(s.t + x.compute_after, s.latest);
    if (have_best_ && !Shorter(bound, best_seconds_)) return;
    Child& c = children_[l][count_[l]++];
    c.state = s;
    c.time_bound = bound;
    c.on_accelerator = on_accelerator;
    c.copy_end = copy_end;
    c.adds_copy = adds_copy;
  }

  void Leaf(const Child& c) {
    const State& s = c.state;
    std::vector<bool> acc(layers_.size());
    for (size_t l = 0; l < layers_.size(); ++l) acc[l] = choice_[l] != 0;
    const double closed_form = clip_ ? ev_.ClosedFormSeconds(acc) : std::max(s.t, s.latest);
    if (!delayed_ && have_best_ && !Shorter(closed_form, best_seconds_)) return;
    const PlacementScore score = evaluator_->Score(acc, /*need_peak=*/true);
    if (score.accelerator_peak_bytes > budget_) return;
    const double seconds = delayed_ ? score.iteration_seconds : closed_form;
    if (have_best_ && !Shorter(seconds, best_seconds_)) return;
    best_ = std::move(acc);
    best_seconds_ = seconds;
    have_best_ = true;
    improved_ = true;
  }

  const ChainEvaluator& ev_;
  ChainEvaluator* evaluator_;
  const std::vector<ChainEvaluator::Layer>& layers_;
  const std::vector<bool>& eligible_;
  const int64_t budget_;
  const int64_t max_nodes_;
  const int64_t max_work_;
  const bool delayed_;
  const bool clip_;
  // later_level_[l]: the largest level_at_backward among layers below l.
  std::vector<int64_t> later_level_;
  int64_t run_cost_ = 0;

  std::vector<std::array<Child, 2>> children_;
  std::vector<int> count_, next_;
  std::vector<uint8_t> choice_;
  std::vector<double> queue_end_;
  std::vector<int64_t> queue_bytes_;

  bool have_best_ = false;
  bool improved_ = false;
  std::vector<bool> best_;
  double best_seconds_ = 0;
  int64_t nodes_ = 0;
  int64_t work_ = 0;
};

}  // namespace

ExactPlacementResult SearchExactPlacement(ChainEvaluator* evaluator,
                                          const std::vector<bool>& eligible, int64_t budget_bytes,
                                          const std::vector<bool>& start, int64_t max_nodes,
                                          int64_t max_work) {
  evaluator->set_peak_limit(budget_bytes);
  BranchAndBound search(evaluator, eligible, budget_bytes, max_nodes, max_work);
  search.Seed(start);
  return search.Run();
}

}  // namespace tandem::planner
