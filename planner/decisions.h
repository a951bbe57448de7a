// The planner's names for a plan's decisions (schedule/decisions.h): the
// solvers copy and mutate Decisions; the simulator lowers them to a
// schedule::Schedule (schedule/schedule.h) and times it.
#ifndef TANDEM_PLANNER_DECISIONS_H_
#define TANDEM_PLANNER_DECISIONS_H_

#include "schedule/decisions.h"

namespace tandem::planner {

using schedule::Decisions;
using schedule::DecisionsFromPlan;
using schedule::LayerDecisions;
using schedule::WriteDecisionsToPlan;

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_DECISIONS_H_
