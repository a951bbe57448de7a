// Text the `tandem plan` command prints: the per-layer table of a plan (where
// each layer computes, where its weights live, where it updates, its
// activation policy, its reuse distance and its slack) and the strategies
// side by side (feasible, predicted iteration time, throughput, peak memory,
// the minimum budget of those that do not fit). Human units (units.h).
// Free functions; thread-safe.
#ifndef TANDEM_PLANNER_PLAN_REPORT_H_
#define TANDEM_PLANNER_PLAN_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/units.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::planner {

// One row per layer.
std::string RenderLayerTable(const tandem::v1::Plan& plan);

// One row per alternative, then each one's solver note.
std::string RenderStrategyComparison(const tandem::v1::PlanModelResponse& response);

// The chosen plan's summary and layer table, then the comparison.
std::string RenderPlanReport(const tandem::v1::PlanModelResponse& response);
// PlanModelResponse.scale_out as a table, one row per node count, and each
// count's sharding reason.
std::string RenderScaleOut(const tandem::v1::PlanModelResponse& response);

// `--output=json`: the response in the protobuf JSON mapping.
absl::StatusOr<std::string> PlanResponseToJson(const tandem::v1::PlanModelResponse& response);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PLAN_REPORT_H_
