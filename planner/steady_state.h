// How one steady-state iteration is read out of a simulated run of several:
// which iteration is reported, when the run is long enough, and the memory peak
// inside that iteration's window. PlanSimulator and the fast update-placement
// evaluator both use these, so their answers agree to the last bit.
// Free functions; thread-compatible.
#ifndef TANDEM_PLANNER_STEADY_STATE_H_
#define TANDEM_PLANNER_STEADY_STATE_H_

#include <cstdint>
#include <vector>

#include "tandem/v1/plan.pb.h"

namespace tandem::planner {

// Iterations simulated first. With delayed parameter updates the forward of
// iteration k waits on the update of k-2, so the backlog of host updates takes
// a few more iterations to settle.
inline int InitialSimulatedIterations(bool delayed_parameter_update) {
  return delayed_parameter_update ? 6 : 4;
}
// A run is doubled until settled, up to this many iterations.
inline constexpr int kMaxSimulatedIterations = 64;

// Iteration k starts at starts[k]. A run of n >= 3 iterations reports
// iteration n-2 (its period ends where iteration n-1 starts); it is settled
// when that period equals the one before it to 1e-9 relative.
bool PeriodSettled(const std::vector<double>& starts);

struct MemoryChange {
  double time_seconds = 0;
  int64_t delta_bytes = 0;
};

// The allocation level over [window_start, window_end) given `changes` sorted
// by time and a constant `base`: the level at a time is base plus every change
// at or before it (order among equal times does not matter). Returns the peak
// and, when `samples` is given, appends one sample at window_start and one per
// distinct change time in the window, relative to window_start.
int64_t PeakInWindow(const std::vector<MemoryChange>& changes, int64_t base, double window_start,
                     double window_end,
                     google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>* samples);

// PeakInWindow computed while the changes are produced: fed in time order,
// with the window start given before any change at or after it, and the
// window end at Finish. Same peak and samples as PeakInWindow over the same
// changes, without storing them.
class WindowLevel {
 public:
  // `samples` may be null.
  WindowLevel(int64_t base, google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>* samples)
      : level_(base), samples_(samples) {}

  // Times must not decrease from one call to the next.
  void Feed(double t, int64_t delta);
  // Before any change at or after `t` is fed.
  void SetWindowStart(double t) {
    window_start_ = t;
    has_start_ = true;
  }
  // Whether a change at `t` counts for a window ending at `window_end`.
  bool Inside(double t, double window_end) const { return t < window_end || t <= window_start_; }
  // Ends the window; of the changes fed, those at or after `window_end` do
  // not count (feed no more than one time's worth of them). Returns the peak.
  int64_t Finish(double window_end);
  int64_t peak() const { return peak_; }

 private:
  void Close();
  void Initial(int64_t level);
  void Sample(double t, int64_t level);

  int64_t level_;
  google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>* samples_;
  bool open_ = false;
  double group_time_ = 0;
  int64_t level_before_ = 0;
  bool has_start_ = false;
  double window_start_ = 0;
  bool initial_done_ = false;
  int64_t peak_ = 0;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_STEADY_STATE_H_
