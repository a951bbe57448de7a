// Simulate: times a Schedule (schedule.h) under given operation durations by
// running `iterations` copies of it back to back as a discrete-event graph,
// under the schedule's execution rules. The planner's PlanSimulator turns the
// result into a prediction (planner/simulator.h); tests compare it with what
// the executor measured running the same schedule.
//
// Thread-safe: a pure function.
#ifndef TANDEM_SCHEDULE_SIMULATE_H_
#define TANDEM_SCHEDULE_SIMULATE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "schedule/schedule.h"

namespace tandem::schedule {

// Times of every operation of every iteration; operation `op` of iteration `i`
// is at index i * ops_per_iteration + op.
struct Timing {
  int iterations = 0;
  int ops_per_iteration = 0;
  std::vector<double> start, end;
  // The dependency (an index as above) whose release made the operation ready
  // last, its predecessor on the resource included; -1 when none.
  std::vector<int> binding;
  // Every operation (an index as above) in the order it started, and in the
  // order it ended: each in nondecreasing time, so that what follows the
  // run in time (memory levels) need not sort.
  std::vector<int> started, ended;

  int Index(int iteration, int op) const { return iteration * ops_per_iteration + op; }
};

// `seconds[op]` is the duration of each operation of `schedule`.
// INTERNAL when the schedule deadlocks (a dependency against its resources'
// order); INVALID_ARGUMENT when `seconds` has the wrong size or a duration
// below 0 (or NaN).
absl::StatusOr<Timing> Simulate(const Schedule& schedule, const std::vector<double>& seconds,
                                int iterations);

}  // namespace tandem::schedule

#endif  // TANDEM_SCHEDULE_SIMULATE_H_
