// ChainEvaluator scores "these layers update on the accelerator, the others on
// the host" for a schedule ResidentChain covers (resident weights, activations
// kept or recomputed), for the update-placement search (update_placement.h).
//
// Three answers, from cheap to exact:
//
//   Estimate   one O(layers) pass over the last micro-batch's backward.
//              Without delayed updates its time is the steady period in
//              closed form: each iteration's gradient chain starts on idle
//              resources (the previous chain of layer l ended before its
//              forward), so measured on an unstalled iteration with program
//              time P and layer l's forward starting at F_l, the next
//              iteration waits for the latest weights:
//                  T = max(P, max_l (returned_l - F_l)),
//              equal to the simulator's period up to rounding (1e-12
//              relative; a test holds it to that). Its peak is a lower bound:
//              resident weights, accelerator optimizer state, and the largest
//              of (a) the level at any compute span's start before the last
//              micro-batch's backward, less nothing (no gradient has left
//              yet), and (b) the level when BACKWARD(l, M-1) starts: the
//              activations and workspace then held, every gradient allocated,
//              less those already gone (accelerator-updated layers above l,
//              host-updated ones whose D2H copy has ended; under clipping
//              the accelerator-updated ones stay until after the norm).
//   Score      the iteration time and, when asked, the exact accelerator peak
//              (ResidentChain::Run, equal to PlanSimulator to the last bit),
//              unless the estimate's bound already exceeds the peak limit.
//
// The per-layer figures of the estimate are public for the exact search.
//
// Keeps scratch buffers and a cache of exact peaks: one instance per thread.
#ifndef TANDEM_PLANNER_CHAIN_EVALUATOR_H_
#define TANDEM_PLANNER_CHAIN_EVALUATOR_H_

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "planner/resident_chain.h"

namespace tandem::planner {

struct PlacementScore {
  double iteration_seconds = 0;
  // Only when asked for; -1 otherwise.
  int64_t accelerator_peak_bytes = -1;
};

class ChainEvaluator {
 public:
  // Whether `schedule` is in the class this evaluator is exact for.
  // The schedules ResidentChain covers, with or without gradient clipping
  // (CostModel::clips_gradients: then the closed form starts every update
  // at the norm, after the last backward and every gradient's copy down,
  // and the peak's bound keeps the accelerator-updated gradients until
  // then).
  static bool Supports(const CostModel& /*cost*/, const Decisions& schedule) {
    return ResidentChain::Covers(schedule);
  }

  // `base` gives everything but the update placements; it must be Supported.
  ChainEvaluator(const CostModel& cost, const Decisions& base);

  struct Estimate {
    // The closed-form period; without delayed updates only.
    double iteration_seconds = 0;
    // A lower bound on the accelerator peak.
    int64_t peak_lower_bound_bytes = 0;
  };
  Estimate Estimated(const std::vector<bool>& on_accelerator);
  // The estimate's time alone.
  double ClosedFormSeconds(const std::vector<bool>& on_accelerator) const;

  PlacementScore Score(const std::vector<bool>& on_accelerator, bool need_peak);

  // Peaks above `bytes` need not be exact: when the estimate's bound already
  // exceeds it, Score returns the bound instead of running the iterations.
  void set_peak_limit(int64_t bytes) { peak_limit_ = bytes; }

  // Exact peaks computed so far (each costs O(iterations * micro-batches *
  // layers)).
  int64_t exact_runs() const { return exact_runs_; }

  // Whether the job clips its gradients (the closed form and the exact
  // search follow lower.h's "Gradient clipping").
  bool clips_gradients() const { return clip_; }

  // The estimate's figures, per layer in layer order.
  struct Layer {
    // The last micro-batch's RECOMPUTE (0 without) and BACKWARD.
    double recompute_seconds = 0;
    double backward_seconds = 0;
    double upd_acc = 0, upd_host = 0, grad_d2h = 0, param_h2d = 0;
    // Unstalled start of FORWARD(l, 0) in its iteration.
    double forward_start = 0;
    // Compute of the last micro-batch's backward after this layer's.
    double compute_after = 0;
    int64_t grad = 0, opt = 0;
    // (b) above without the gradients still waiting on the D2H engine.
    int64_t level_at_backward = 0;
    // Whether that level is one the simulator sees (BACKWARD lasts > 0).
    bool level_counts = false;
    bool has_params = false;
  };
  const std::vector<Layer>& layers() const { return layers_; }
  bool delayed_parameter_update() const { return chain_.delayed_parameter_update(); }
  int micro_batches() const { return chain_.micro_batches(); }
  // The program before the last micro-batch's backward, unstalled.
  double program_before_last_backward() const { return program_before_last_backward_; }
  // Resident weights: every plan holds them.
  int64_t resident_bytes() const { return resident_bytes_; }
  // The largest of the levels (a) above.
  int64_t early_level_bytes() const { return early_level_bytes_; }
  // A D2H copy ending within this of a backward's start counts as ended
  // there (relative and absolute times round differently).
  double time_tolerance() const { return time_tolerance_; }

 private:
  double ClippedClosedFormSeconds(const std::vector<bool>& on_accelerator) const;

  ResidentChain chain_;
  bool clip_ = false;
  std::vector<Layer> layers_;
  double program_before_last_backward_ = 0;
  int64_t resident_bytes_ = 0;
  int64_t early_level_bytes_ = 0;
  double time_tolerance_ = 0;
  int64_t peak_limit_ = INT64_MAX;
  int64_t exact_runs_ = 0;
  std::unordered_map<std::vector<bool>, PlacementScore> peaks_;
  // Scratch: D2H copies not yet ended (end time, gradient bytes).
  std::vector<double> queue_end_;
  std::vector<int64_t> queue_bytes_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_CHAIN_EVALUATOR_H_
