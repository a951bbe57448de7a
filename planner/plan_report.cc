#include "planner/plan_report.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "planner/precision.h"
#include "planner/strategies.h"

namespace tandem::planner {
namespace {

// Left-aligned first column, right-aligned numbers, two spaces between.
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  const std::vector<bool>& right_aligned) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      absl::StrAppend(&line, i ? "  " : "", right_aligned[i] ? pad + row[i] : row[i] + pad);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string Side(tandem::v1::Placement p) {
  switch (p) {
    case tandem::v1::PLACEMENT_ACCELERATOR:
      return "accel";
    case tandem::v1::PLACEMENT_HOST:
      return "host";
    default:
      return "-";
  }
}

std::string Home(tandem::v1::ParameterHome h) {
  switch (h) {
    case tandem::v1::PARAMETER_HOME_ACCELERATOR:
      return "resident";
    case tandem::v1::PARAMETER_HOME_HOST_STREAMED:
      return "streamed";
    case tandem::v1::PARAMETER_HOME_HOST:
      return "host";
    default:
      return "-";
  }
}

std::string Activation(tandem::v1::ActivationPolicy a) {
  switch (a) {
    case tandem::v1::ACTIVATION_POLICY_KEEP:
      return "keep";
    case tandem::v1::ACTIVATION_POLICY_OFFLOAD:
      return "offload";
    case tandem::v1::ACTIVATION_POLICY_RECOMPUTE:
      return "recompute";
    default:
      return "-";
  }
}

}  // namespace

std::string RenderLayerTable(const tandem::v1::Plan& plan) {
  std::vector<std::vector<std::string>> rows = {
      {"#", "layer", "compute", "weights", "update", "activations", "reuse dist", "slack"}};
  for (const tandem::v1::LayerPlan& l : plan.layers()) {
    const bool chained =
        l.compute() != l.update() && l.update() != tandem::v1::PLACEMENT_UNSPECIFIED;
    // An accelerator update of state streamed in from the host.
    const std::string update =
        l.stream_optimizer_state() ? Side(l.update()) + " (state streamed)" : Side(l.update());
    rows.push_back({absl::StrCat(l.index()), l.name(), Side(l.compute()), Home(l.parameter_home()),
                    update, Activation(l.activation_policy()),
                    FormatSeconds(l.reuse_distance_seconds()),
                    chained ? FormatSeconds(l.slack_seconds()) : "-"});
  }
  return Table(rows, {true, false, false, false, false, false, true, true});
}

std::string RenderStrategyComparison(const tandem::v1::PlanModelResponse& response) {
  std::vector<std::vector<std::string>> rows = {{"strategy", "feasible", "iteration", "samples/s",
                                                 "accel peak", "host peak", "min accel budget"}};
  std::string notes;
  for (const tandem::v1::Plan& p : response.alternatives()) {
    const bool predicted = p.prediction().iteration_seconds() > 0;
    rows.push_back({StrategyName(p.strategy()), p.feasible() ? "yes" : "no",
                    predicted ? FormatSeconds(p.prediction().iteration_seconds()) : "-",
                    predicted ? absl::StrFormat("%.1f", p.prediction().samples_per_second()) : "-",
                    predicted ? FormatBytes(p.prediction().accelerator_peak_bytes()) : "-",
                    predicted ? FormatBytes(p.prediction().host_peak_bytes()) : "-",
                    p.feasible() ? "-"
                    : p.min_accelerator_memory_bytes() > 0
                        ? FormatBytes(p.min_accelerator_memory_bytes())
                        : "none"});
    absl::StrAppend(&notes, "  ", StrategyName(p.strategy()), ": ", p.solver().note(), "\n");
  }
  return absl::StrCat(Table(rows, {false, false, true, true, true, true, true}), "\n", notes);
}

std::string RenderPlanReport(const tandem::v1::PlanModelResponse& response) {
  const tandem::v1::Plan& p = response.plan();
  std::string out = absl::StrFormat(
      "Plan: %s, %s; batch %d in %d micro-batch(es) of %d%s; accelerator budget %s\n",
      StrategyName(p.strategy()), p.feasible() ? "feasible" : "INFEASIBLE", p.batch_size(),
      p.micro_batches(), p.micro_batch_size(),
      p.delayed_parameter_update() ? ", delayed parameter updates" : "",
      FormatBytes(p.accelerator_memory_budget_bytes()));
  if (!p.feasible() && p.min_accelerator_memory_bytes() > 0) {
    absl::StrAppend(&out, "Needs at least ", FormatBytes(p.min_accelerator_memory_bytes()),
                    " of accelerator memory.\n");
  }
  absl::StrAppend(
      &out,
      absl::StrFormat("Predicted: %s per step, %.1f samples/s, accelerator peak %s, host peak %s, "
                      "stall %s; solved in %s (%d plans)\n\n",
                      FormatSeconds(p.prediction().iteration_seconds()),
                      p.prediction().samples_per_second(),
                      FormatBytes(p.prediction().accelerator_peak_bytes()),
                      FormatBytes(p.prediction().host_peak_bytes()),
                      FormatSeconds(p.prediction().accelerator_stall_seconds()),
                      FormatSeconds(p.solver().solve_seconds()), p.solver().plans_evaluated()));
  if (!response.cost_source().empty()) {
    // Before the table: the figures' source, measured or estimated.
    out.insert(out.size() - 1, absl::StrCat("Timed with ", response.cost_source(), ".\n"));
  }
  if (!response.precision_reason().empty()) {
    out.insert(out.size() - 1, absl::StrCat("Precision ", PrecisionName(response.precision()), ": ",
                                            response.precision_reason(), ".\n"));
  }
  absl::StrAppend(&out, RenderLayerTable(p));
  for (const tandem::v1::PipelineStage& s : p.pipeline()) {
    absl::StrAppend(
        &out, absl::StrFormat(
                  "pipeline stage %d: layers %d-%d, %s compute, %s send, %s update, %s\n",
                  s.device_index(), s.first_layer(), s.last_layer(),
                  FormatSeconds(s.compute_seconds()), FormatSeconds(s.communication_seconds()),
                  FormatSeconds(s.update_seconds()), FormatBytes(s.memory_bytes())));
  }
  // A pipeline plan is not among the alternatives, whose notes follow the
  // table: its own note here.
  if (p.pipeline_size() > 0) absl::StrAppend(&out, "pipeline: ", p.solver().note(), "\n");
  if (response.alternatives_size() > 0) {
    absl::StrAppend(&out, "\n", RenderStrategyComparison(response));
  }
  if (response.scale_out_size() > 0) absl::StrAppend(&out, "\n", RenderScaleOut(response));
  return out;
}

std::string RenderScaleOut(const tandem::v1::PlanModelResponse& response) {
  std::string out =
      "Data parallel over nodes (one rank per accelerator; global batch = nodes x the spec's "
      "batch; 'plan alone' is the rank's plan on one device; the step is that plan as each "
      "rank runs it, simulated with its collectives; 'reduce' the gradient collectives, "
      "'exposed' what all its collectives (all-gathers included) add to its step; "
      "eff. = samples/s over nodes x one node's):\n";
  absl::StrAppend(
      &out, absl::StrFormat("  %5s %6s %6s %-12s %-16s %10s %10s %10s %10s %12s %6s\n", "nodes",
                            "ranks", "batch", "sharding", "rank plan", "plan alone", "reduce",
                            "exposed", "step", "samples/s", "eff."));
  for (const tandem::v1::ScaleOutPlan& s : response.scale_out()) {
    const bool partitioned = s.sharding() == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED;
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  %5d %6d %6d %-12s %-16s %10s %10s %10s %10s %12.1f %5.1f%%%s\n", s.nodes(),
            s.ranks(), s.global_batch_size(), partitioned ? "partitioned" : "replicated",
            s.feasible() ? StrategyName(s.rank_plan().strategy()) : "INFEASIBLE",
            FormatSeconds(s.compute_seconds()), FormatSeconds(s.gradient_seconds()),
            FormatSeconds(s.exposed_seconds()), FormatSeconds(s.step_seconds()),
            s.samples_per_second(), 100 * s.scaling_efficiency(),
            partitioned ? absl::StrFormat(" (all-gather %s)", FormatSeconds(s.gather_seconds()))
                        : ""));
  }
  for (const tandem::v1::ScaleOutPlan& s : response.scale_out()) {
    absl::StrAppend(&out, absl::StrFormat("  %d nodes: %s\n", s.nodes(), s.reason()));
  }
  return out;
}

absl::StatusOr<std::string> PlanResponseToJson(const tandem::v1::PlanModelResponse& response) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(response, &json, options);
  if (!status.ok()) return absl::InternalError(status.message().as_string());
  return json;
}

}  // namespace tandem::planner
