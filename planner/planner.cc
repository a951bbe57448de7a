#include "planner/planner.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "planner/cost_model.h"
#include "planner/memory_fit.h"
#include "planner/pipeline_partitioner.h"
#include "planner/simulator.h"
#include "planner/strategies.h"

namespace tandem::planner {
namespace {

using tandem::v1::Strategy;

// The concrete strategies, in the order alternatives are reported.
constexpr Strategy kConcrete[] = {
    tandem::v1::STRATEGY_GPU_ONLY,     tandem::v1::STRATEGY_CPU_ONLY,
    tandem::v1::STRATEGY_ZERO_OFFLOAD, tandem::v1::STRATEGY_REUSE_DISTANCE,
    tandem::v1::STRATEGY_HETERO_DP,
};

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status ValidateRequest(const PlanRequest& r) {
  if (r.batch_size < 0 || r.batch_size > 65536)
    return Invalid("batch_size", "must be in [1, 65536]");
  if (r.accelerator_memory_bytes < 0) return Invalid("accelerator_memory_bytes", "must be >= 0");
  if (r.host_memory_bytes < 0) return Invalid("host_memory_bytes", "must be >= 0");
  if (r.micro_batch_size < 0) return Invalid("micro_batch_size", "must be >= 0");
  if (r.host_update_threads < 0) return Invalid("host_update_threads", "must be >= 0");
  // As a job's placement.pipeline.stages: the partition's work grows with
  // stages x layers^2.
  if (r.pipeline_devices < 0 || r.pipeline_devices > 64) {
    return Invalid("pipeline_devices", "must be in [0, 64]");
  }
  if (!tandem::v1::Strategy_IsValid(r.strategy)) return Invalid("strategy", "unknown value");
  for (size_t i = 0; i < r.compare.size(); ++i) {
    if (!tandem::v1::Strategy_IsValid(r.compare[i]) ||
        r.compare[i] == tandem::v1::STRATEGY_UNSPECIFIED) {
      return Invalid(absl::StrCat("compare[", i, "]"), "must name a strategy");
    }
  }
  return absl::OkStatus();
}

bool Faster(const tandem::v1::Plan& a, const tandem::v1::Plan& b) {
  return a.prediction().iteration_seconds() < b.prediction().iteration_seconds();
}

// What the strategies solve under: the request's figures, the cost source's
// where the request leaves them 0. Errors for the fields only the cost source
// can check.
absl::StatusOr<StrategyContext> ContextOf(const PlanRequest& request,
                                          const PlanSimulator& simulator) {
  const CostModel& cost = simulator.cost();
  if (request.pipeline_devices > 1 && request.pipeline_devices > cost.accelerator_count()) {
    return Invalid("pipeline_devices",
                   absl::StrCat(request.pipeline_devices, " exceeds the ", cost.accelerator_count(),
                                " accelerators of the cost source"));
  }
  StrategyContext c;
  c.simulator = &simulator;
  c.batch_size = request.batch_size > 0 ? request.batch_size : request.profile.batch_size();
  if (c.batch_size > 65536) return Invalid("batch_size", "must be in [1, 65536]");
  if (request.micro_batch_size > 0 && c.batch_size % request.micro_batch_size != 0) {
    return Invalid("micro_batch_size", absl::StrCat("must divide batch_size (", c.batch_size,
                                                    "), got ", request.micro_batch_size));
  }
  if (absl::Status bound =
          CheckMicroBatchBound(c.batch_size, request.micro_batch_size, cost.num_layers());
      !bound.ok()) {
    return Invalid("micro_batch_size", bound.message());
  }
  c.micro_batch_size = request.micro_batch_size;
  c.accelerator_memory_budget_bytes = request.accelerator_memory_bytes > 0
                                          ? request.accelerator_memory_bytes
                                          : cost.accelerator_memory_bytes();
  if (cost.has_accelerator() && c.accelerator_memory_budget_bytes <= 0) {
    return Invalid("accelerator_memory_bytes",
                   "required: the cost source does not give the accelerator's capacity");
  }
  c.host_memory_budget_bytes =
      request.host_memory_bytes > 0 ? request.host_memory_bytes : cost.host_memory_bytes();
  c.delayed_parameter_update = request.delayed_parameter_update;
  c.stream_optimizer_state = request.stream_optimizer_state;
  c.host_update_threads =
      request.host_update_threads > 0 ? request.host_update_threads : cost.host_threads();
  return c;
}

// The strategy answered with and those answered beside it.
struct StrategySelection {
  Strategy requested;
  std::vector<Strategy> compare;

  bool Compared(Strategy s) const {
    return std::find(compare.begin(), compare.end(), s) != compare.end();
  }
  bool WantsAuto() const {
    return requested == tandem::v1::STRATEGY_AUTO || Compared(tandem::v1::STRATEGY_AUTO);
  }
  // Requested, compared, or a candidate of a requested or compared auto.
  bool Wanted(Strategy s) const {
    return requested == s || requested == tandem::v1::STRATEGY_AUTO || Compared(s) ||
           Compared(tandem::v1::STRATEGY_AUTO);
  }
};

StrategySelection SelectionOf(const PlanRequest& request, const CostModel& cost) {
  StrategySelection want;
  want.requested = request.strategy;
  if (want.requested == tandem::v1::STRATEGY_UNSPECIFIED) {
    want.requested = cost.has_accelerator() ? tandem::v1::STRATEGY_REUSE_DISTANCE
                                            : tandem::v1::STRATEGY_CPU_ONLY;
  }
  want.compare = request.compare;
  if (want.compare.empty()) want.compare.assign(std::begin(kConcrete), std::end(kConcrete));
  return want;
}

// The plan of each wanted strategy.
// CANCELLED when `stop` says the caller has gone, checked before and after each
// solve (and by the simulator inside one).
absl::StatusOr<std::map<Strategy, tandem::v1::Plan>> SolveWanted(
    const StrategyContext& c, const StrategySelection& want, const std::function<bool()>& stop) {
  const auto stopped = [&stop] { return stop && stop(); };
  const absl::Status cancelled = absl::CancelledError("planning stopped: the caller has gone");
  // Solved in dependency order: reuse_distance builds on the other two.
  std::map<Strategy, StrategyOutcome> outcomes;
  const bool need_reuse = want.Wanted(tandem::v1::STRATEGY_REUSE_DISTANCE);
  const bool gpu_wanted = want.Wanted(tandem::v1::STRATEGY_GPU_ONLY);
  if (stopped()) return cancelled;
  if (gpu_wanted || need_reuse) {
    outcomes[tandem::v1::STRATEGY_GPU_ONLY] = SolveGpuOnly(c, /*find_min_budget=*/gpu_wanted);
  }
  if (want.Wanted(tandem::v1::STRATEGY_CPU_ONLY))
    outcomes[tandem::v1::STRATEGY_CPU_ONLY] = SolveCpuOnly(c);
  if (stopped()) return cancelled;
  if (want.Wanted(tandem::v1::STRATEGY_ZERO_OFFLOAD) || need_reuse) {
    outcomes[tandem::v1::STRATEGY_ZERO_OFFLOAD] =
        SolveZeroOffload(c, /*record_timeline=*/want.Wanted(tandem::v1::STRATEGY_ZERO_OFFLOAD));
  }
  if (stopped()) return cancelled;
  if (need_reuse) {
    outcomes[tandem::v1::STRATEGY_REUSE_DISTANCE] = SolveReuseDistance(
        c, outcomes[tandem::v1::STRATEGY_ZERO_OFFLOAD], outcomes[tandem::v1::STRATEGY_GPU_ONLY]);
  }
  if (stopped()) return cancelled;
  if (want.Wanted(tandem::v1::STRATEGY_HETERO_DP)) {
    outcomes[tandem::v1::STRATEGY_HETERO_DP] = SolveHeteroDp(c);
  }
  if (stopped()) return cancelled;
  std::map<Strategy, tandem::v1::Plan> plans;
  for (auto& [strategy, outcome] : outcomes) {
    // gpu_only and zero_offload may be solved only for reuse_distance.
    if (want.Wanted(strategy)) plans[strategy] = ToPlan(c, std::move(outcome));
  }
  return plans;
}

// auto: the fastest feasible of `plans`; when none is, the fallback
// (reuse_distance, or cpu_only without an accelerator), if solved; else an
// empty plan. Its solve time is all of theirs.
tandem::v1::Plan AutoPlan(std::map<Strategy, tandem::v1::Plan>* plans, bool has_accelerator,
                          bool shared_cores) {
  tandem::v1::Plan auto_plan;
  const tandem::v1::Plan* best = nullptr;
  double total_seconds = 0;
  for (Strategy s : kConcrete) {
    auto it = plans->find(s);
    if (it == plans->end()) continue;
    total_seconds += it->second.solver().solve_seconds();
    if (shared_cores && s == tandem::v1::STRATEGY_HETERO_DP) continue;
    if (it->second.feasible() && (best == nullptr || Faster(it->second, *best))) {
      best = &it->second;
    }
  }
  const Strategy fallback =
      has_accelerator ? tandem::v1::STRATEGY_REUSE_DISTANCE : tandem::v1::STRATEGY_CPU_ONLY;
  if (best == nullptr && plans->count(fallback)) best = &(*plans)[fallback];
  if (best == nullptr) return auto_plan;
  auto_plan = *best;
  auto_plan.mutable_solver()->set_solve_seconds(total_seconds);
  auto_plan.mutable_solver()->set_note(
      best->feasible()
          ? absl::StrCat("auto: chose ", StrategyName(best->strategy()), " (",
                         absl::StrFormat("%.3f", best->prediction().iteration_seconds() * 1e3),
                         " ms per step) as the fastest feasible",
                         shared_cores ? " (hetero_dp left out: the accelerator computes on the "
                                        "host's cores, so its replica and the host's would share "
                                        "them)"
                                      : "",
                         "; ", best->solver().note())
          : absl::StrCat("auto: no strategy fits; ", best->solver().note()));
  return auto_plan;
}

tandem::v1::PlanModelResponse Respond(const StrategySelection& want,
                                      std::map<Strategy, tandem::v1::Plan>* plans,
                                      tandem::v1::Plan auto_plan) {
  tandem::v1::PlanModelResponse response;
  for (Strategy s : kConcrete) {
    if (want.Compared(s)) *response.add_alternatives() = (*plans)[s];
  }
  if (want.Compared(tandem::v1::STRATEGY_AUTO)) *response.add_alternatives() = auto_plan;
  // Last, so that its timeline moves rather than copies.
  *response.mutable_plan() = want.requested == tandem::v1::STRATEGY_AUTO
                                 ? std::move(auto_plan)
                                 : std::move((*plans)[want.requested]);
  return response;
}

// "0.434 ms", or `infeasible` when the plan does not fit.
std::string TimedOr(const tandem::v1::Plan& p, const char* infeasible) {
  return p.feasible() ? absl::StrFormat("%.3f ms", 1e3 * p.prediction().iteration_seconds())
                      : std::string(infeasible);
}

// PlanRequest::pipeline_auto: pipelines over 2, 4, 8... accelerators (each at
// `budget` per device) compete with `response`'s plan; the fastest feasible
// becomes the plan (the one-accelerator plan on ties and when none fits),
// the rest alternatives.
absl::Status AddPipelines(const PlanRequest& request, const CostModel& cost, int64_t budget,
                          tandem::v1::PlanModelResponse* response) {
  std::vector<tandem::v1::Plan> candidates = {response->plan()};
  std::string compared = absl::StrCat("auto over pipelines: one accelerator (",
                                      StrategyName(response->plan().strategy()), ") ",
                                      TimedOr(response->plan(), "does not fit"));
  for (int k = 2; k <= std::min(cost.accelerator_count(), cost.num_layers()); k *= 2) {
    PlanRequest pipelined = request;
    pipelined.pipeline_devices = k;
    pipelined.pipeline_auto = false;
    pipelined.accelerator_memory_bytes = budget;
    if (request.pipeline_stage_memory) {
      const int batch = request.batch_size > 0 ? request.batch_size : request.profile.batch_size();
      absl::StatusOr<int> micro = PipelineMicroBatch(pipelined, batch);
      if (!micro.ok()) return micro.status();
      pipelined.accelerator_memory_bytes = request.pipeline_stage_memory(k, *micro);
    }
    absl::StatusOr<tandem::v1::Plan> p = SolvePipelinePlan(pipelined, request.pipeline_schedule);
    if (!p.ok()) return p.status();
    absl::StrAppend(&compared, ", ", k, " stages ", TimedOr(*p, "do not fit"));
    candidates.push_back(*std::move(p));
  }
  if (candidates.size() == 1) return absl::OkStatus();
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    if (candidates[i].feasible() &&
        (!candidates[best].feasible() || candidates[i].prediction().iteration_seconds() <
                                             candidates[best].prediction().iteration_seconds())) {
      best = i;
    }
  }
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (i != best) *response->add_alternatives() = std::move(candidates[i]);
  }
  *response->mutable_plan() = std::move(candidates[best]);
  tandem::v1::SolverStats* solver = response->mutable_plan()->mutable_solver();
  solver->set_note(absl::StrCat(solver->note(), solver->note().empty() ? "" : "; ", compared));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CostModel> CostModelOf(const PlanRequest& request) {
  absl::StatusOr<CostModel> cost =
      request.hardware.has_value() ? CostModel::FromHardwareSpec(request.profile, *request.hardware)
                                   : CostModel::FromMeasuredProfile(request.profile);
  if (cost.ok()) cost->set_clips_gradients(request.clips_gradients);
  return cost;
}

absl::StatusOr<tandem::v1::PlanModelResponse> SolvePlan(const PlanRequest& request) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  absl::StatusOr<CostModel> cost = CostModelOf(request);
  if (!cost.ok()) return cost.status();
  const PlanSimulator simulator(*cost, request.stop);
  absl::StatusOr<StrategyContext> c = ContextOf(request, simulator);
  if (!c.ok()) return c.status();
  const StrategySelection want = SelectionOf(request, *cost);
  absl::StatusOr<std::map<Strategy, tandem::v1::Plan>> solved = SolveWanted(*c, want, request.stop);
  if (!solved.ok()) return solved.status();
  std::map<Strategy, tandem::v1::Plan>& plans = *solved;
  // Only when asked for: it copies a whole plan, timeline included.
  tandem::v1::Plan auto_plan = want.WantsAuto() ? AutoPlan(&plans, cost->has_accelerator(),
                                                           request.accelerator_shares_host_cores)
                                                : tandem::v1::Plan();
  tandem::v1::PlanModelResponse response = Respond(want, &plans, std::move(auto_plan));
  if (request.pipeline_devices > 1) {
    PlanRequest pipelined = request;
    pipelined.accelerator_memory_bytes = c->accelerator_memory_budget_bytes;
    if (request.pipeline_stage_memory) {
      const int batch = request.batch_size > 0 ? request.batch_size : request.profile.batch_size();
      absl::StatusOr<int> micro = PipelineMicroBatch(request, batch);
      if (!micro.ok()) return micro.status();
      pipelined.accelerator_memory_bytes =
          request.pipeline_stage_memory(request.pipeline_devices, *micro);
    }
    absl::StatusOr<tandem::v1::Plan> pipeline =
        SolvePipelinePlan(pipelined, request.pipeline_schedule);
    if (!pipeline.ok()) return pipeline.status();
    *response.add_alternatives() = std::move(*response.mutable_plan());
    *response.mutable_plan() = *std::move(pipeline);
  } else if (request.pipeline_auto) {
    if (absl::Status s =
            AddPipelines(request, *cost, c->accelerator_memory_budget_bytes, &response);
        !s.ok()) {
      return s;
    }
  }
  return response;
}

// The request's micro-batch, or the largest divisor of the batch not above
// 4 x stages micro-batches' worth (the rule spec/job_spec.cc resolves
// placement.pipeline.micro_batches with; the planner does not depend on it).
absl::StatusOr<int> PipelineMicroBatch(const PlanRequest& request, int batch) {
  if (batch <= 0) return Invalid("batch_size", "must be in [1, 65536]");
  int micro = request.micro_batch_size;
  if (micro <= 0) {
    int m = std::min(batch, 4 * request.pipeline_devices);
    while (batch % m != 0) --m;
    micro = batch / m;
  }
  if (batch % micro != 0) {
    return Invalid("micro_batch_size", absl::StrCat(micro, " does not divide the batch ", batch));
  }
  return micro;
}

namespace {

// SolvePipelinePlan's checks of the request against its cost source.
absl::Status CheckPipelineRequest(const PlanRequest& request, const CostModel& cost) {
  if (request.pipeline_devices < 2) {
    return Invalid("pipeline_devices", "a pipeline needs at least 2 accelerators");
  }
  if (!cost.has_accelerator())
    return Invalid("pipeline_devices", "the hardware has no accelerator");
  if (request.pipeline_devices > cost.accelerator_count()) {
    return Invalid("pipeline_devices",
                   absl::StrCat(request.pipeline_devices, " exceeds the ", cost.accelerator_count(),
                                " accelerators of the cost source"));
  }
  if (request.pipeline_devices > cost.num_layers()) {
    return Invalid("pipeline_devices",
                   absl::StrCat(request.pipeline_devices, " stages for a model of ",
                                cost.num_layers(), " layers"));
  }
  for (const auto& [field, scale] : {std::pair<const char*, const std::vector<double>*>{
                                         "pipeline_compute_scale", &request.pipeline_compute_scale},
                                     {"pipeline_update_scale", &request.pipeline_update_scale}}) {
    if (!scale->empty() && static_cast<int>(scale->size()) != cost.num_layers()) {
      return Invalid(field, absl::StrCat(scale->size(), " factors for a model of ",
                                         cost.num_layers(), " layers"));
    }
    for (double x : *scale) {
      if (!(x > 0) || !std::isfinite(x)) {
        return Invalid(field, absl::StrCat("factor ", x, " is not a positive finite number"));
      }
    }
  }
  if (!request.pipeline_stages.empty() &&
      static_cast<int>(request.pipeline_stages.size()) != request.pipeline_devices) {
    return Invalid("pipeline_stages",
                   absl::StrCat(request.pipeline_stages.size(), " stages for pipeline_devices ",
                                request.pipeline_devices));
  }
  return absl::OkStatus();
}

// How the stages of a pipeline compute: on emulated accelerators each with
// `stage_threads` of the job's `job_threads` (the runner's share,
// PipelineOptions::threads_per_stage), at the rate the cost source gives
// that many threads (ThreadShareSlowdown), unless measured corrections say
// what each layer takes (PlanRequest::pipeline_compute_scale).
struct StageRates {
  bool shared_cores = false;
  int job_threads = 1, stage_threads = 1;
  // How much slower a stage's device work runs than the profile's.
  double slower = 1;
  const std::vector<double>* compute_scale = nullptr;
  const std::vector<double>* update_scale = nullptr;
  bool calibrated() const { return !compute_scale->empty() || !update_scale->empty(); }
  double ComputeScale(int layer) const {
    return slower * (layer < static_cast<int>(compute_scale->size()) ? (*compute_scale)[layer] : 1);
  }
  double UpdateScale(int layer) const {
    return layer < static_cast<int>(update_scale->size()) ? (*update_scale)[layer] : 1;
  }
};

StageRates StageRatesOf(const CostModel& cost, const PlanRequest& request, int job_threads,
                        int stages) {
  StageRates rates;
  rates.shared_cores = cost.accelerator_kind() == tandem::v1::DEVICE_KIND_EMULATED;
  rates.job_threads = job_threads;
  rates.stage_threads = std::max(1, job_threads / stages);
  if (rates.shared_cores) rates.slower = cost.ThreadShareSlowdown(job_threads, rates.stage_threads);
  rates.compute_scale = &request.pipeline_compute_scale;
  rates.update_scale = &request.pipeline_update_scale;
  return rates;
}

// What PredictPipeline found, for the plan's note.
struct PipelineFigures {
  double bottleneck = 0, update = 0;
  int64_t peak = 0;
  bool continuous = false, in_turn = false;
};

// "1F1B pipeline over 2 accelerators, ...; stage 0 recomputes its activations".
std::string PipelineNote(const tandem::v1::Plan& plan, const StageRates& rates,
                         const PipelineFigures& f) {
  const int K = plan.pipeline_size(), M = plan.micro_batches();
  const bool pipedream = plan.pipeline_schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
  std::string note = absl::StrFormat(
      "%s pipeline over %d accelerators, %d micro-batches of %d: slowest stage %.3f ms per "
      "micro-batch, %s, update %.3f ms, largest stage %.1f MiB%s",
      plan.pipeline_schedule() == tandem::v1::PIPELINE_SCHEDULE_GPIPE ? "GPipe"
      : f.continuous                                                  ? "Continuous PipeDream"
      : pipedream                                                     ? "PipeDream"
                                                                      : "1F1B",
      K, M, plan.micro_batch_size(), f.bottleneck * 1e3,
      f.continuous
          ? std::string("no bubble after the first step (it fills once)")
          : absl::StrFormat("bubble (K-1)/(M+K-1) = %.0f%%", 100.0 * (K - 1) / (M + K - 1)),
      f.update * 1e3, f.peak / 1048576.0,
      rates.calibrated()    ? "; stage times corrected by what a run of this pipeline measured"
      : !rates.shared_cores ? ""
      : f.in_turn
          ? absl::StrFormat("; the emulated stages, %d thread%s each (%.2fx slower than the "
                            "job's %d), share the job's cores, so the step is at least all "
                            "their work in turn",
                            rates.stage_threads, rates.stage_threads == 1 ? "" : "s", rates.slower,
                            rates.job_threads)
          : absl::StrFormat("; each emulated stage computes with %d of the job's %d threads, "
                            "%.2fx slower than with all",
                            rates.stage_threads, rates.job_threads, rates.slower));
  std::vector<std::string> recomputing, offloading, sending, waiting;
  for (const tandem::v1::PipelineStage& s : plan.pipeline()) {
    if (s.recompute()) recomputing.push_back(absl::StrCat(s.device_index()));
    if (s.offload_activations()) sending.push_back(absl::StrCat(s.device_index()));
    if (s.wait_for_activation_copies()) waiting.push_back(absl::StrCat(s.device_index()));
    if (s.offload_optimizer() && s.host_updated_layers() == 0) {
      offloading.push_back(absl::StrCat(s.device_index()));
    }
  }
  // "; stage 0 recomputes its activations", "; stages 0, 1 recompute ...".
  auto name_stages = [&](const std::vector<std::string>& which, const char* one, const char* many) {
    if (which.empty()) return;
    absl::StrAppend(&note, which.size() == 1 ? "; stage " : "; stages ", absl::StrJoin(which, ", "),
                    which.size() == 1 ? one : many);
  };
  name_stages(recomputing, " recomputes its activations", " recompute their activations");
  name_stages(sending, " offloads its activations to the host between forward and backward",
              " offload their activations to the host between forward and backward");
  name_stages(waiting, " waits for those copies, to hold one micro-batch's activations",
              " wait for those copies, to hold one micro-batch's activations");
  name_stages(offloading, " keeps its optimizer state on the host and updates there",
              " keep their optimizer state on the host and update there");
  for (const tandem::v1::PipelineStage& s : plan.pipeline()) {
    if (s.offload_optimizer() && s.host_updated_layers() > 0) {
      absl::StrAppend(&note, "; stage ", s.device_index(),
                      " keeps the optimizer state of its last ", s.host_updated_layers(), " of ",
                      s.last_layer() - s.first_layer() + 1,
                      " layers on the host and updates them there");
    }
    if (s.stream_weights()) {
      absl::StrAppend(&note, "; stage ", s.device_index(),
                      " keeps the weights of its host-updated layers on the host too and copies "
                      "them up for each forward and backward");
    }
  }
  return note;
}

// What stage `s`'s update adds after its last backward of the step, which
// takes `backward` (its recompute or activation copies included): all of
// `stage_update`, except where an offloading stage's host updates overlap
// that backward (PipelineOptions::overlap_host_updates, no clipping): then
// the longer of its device-updated layers' updates (`device_update`, after
// the backward) and what is left of its host-updated layers', each begun
// once the backward has passed its layer, one at a time.
double UpdateTail(const CostModel& cost, const tandem::v1::PipelineStage& s,
                  const StageRates& rates, int micro_batch_size, int host_threads,
                  bool overlap_host_updates, double backward, double stage_update,
                  double device_update) {
  if (!s.offload_optimizer() || !overlap_host_updates) return stage_update;
  const int host_from = HostUpdatedFrom(s);
  double ready = backward, end = 0;
  for (int l = s.first_layer(); l <= s.last_layer(); ++l) {
    ready -= rates.ComputeScale(l) *
             cost.BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, micro_batch_size);
  }
  for (int l = s.last_layer(); l >= s.first_layer(); --l) {
    ready += rates.ComputeScale(l) *
             cost.BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, micro_batch_size);
    if (l < host_from || cost.ParameterBytes(l) == 0) continue;
    end = std::max(end, ready) +
          rates.UpdateScale(l) * OffloadedUpdateSeconds(cost, l, host_threads,
                                                        /*weights_up=*/!s.stream_weights());
  }
  return std::max(device_update, end - backward);
}

// What the updates add to the step after the pipelined phase: each stage's
// last update (`tail`) follows its own last backward, which ended
// `ended_before` the phase's end (PipeDream's too, its other updates being in
// the pipelined slots; a continuous PipeDream's are all there).
double UpdatesAfterPhase(const std::vector<double>& tail, const std::vector<double>& ended_before) {
  double after = 0;
  for (size_t k = 0; k < tail.size(); ++k) after = std::max(after, tail[k] - ended_before[k]);
  return after;
}

// Sets `plan`'s stages, prediction and note from the partition, whose
// compute is at the stages' rates already. Stage 0's last backward ends the
// pipelined phase; stage s's ended its backward and the gradient's send
// before stage s-1's last backward began, and each stage's update follows
// its own (UpdateTail), except that with gradient clipping every stage's
// update waits for the global norm, at the phase's end, and none overlaps
// host updates with backward.
void PredictPipeline(const CostModel& cost, const std::vector<tandem::v1::PipelineStage>& stages,
                     int micro_batches, int host_threads, const StageRates& rates, bool continuous,
                     bool clips_gradients, tandem::v1::Plan* plan) {
  const double slower = rates.slower;
  const bool pipedream = plan->pipeline_schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
  double update = 0, updates = 0, work = 0;
  // The first micro-batch crosses every stage forward and back; each later
  // one adds a slot of the slowest stage (PipeDream: its update after each
  // backward in the slot). Balanced stages give (M + K - 1) slots; a stage
  // faster than the slowest fills and drains in its own time.
  double path = 0, bottleneck = 0;
  int64_t peak = 0;
  const int K = static_cast<int>(stages.size()), M = micro_batches;
  // Per stage: its update after its last backward, and how long before the
  // pipelined phase's end that backward ended (0 with clipping: every
  // update waits for the phase's end).
  std::vector<double> tail(K), ended_before(K, 0.0);
  for (int k = 0; k < K; ++k) {
    const tandem::v1::PipelineStage& s = stages[k];
    double backward = s.compute_seconds();
    for (int l = s.first_layer(); l <= s.last_layer(); ++l) {
      backward -= rates.ComputeScale(l) * cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR,
                                                              plan->micro_batch_size());
    }
    double stage_update = 0, device_update = 0;
    const int host_from = HostUpdatedFrom(s);
    for (int l = s.first_layer(); l <= s.last_layer(); ++l) {
      if (l >= host_from) {
        stage_update +=
            rates.UpdateScale(l) * OffloadedUpdateSeconds(cost, l, host_threads,
                                                          /*weights_up=*/!s.stream_weights());
      } else {
        device_update += rates.UpdateScale(l) * slower *
                         cost.UpdateSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, 1);
      }
    }
    stage_update += device_update;
    tandem::v1::PipelineStage& added = *plan->add_pipeline();
    added = s;
    added.set_update_seconds(stage_update);
    tail[k] = UpdateTail(cost, s, rates, plan->micro_batch_size(), host_threads,
                         /*overlap_host_updates=*/!clips_gradients, backward, stage_update,
                         device_update);
    if (k + 1 < K && !clips_gradients) {
      ended_before[k + 1] = ended_before[k] + backward + s.communication_seconds();
    }
    update = std::max(update, stage_update);
    updates += stage_update;
    path += s.compute_seconds() + 2 * s.communication_seconds();
    bottleneck = std::max({bottleneck, s.compute_seconds() + (pipedream ? stage_update : 0),
                           2 * s.communication_seconds()});
    // The work-in-turn bound counts the compute at the job's rate.
    work += M * s.compute_seconds() / slower + 2 * M * s.communication_seconds();
    peak = std::max(peak, s.memory_bytes());
  }
  if (pipedream) work += M * updates - updates;
  // A continuous PipeDream (PlanRequest::pipeline_continuous, PipeDream
  // without vertical sync only) fills its pipeline once per run, not per step.
  const double pipelined = continuous ? M * bottleneck : path + (M - 1) * bottleneck;
  const double after = continuous ? 0 : UpdatesAfterPhase(tail, ended_before);
  // The note gives PipeDream's update per micro-batch, the others' tail.
  if (!pipedream) update = after;
  double step = pipelined + after;
  // Emulated accelerators compute on the host's cores. Stages with more
  // threads between them than the job has share its cores: together they run
  // no faster than the job's threads running every stage's work (and every
  // update) one after another.
  const bool in_turn =
      rates.shared_cores && K * rates.stage_threads > rates.job_threads && !rates.calibrated();
  if (in_turn) {
    step = std::max(pipelined, work) + std::max(after, updates);
  }
  tandem::v1::PlanPrediction* prediction = plan->mutable_prediction();
  *prediction = tandem::v1::PlanPrediction();
  prediction->set_iteration_seconds(step);
  prediction->set_samples_per_second(step > 0 ? plan->batch_size() / step : 0);
  prediction->set_accelerator_peak_bytes(peak);
  plan->mutable_solver()->set_method("pipeline partition (dynamic program)");
  plan->mutable_solver()->set_note(
      PipelineNote(*plan, rates, {bottleneck, update, peak, continuous, in_turn}));
}

}  // namespace

// The partitioner offloads the optimizer state of a stage's fewest last
// layers that make it fit, counting each offloaded update as exposed, and
// minimises the slowest stage's compute, not the step. Where the host's
// updates overlap the last backward, offloading all of a stage's layers can
// be faster (the device's update waits for the backward to end), and a split
// whose stages fit by offloading few layers' state can be faster per
// micro-batch and slower per step than one whose stages offload all or
// recompute. So the fastest step (`predict`: a split's, predicted into a
// scratch copy of `plan`) of `split`, `split` with one stage after another
// offloading all of its layers where that is faster, and the partition that
// offloads whole stages.
absl::StatusOr<std::vector<tandem::v1::PipelineStage>> FastestOffload(
    const CostModel& cost, const PipelineRequest& p, std::vector<tandem::v1::PipelineStage> split,
    const tandem::v1::Plan& plan,
    const std::function<double(const std::vector<tandem::v1::PipelineStage>&, tandem::v1::Plan*)>&
        predict) {
  tandem::v1::Plan scratch = plan;
  double best = predict(split, &scratch);
  for (size_t k = 0; k < split.size(); ++k) {
    if (!split[k].offload_optimizer() || split[k].host_updated_layers() == 0) continue;
    std::vector<tandem::v1::PipelineStage> all = split;
    all[k].set_host_updated_layers(0);
    TANDEM_ASSIGN_OR_RETURN(all, TimePipelineStages(cost, p, all));
    // Streaming, more layers on the host can hold more: their two largest.
    if (p.device_memory_bytes > 0 && all[k].memory_bytes() > p.device_memory_bytes) continue;
    scratch = plan;
    const double step = predict(all, &scratch);
    if (step < best) {
      best = step;
      split = std::move(all);
    }
  }
  PipelineRequest whole_stages = p;
  whole_stages.offload_fewest_layers = false;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> other =
      PartitionPipeline(cost, whole_stages);
  scratch = plan;
  if (other.ok() && predict(*other, &scratch) < best) split = *std::move(other);
  return split;
}

absl::StatusOr<tandem::v1::Plan> SolvePipelinePlan(const PlanRequest& request,
                                                   tandem::v1::PipelineSchedule schedule) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  absl::StatusOr<CostModel> cost = CostModelOf(request);
  if (!cost.ok()) return cost.status();
  if (absl::Status s = CheckPipelineRequest(request, *cost); !s.ok()) return s;
  const int batch = request.batch_size > 0 ? request.batch_size : request.profile.batch_size();
  absl::StatusOr<int> micro = PipelineMicroBatch(request, batch);
  if (!micro.ok()) return micro.status();
  // The layers' placement: gpu_only's, solved without a memory bound (each
  // stage's bound is the partitioner's).
  PlanRequest whole = request;
  whole.strategy = Strategy::STRATEGY_GPU_ONLY;
  whole.compare = {Strategy::STRATEGY_GPU_ONLY};
  whole.accelerator_memory_bytes = int64_t{1} << 50;
  whole.micro_batch_size = *micro;
  whole.pipeline_devices = 1;
  whole.pipeline_auto = false;
  absl::StatusOr<tandem::v1::PlanModelResponse> solved = SolvePlan(whole);
  if (!solved.ok()) return solved.status();
  tandem::v1::Plan plan = solved->plan();
  plan.clear_timeline();
  plan.set_micro_batch_size(*micro);
  plan.set_micro_batches(batch / *micro);
  plan.set_batch_size(batch);
  plan.set_pipeline_schedule(schedule);
  // Per device: the request's, else the cost source's (0 there too: unbounded).
  const int64_t per_device = request.accelerator_memory_bytes > 0
                                 ? request.accelerator_memory_bytes
                                 : cost->accelerator_memory_bytes();
  plan.set_accelerator_memory_budget_bytes(per_device);
  PipelineRequest p;
  p.devices = request.pipeline_devices;
  p.micro_batch_size = *micro;
  p.micro_batches = batch / *micro;
  p.device_memory_bytes = per_device;
  p.gpipe = schedule == tandem::v1::PIPELINE_SCHEDULE_GPIPE;
  p.stash_weights = schedule == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
  p.vertical_sync = p.stash_weights && request.pipeline_vertical_sync;
  p.continuous = p.stash_weights && !p.vertical_sync && request.pipeline_continuous;
  p.allow_recompute = !p.stash_weights;
  p.allow_offload = !p.stash_weights;
  p.allow_stream_weights = p.allow_offload;
  p.allow_offload_activations = true;
  p.stop = request.stop;
  // Offloading stages update on the host at the same time: each with its
  // share of the host's update threads.
  const int host_threads =
      request.host_update_threads > 0 ? request.host_update_threads : cost->host_threads();
  p.host_threads = std::max(1, host_threads / p.devices);
  // The runner's share of the job's threads per stage (PipelineOptions).
  const StageRates rates = StageRatesOf(*cost, request, std::max(1, host_threads), p.devices);
  p.compute_scale.resize(cost->num_layers());
  for (int l = 0; l < cost->num_layers(); ++l) p.compute_scale[l] = rates.ComputeScale(l);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> stages =
      request.pipeline_stages.empty() ? PartitionPipeline(*cost, p)
                                      : TimePipelineStages(*cost, p, request.pipeline_stages);
  if (!stages.ok()) {
    if (stages.status().code() != absl::StatusCode::kResourceExhausted) return stages.status();
    plan.set_feasible(false);
    plan.mutable_solver()->set_note(absl::StrCat("pipeline: ", stages.status().message()));
    return plan;
  }
  plan.set_feasible(true);
  plan.set_min_accelerator_memory_bytes(0);
  auto predict = [&](const std::vector<tandem::v1::PipelineStage>& split, tandem::v1::Plan* into) {
    PredictPipeline(*cost, split, p.micro_batches, p.host_threads, rates, p.continuous,
                    request.clips_gradients, into);
    return into->prediction().iteration_seconds();
  };
  if (request.pipeline_stages.empty()) {
    TANDEM_ASSIGN_OR_RETURN(*stages, FastestOffload(*cost, p, *std::move(stages), plan, predict));
  }
  predict(*stages, &plan);
  return plan;
}

int64_t PlanningMemoryBytes(int layers, int batch_size) {
  layers = std::max(1, layers);
  const int64_t calls =
      int64_t{layers} * std::min(std::max(1, batch_size), MaxMicroBatches(layers));
  return (int64_t{64} << 20) + 2048 * calls + (int64_t{32} << 10) * layers;
}

bool ClipsGradients(const tandem::v1::JobSpec& spec) {
  // fp16's loss scaling reads the norm too (its overflow check).
  return spec.optimizer().max_grad_norm() > 0 || spec.precision() == tandem::v1::PRECISION_FP16;
}

void TakePlacement(const tandem::v1::JobSpec& spec, PlanRequest* r) {
  const tandem::v1::PlacementSpec& p = spec.placement();
  r->strategy = p.strategy();
  r->micro_batch_size = p.micro_batch_size();
  r->delayed_parameter_update = p.delayed_parameter_update();
  r->stream_optimizer_state = !p.no_streamed_optimizer_state();
  r->host_update_threads = spec.training().threads();
  r->clips_gradients = ClipsGradients(spec);
  r->pipeline_schedule = p.pipeline().schedule();
  r->pipeline_vertical_sync = p.pipeline().vertical_sync();
  r->pipeline_continuous = p.pipeline().continuous();
}

absl::StatusOr<PlanRequest> PlanRequestFromRpc(const tandem::v1::PlanModelRequest& rpc,
                                               const tandem::v1::Profile& model_profile) {
  PlanRequest r;
  switch (rpc.cost_source_case()) {
    case tandem::v1::PlanModelRequest::kProfile:
      r.profile = rpc.profile();
      break;
    case tandem::v1::PlanModelRequest::kHardware:
      r.profile = model_profile;
      r.hardware = rpc.hardware();
      break;
    default:
      r.profile = model_profile;
      break;
  }
  const tandem::v1::JobSpec& spec = rpc.spec();
  r.batch_size = spec.training().batch_size();
  if (r.batch_size < 0) return Invalid("spec.training.batch_size", "must be in [1, 65536]");
  r.accelerator_memory_bytes = rpc.accelerator_memory_bytes() > 0
                                   ? rpc.accelerator_memory_bytes()
                                   : spec.resources().accelerator_memory_bytes();
  r.host_memory_bytes =
      rpc.host_memory_bytes() > 0 ? rpc.host_memory_bytes() : spec.resources().host_memory_bytes();
  TakePlacement(spec, &r);
  for (int s : rpc.compare()) r.compare.push_back(static_cast<Strategy>(s));
  r.pipeline_devices = rpc.pipeline_devices() > 0 ? rpc.pipeline_devices()
                       : spec.placement().pipeline().stages() > 1
                           ? spec.placement().pipeline().stages()
                           : 1;
  r.pipeline_auto = rpc.pipeline_auto();
  if (r.pipeline_devices > 1 && r.micro_batch_size == 0 &&
      spec.placement().pipeline().micro_batches() > 0 && r.batch_size > 0) {
    r.micro_batch_size = r.batch_size / spec.placement().pipeline().micro_batches();
  }
  return r;
}

}  // namespace tandem::planner
