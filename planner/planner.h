// The planner's entry point, for the PlanModel RPC and `tandem plan`: from a
// Profile (measured, or analytic plus a HardwareSpec) and the budgets, solve
// the requested strategy and the ones to compare, each simulated, and answer
// with a PlanModelResponse. The planner never links the runtime: whoever
// calls it supplies the profile (the node's cached one, or the runtime's
// analytic export of a model for a hardware description).
//
// Defaults: batch_size 0 = the profile's; accelerator budget 0 = the
// accelerator's capacity from the cost source; host budget 0 = the host's
// capacity (no limit when unknown); host_update_threads 0 = every host
// thread; strategy STRATEGY_UNSPECIFIED = reuse_distance when there is an
// accelerator, else cpu_only; compare empty = all five concrete strategies;
// micro_batch_size 0 = the solver's choice; pipeline_devices 0 or 1 = no
// pipeline.
//
// STRATEGY_AUTO answers with the fastest feasible plan (its `strategy` field
// names the one chosen, its solver note says so); when none fits, with the
// reuse_distance (or cpu_only) plan marked infeasible. An infeasible plan is
// a normal answer, not an error: feasible=false with
// min_accelerator_memory_bytes, the prediction at that budget (no timeline)
// and the numbers in solver.note. Errors are
// INVALID_ARGUMENT naming the field ("batch_size: ...",
// "profile.layers[3].forward_flops: must be ...") or FAILED_PRECONDITION for a
// measured profile missing timings.
//
// Thread-safe: SolvePlan keeps no state.
#ifndef TANDEM_PLANNER_PLANNER_H_
#define TANDEM_PLANNER_PLANNER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/profile.pb.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::planner {

struct PlanRequest {
  // Layers with analytic fields at least; measured device timings are used
  // when no hardware spec is given.
  tandem::v1::Profile profile;
  std::optional<tandem::v1::HardwareSpec> hardware;
  // Samples per optimizer step; 0 = profile.batch_size.
  int batch_size = 0;
  // In bytes; 0 = the capacity the cost source gives.
  int64_t accelerator_memory_bytes = 0;
  int64_t host_memory_bytes = 0;
  tandem::v1::Strategy strategy = tandem::v1::STRATEGY_UNSPECIFIED;
  std::vector<tandem::v1::Strategy> compare;
  // Samples per micro-batch; must divide batch_size; 0 = the solver's choice.
  int micro_batch_size = 0;
  bool delayed_parameter_update = false;
  int host_update_threads = 0;
  // reuse_distance may stream optimizer state (state_streaming.h).
  bool stream_optimizer_state = true;
  // The accelerator computes on the host's cores (the emulated one): auto
  // leaves hetero_dp out, whose two replicas would share those cores while
  // the simulator runs them side by side (on 2 cores such a job measured 6-8x
  // its prediction). Asked for by name, hetero_dp is still solved.
  bool accelerator_shares_host_cores = false;
  // Accelerators for a pipeline-parallel split (Plan.pipeline): above 1,
  // SolvePlan's plan is SolvePipelinePlan's and the single-device plan of
  // `strategy` joins the alternatives, for comparison.
  int pipeline_devices = 1;
  // With pipeline_devices 0 or 1: pipelines over 2, 4, 8... of the
  // hardware's accelerators (at most its accelerators and the layers, the
  // default micro-batches) compete with the single-accelerator plan, and the
  // fastest feasible one is SolvePlan's plan; the others are alternatives,
  // and the plan's note says what was compared.
  bool pipeline_auto = false;
  // Null: a pipeline's stages each have the one-accelerator budget. Else the
  // budget per accelerator of a pipeline of `stages` at micro-batches of
  // `micro_batch_size` samples (an executor's room for each stage's
  // transients and inputs in flight differs from one device's).
  std::function<int64_t(int stages, int micro_batch_size)> pipeline_stage_memory;
  // PipeDream pipelines: vertical sync (its extra weight versions count in
  // each stage's memory; pipeline_partitioner.h).
  bool pipeline_vertical_sync = false;
  // PipeDream without draining between steps (PipelineSpec.continuous): a
  // step is M slots of the slowest stage, and stage k keeps S - k - 1 stale
  // versions whatever the micro-batches.
  bool pipeline_continuous = false;
  tandem::v1::PipelineSchedule pipeline_schedule = tandem::v1::PIPELINE_SCHEDULE_UNSPECIFIED;
  // A running pipeline's measured corrections (node/closed_loop.h), per
  // layer, each multiplying what the planner would predict without them:
  // its forward and backward on its stage (thread share included), and its
  // update. Empty: none. With them the step is the pipeline formula alone:
  // the measured spans already hold what emulated stages sharing the cores
  // cost, so the all-work-in-turn bound is not taken.
  std::vector<double> pipeline_compute_scale;
  std::vector<double> pipeline_update_scale;
  // Non-empty: SolvePipelinePlan times these stages (their layers,
  // recompute and offload_optimizer) instead of partitioning.
  std::vector<tandem::v1::PipelineStage> pipeline_stages;
  // The job clips gradients (optimizer.max_grad_norm; fp16's loss scaling
  // too): every update waits for the global norm. The strategies search and
  // time their plans so (CostModel::clips_gradients), and a pipeline's
  // offloading stages update after the norm, not during their last backward
  // (PipelineOptions::overlap_host_updates).
  bool clips_gradients = false;
  // True once the caller has gone: solving ends with CANCELLED. Asked before
  // every simulation (so a strategy's search stops within one simulation of
  // one plan), between strategies and, in node::SolveForExecutor, between
  // micro-batch tries. Null = never.
  std::function<bool()> stop;
};

absl::StatusOr<tandem::v1::PlanModelResponse> SolvePlan(const PlanRequest& request);

// The cost model SolvePlan plans `request` with: the hardware spec's roofline
// over the profile, else the profile's measured timings.
absl::StatusOr<CostModel> CostModelOf(const PlanRequest& request);

// A pipeline plan (docs/pipeline.md) over request.pipeline_devices
// accelerators of request.accelerator_memory_bytes each (0: the cost
// source's accelerator memory): every layer computes,
// keeps its state and updates on its stage's accelerator; the stages are
// PartitionPipeline's for micro-batches of request.micro_batch_size (0: the
// largest divisor of the batch not above 4 x stages) held as `schedule` holds
// them. Its prediction is the
// pipeline's step: the first micro-batch through every stage and back, M - 1
// slots of the slowest stage (compute, or the exchange of its boundary
// tensors), then the slowest stage's update ((M + K - 1) slots when the
// stages are balanced); its
// accelerator peak is the largest stage's. Not feasible (with the reason in
// its note) when no partition fits.
absl::StatusOr<tandem::v1::Plan> SolvePipelinePlan(const PlanRequest& request,
                                                   tandem::v1::PipelineSchedule schedule);

// An upper estimate of SolvePlan's working memory, in bytes, for a chain of
// `layers` layers at `batch_size` samples per step: the simulations' schedules
// and timelines grow with the layer calls of one step, which the micro-batch
// bound (memory_fit.h) keeps to layers x min(batch, MaxMicroBatches(layers)).
// Calibrated on `tandem plan` peaks (RSS less the process's own): 4,001
// layers at batch 65,536 used 630 MB (estimate 728), 401 layers 420 MB
// (613), 41 layers 80 MB (151). tandemd holds it from the host budget while a
// PlanModel runs.
int64_t PlanningMemoryBytes(int layers, int batch_size);

// What a job spec says of its plan, into `r`: the strategy, micro-batch,
// delayed updates, streamed optimizer state, update threads and pipeline
// schedule and vertical sync. Every path from a spec to a request takes
// them here, so none forgets one.
void TakePlacement(const tandem::v1::JobSpec& spec, PlanRequest* r);
// Whether `spec`'s steps read the global norm of the gradients before any
// update (PlanRequest::clips_gradients): optimizer.max_grad_norm, or fp16's
// loss scaling.
bool ClipsGradients(const tandem::v1::JobSpec& spec);

// Of two rank plans of one data-parallel job (one streaming optimizer state,
// one not: planner/scale_out.h, tandemd's distributed jobs), whether the
// second is the one to run: the one that fits as a rank, else the faster;
// the first on a tie.
inline bool SecondRankPlanWins(bool first_fits, double first_seconds, bool second_fits,
                               double second_seconds) {
  return first_fits != second_fits ? second_fits : second_seconds < first_seconds;
}

// A pipeline's micro-batch size: the request's, or the largest divisor of
// `batch` not above 4 x pipeline_devices micro-batches' worth;
// INVALID_ARGUMENT when the request's does not divide the batch.
absl::StatusOr<int> PipelineMicroBatch(const PlanRequest& request, int batch);

// The request the RPC describes. `model_profile` is the model's profile when
// the RPC carries none (cost source unset: the node's cached profile;
// hardware: the runtime's analytic export for spec.model).
absl::StatusOr<PlanRequest> PlanRequestFromRpc(const tandem::v1::PlanModelRequest& rpc,
                                               const tandem::v1::Profile& model_profile);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PLANNER_H_
