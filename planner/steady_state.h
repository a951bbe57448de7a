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
// A run is doubled until settled, up to this many iterations...
inline constexpr int kMaxSimulatedIterations = 64;
// ... and past that, while its period is still shorter than a resource's
// work (a backlog that has not yet made anything wait), up to this many.
inline constexpr int kMaxBackloggedIterations = 1024;

// Iteration k starts at starts[k] and its last operation ends at
// finishes[k] (empty: not tracked). A run of n >= 3 iterations reports
// iteration n-2 (its period ends where iteration n-1 starts); it is settled
// when that period equals the one before it to 1e-9 relative, is no
// shorter (to 1e-9 relative) than `busiest_seconds`, the most work one
// resource (a stream, a copy engine, the update pool) does in an
// iteration, and iteration n-2 ends as long after its start as iteration
// n-3 did. A period shorter than a resource's work cannot last: that
// resource's backlog grows every iteration until something waits on it.
// Nor can one whose iterations end later and later after they start: with
// delayed updates, or streamed state whose copies back nothing waits on
// soon, two equal periods can come long before the backlog bites.
bool PeriodSettled(const std::vector<double>& starts, const std::vector<double>& finishes,
                   double busiest_seconds);
// Whether a run is to be doubled: not settled, and under
// kMaxSimulatedIterations; or under kMaxBackloggedIterations with a backlog
// still growing (its period shorter than `busiest_seconds`, or iteration
// n-2 ending later after its start than the one half the run before).
bool KeepSimulating(const std::vector<double>& starts, const std::vector<double>& finishes,
                    double busiest_seconds);
// The iteration time to report from a run that stopped: the last period
// where it settled; otherwise the mean of its last 2 * floor(n / 4) periods
// (a period that alternates between two values, as hetero_dp's often does
// and a pool behind delayed updates can, reports their mean: one of them
// alone is not a rate the run keeps). Either way at least `busiest_seconds`
// (to 1e-9 relative, so that sums in another order change nothing): a run
// stopped at kMaxBackloggedIterations with a backlog still growing gets
// there later. The idle times and the timeline stay the last period's.
double ReportedPeriod(const std::vector<double>& starts, const std::vector<double>& finishes,
                      double busiest_seconds);

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
