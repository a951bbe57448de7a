// Where a job runs: the node's hardware as the planner sees it, the plan for a
// job's model on it, and the runner that executes that plan. Used by tandemd
// (admission, PlanModel, job runners) and by `tandem train` / `tandem plan`.
//
// The plan a job runs under is solved from the model's analytic profile
// (runtime/profile/layer_profiler.h AnalyticProfile) and the node's hardware:
// the host's measured GEMM and triad rates, and the job's accelerator — the
// node's CUDA GPU (rates from its model name, see AcceleratorSpec) or the
// emulated accelerator (the host's rates, the job's link cap). The planner is
// given the accelerator's capacity minus ExecutorMemoryMargin, the executor's
// own transient buffers, so a plan the planner accepts never exceeds the
// device budget at run time.
//
// Thread-safe: every function keeps no state but the host measurement, taken
// once per process.
#ifndef TANDEM_NODE_PLACEMENT_H_
#define TANDEM_NODE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "node/resources.h"
#include "planner/planner.h"
#include "planner/simulator.h"
#include "runtime/cuda/device_query.h"
#include "runtime/device/accelerator.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/model/model.h"
#include "runtime/train/trainer.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/profile.pb.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::node {

// What this node offers jobs.
struct NodeOffer {
  // The host as the planner sees it (MeasureHostProcessor).
  tandem::v1::ProcessorSpec host;
  std::vector<cuda::CudaDeviceInfo> cuda_devices;
  // Accelerator memory a job gets when its spec says none, and all jobs
  // together may use: AcceleratorMemoryBudget (node/resources.h), 90% of the
  // GPU unless tandemd's --accelerator_memory_budget says otherwise; also the emulated
  // accelerator's default capacity. 0 (no GPU and no flag): the emulated
  // accelerator needs resources.accelerator_memory_bytes.
  int64_t accelerator_memory_budget_bytes = 0;
  // What tandemd measured of this node (runtime/profile/node_profile.h), when
  // it did: its figures replace the datasheet and assumed ones in NodeHardware
  // (the emulated link's rate, each CUDA link's pinned bandwidth and latency).
  std::optional<tandem::v1::NodeProfile> profile;
  // Where `profile` came from, for GetNode: "measured at start-up in 2.1 s",
  // "cached from <time>".
  std::string profile_source;
  // Tests of closed-loop planning only (tandemd's --emulated_link_throttle):
  // the emulated accelerator's copies run at most this fast, in bytes per
  // second, and the planner is not told — a link slower than the node profile
  // measured. 0 = none.
  double emulated_link_throttle_bytes_per_second = 0;
  // Emulated accelerators a job may use at once (tandemd's
  // --emulated_accelerators): a pipeline job (placement.pipeline) takes one
  // per stage, each with the job's accelerator capacity, its own copy engine
  // and compute thread.
  int emulated_accelerators = 1;
  // The emulated accelerators reach each other's memory over a peer link at
  // their host link's rate (tandemd's --emulated_peer_link): a pipeline's
  // stages pull activations and gradients from each other's device instead
  // of staging them through host memory, and the planner times one copy
  // over that link instead of two through the host.
  bool emulated_peer_link = true;
};

// Accelerators of the job's kind that `node` offers: its emulated ones, or
// its CUDA devices.
int AcceleratorCount(const tandem::v1::JobSpec& resolved, const NodeOffer& node);

// What a pipeline stage holds beyond the planner's stage memory (its state,
// and its layers' activations and its input for each micro-batch in flight),
// in bytes: the executor's transient buffers at `micro_batch`
// (ExecutorMemoryMargin), the largest layer workspace at that micro-batch
// (a convolution's does not shrink with the batch as the cost model scales
// it), the first stage's batch inputs in flight (`inputs_in_flight` of them)
// and the alignment of each layer's slice in the parameters, gradients and
// optimizer moments (64 bytes each). PlanJob keeps it out of each stage's
// budget.
int64_t PipelineStageMargin(const Model& model, int64_t micro_batch, int inputs_in_flight);
// The first stage's batch inputs in flight at once under `pipe`'s schedule
// over `stages` stages of `micro_batches`: every micro-batch's (GPipe), the
// stages' count (a continuous PipeDream, whose micro-batches stay in flight
// across steps), else the fewer of the two.
int PipelineInputsInFlight(const tandem::v1::PipelineSpec& pipe, int stages, int micro_batches);

// The host's fp32 GEMM rate (oneDNN) and triad bandwidth, measured once per
// process on the calling thread's OpenMP team (about half a second), with the
// thread count and physical memory.
tandem::v1::ProcessorSpec MeasureHostProcessor();

// The node with the host as MeasureHostProcessor sees it, the CUDA devices
// already queried (DetectNodeResources' or the caller's; querying opens the
// driver, so it is done once), and the accelerator budget of `flag_bytes`
// (0 = the default, AcceleratorMemoryBudget).
NodeOffer DetectNodeOffer(
    int64_t flag_bytes, std::vector<cuda::CudaDeviceInfo> cuda_devices = cuda::QueryCudaDevices());

// The same from a measured node profile instead of MeasureHostProcessor: the
// host's GEMM rate, triad bandwidth and, as its "optimizer" efficiency, the
// measured Adam rate (28 bytes of traffic per parameter) over the triad's.
NodeOffer NodeOfferFromProfile(const tandem::v1::NodeProfile& profile, int64_t flag_bytes,
                               std::vector<cuda::CudaDeviceInfo> cuda_devices);

// The accelerator capacity `resolved` gets, in bytes: resources.
// accelerator_memory_bytes, else the node's budget, else (CUDA) the device's
// memory. 0 when the job has no accelerator. INVALID_ARGUMENT naming
// resources.accelerator_memory_bytes for an emulated job with no capacity
// anywhere; FAILED_PRECONDITION for CUDA on a node without a CUDA device.
absl::StatusOr<int64_t> AcceleratorCapacity(const tandem::v1::JobSpec& resolved,
                                            const NodeOffer& node);

// A ProcessorSpec for a CUDA device: dense TF32 and FP32 rates and memory
// bandwidth from NVIDIA's datasheets for the H100 (SXM, PCIe) and H200, else
// estimated from the SM count and compute capability.
tandem::v1::ProcessorSpec AcceleratorSpec(const cuda::CudaDeviceInfo& device);

// The hardware `resolved` runs on here: the host, plus the job's accelerator
// with `capacity` bytes (none for placement.accelerator NONE).
absl::StatusOr<tandem::v1::HardwareSpec> NodeHardware(const tandem::v1::JobSpec& resolved,
                                                      const NodeOffer& node, int64_t capacity);

// SolvePlan with the executor's margin kept out of the accelerator budget:
// `capacity` (0 = the cost source's) less ExecutorMemoryMargin(model, micro-
// batch). When the requested plan is infeasible and the spec fixes no micro-
// batch, smaller micro-batches (divisors of the batch) are tried, whose margin
// is smaller. An infeasible plan's min_accelerator_memory_bytes includes the
// margin; its solver note says so.
absl::StatusOr<tandem::v1::PlanModelResponse> SolveForExecutor(const Model& model,
                                                               planner::PlanRequest request,
                                                               int64_t capacity);

// The plan `resolved` would run under on this node: its placement.plan when
// given (checked against the model), else solved for placement.strategy alone.
// Empty for a job without an accelerator on the plain CPU engine (cpu_only).
// RESOURCE_EXHAUSTED when no plan of the strategy fits the accelerator, with
// the smallest capacity that would. On a CUDA GPU the capacity planned under
// excludes the 33 MiB the device holds for itself (cuBLAS's workspace).
//
// With `measured` (a layer profile of this model measured on this node, see
// node/closed_loop.h) the plan is solved from its timings and links instead of
// the analytic profile on NodeHardware.
//
// placement.pipeline.auto_stages: the one-accelerator plan and pipelines over
// 2, 4, 8, ... accelerators are all solved, and the fastest predicted that
// fits is returned, its solver note listing each candidate's prediction;
// ChosenStages then makes the spec say what it chose.
//
// `corrections` (a pipeline of stages > 1 only): what an earlier run's stages
// measured (PipelineCorrections, below), as PlanPipelineJob takes them.
struct PipelineCorrections;
absl::StatusOr<tandem::v1::Plan> PlanJob(const Model& model, const tandem::v1::JobSpec& resolved,
                                         const NodeOffer& node,
                                         const tandem::v1::Profile* measured = nullptr,
                                         const PipelineCorrections* corrections = nullptr);

// What a running pipeline measured, as corrections to its planning
// (node/closed_loop.h; planner::PlanRequest's pipeline_* fields): per layer,
// factors on its compute and update; `stages` non-empty: that split timed
// instead of a partition solved.
struct PipelineCorrections {
  std::vector<double> compute_scale;
  std::vector<double> update_scale;
  std::vector<tandem::v1::PipelineStage> stages;
  // For the plan's cost source: whose they are and what they measured.
  std::string note;
};
using PipelineCorrectionLookup = std::function<std::optional<PipelineCorrections>(
    const Model& model, const tandem::v1::JobSpec& resolved, const tandem::v1::Profile* base)>;

// PlanJob for placement.pipeline.stages > 1: the planner's partition
// (planner::SolvePipelinePlan) over that many accelerators of the job's
// capacity, corrected by `corrections` when given.
absl::StatusOr<tandem::v1::Plan> PlanPipelineJob(const Model& model,
                                                 const tandem::v1::JobSpec& resolved,
                                                 const NodeOffer& node,
                                                 const tandem::v1::Profile* measured,
                                                 const PipelineCorrections* corrections = nullptr);

// `resolved` as a spec asking for what its auto_stages plan chose (its
// pipeline's stages, or one accelerator): ResolvePipelineStages. A spec
// without auto_stages comes back as it is.
absl::StatusOr<tandem::v1::JobSpec> ChosenStages(tandem::v1::JobSpec resolved,
                                                 const tandem::v1::Plan& plan);

// The step program `plan` runs for `resolved`'s model (LowerStepProgram,
// schedule/schedule.h as a message): what tandemd stores in the job record
// (Job.schedule) and hands back to the executor. Empty for the CPU engine and
// for a pipeline's plan (its runner runs the pipeline's own schedule,
// runtime/exec/pipeline_runner.h).
absl::StatusOr<tandem::v1::Schedule> StepProgram(const Model& model,
                                                 const tandem::v1::JobSpec& resolved,
                                                 const tandem::v1::Plan& plan);

// The PlanModel RPC (and `tandem plan`): the spec's model planned against the
// request's cost source (a profile, a hardware spec, or this node), every
// strategy asked for compared; PlanModelResponse.cost_source says what the
// plans were timed with and which figures were measured. Errors name the
// request field.
using MemoryReserver = std::function<absl::StatusOr<std::shared_ptr<void>>(int64_t bytes)>;
// A layer profile of `model` measured on this node for `resolved`
// (LayerProfileCache, node/closed_loop.h), when there is one.
using LayerProfileLookup = std::function<std::optional<tandem::v1::Profile>(
    const Model& model, const tandem::v1::JobSpec& resolved)>;
struct PlanModelContext {
  // Resolves the spec's data paths (null = as given).
  PathResolver resolve;
  // Null = never; else it ends planning with CANCELLED (planner::PlanRequest::stop).
  std::function<bool()> stop;
  // Null = none; called once the model is known and before any solving with
  // planner::PlanningMemoryBytes, it returns a hold kept until the answer is
  // made, or the error to answer with (tandemd: the host budget's
  // RESOURCE_EXHAUSTED).
  MemoryReserver reserve;
  // Null = none. Planning for this node (no cost source in the request), a
  // profile it returns replaces the analytic profile and the node's rates, as
  // in PlanJob.
  LayerProfileLookup measured;
  // Planning for this node: the threads of a spec that sets none, as its job
  // would run (ResolveUnsetThreads; tandemd's --job_threads, 0: all cores).
  int job_threads = 0;
  // Null = none. Planning a pipeline spec for this node: the corrections an
  // earlier run of the same pipeline measured here, given the profile it is
  // planned from (null: the analytic one), as a submission plans with them.
  PipelineCorrectionLookup pipeline_corrections;
};
absl::StatusOr<tandem::v1::PlanModelResponse> PlanModel(const tandem::v1::PlanModelRequest& request,
                                                        const NodeOffer& node,
                                                        const PlanModelContext& context = {});

// What a plan solved from `measured` (a layer profile from
// MeasuredLayerProfile) was timed with, for PlanRecord.cost_source and
// PlanModelResponse.cost_source: its steps, when, and its note of which
// figures were measured.
std::string MeasuredCostSource(const tandem::v1::Profile& measured);
// The same for a plan solved from the analytic profile on `node`.
std::string AnalyticCostSource(const NodeOffer& node);

// The runner factory for Trainer: the plain CPU engine for jobs without an
// accelerator, else the plan executor on the job's accelerator. With
// `stored_plan` (the plan a job was admitted under, from its record) the runner
// runs that plan, an empty one meaning the CPU engine, and `stored_program`
// (the record's Job.schedule) when given as its step program; without, it
// solves PlanJob's plan (the CLI's `tandem train`). A stored plan that no
// longer fits the node is solved again, and its program lowered again.
RunnerFactory MakeRunnerFactory(NodeOffer node,
                                std::optional<tandem::v1::Plan> stored_plan = std::nullopt,
                                tandem::v1::Schedule stored_program = {});

// The plan of a data-parallel rank of `resolved` (one of `ranks`, with an
// accelerator) on this node: PlanJob's for its share of the global batch,
// ceil(training.batch_size / ranks) samples (placement.plan when the spec
// gives one). A job's coordinator solves it at submission (its memory is what
// the coordinator's own rank reserves), stores it as the job's plan and pins
// it in the spec every rank gets, so that all ranks run the same step program:
// the same gradient buckets, summed in the same order, whatever each node
// measured. `stored`, when it is a plan of this model for a rank's share
// (RankBatch), is that plan, kept as it is rather than solved again (a node
// profile refreshed since would solve another).
//
// `measured`: a rank's layer profile measured here before (LayerProfileCache),
// solved from instead of the analytic profile on the node's rates.
absl::StatusOr<tandem::v1::Plan> RankPlan(const Model& model, const tandem::v1::JobSpec& resolved,
                                          const NodeOffer& node, int ranks,
                                          const tandem::v1::Plan* stored = nullptr,
                                          const tandem::v1::Profile* measured = nullptr);
// `plan` (RankPlan's for `resolved` on `node`) timed as one of
// `ranks.ranks` ranks runs it: its gradient buckets reduced over the ranks in
// `ranks.collective_seconds`, from the cost source RankPlan plans from
// (`measured`, else the analytic profile on the node's rates, with the rank's
// share of the cores).
// The placement stays; the prediction, timeline and reuse distances are the
// rank's. INVALID_ARGUMENT without ranks or collectives.
absl::StatusOr<tandem::v1::Plan> TimeAsRank(const Model& model, const tandem::v1::JobSpec& resolved,
                                            const NodeOffer& node, const tandem::v1::Plan& plan,
                                            const planner::SimulationOptions& ranks,
                                            const tandem::v1::Profile* measured = nullptr);
// `plan` with `sim`'s prediction, timeline and per-layer reuse distances and
// slack, its solver method `method`.
tandem::v1::Plan TimedBy(tandem::v1::Plan plan, const planner::SimulationResult& sim,
                         const std::string& method);
// How many of a distributed job's ranks share one node's host: one per
// accelerator of the job's kind, up to its replicas (the coordinator fills its
// own node's accelerators first); 1 for a job on the CPU engine. RankPlan
// plans each with max(1, host threads / that) of the host's cores, and the
// job's ranks run on as many threads (JobManager's resolution).
int RanksSharingHost(const tandem::v1::JobSpec& resolved, const NodeOffer& node);
// Each of `ranks` ranks' threads on a node whose jobs get `job_threads`
// (--job_threads; 0: all) of its `node_cores`: an even share, at least one.
int ThreadsPerRank(int job_threads, int node_cores, int ranks);
// A job that sets no training.threads runs on `job_threads` (--job_threads)
// when that is > 0: `resolved` then says so, so that it is planned (an
// emulated accelerator's rates) and keyed in the measured-profile caches on
// that count, by submission and `tandem plan` alike. Unset, it runs on all
// the node's cores.
void ResolveUnsetThreads(int job_threads, tandem::v1::JobSpec& resolved);
// `processor` on `threads` of its cores: the rates those reach
// (planner::ThreadsRate, memory bandwidth alike); as it is for 0 or all.
tandem::v1::ProcessorSpec OnThreads(const tandem::v1::ProcessorSpec& processor, int threads);
// The largest share of the global batch one of `ranks` ranks trains.
int64_t RankBatch(const tandem::v1::JobSpec& resolved, int ranks);
// Whether `plan` is one RankPlan made for `resolved`'s ranks: a plan of every
// layer of `model` at a rank's share of the batch.
bool IsRankPlan(const Model& model, const tandem::v1::JobSpec& resolved,
                const tandem::v1::Plan& plan);

// What such a rank runs on this node: RankPlan's plan on the job's
// accelerator, as executor options; runtime/dist/plan_rank.h adds the rank's
// collectives. `options.accelerator` points at `accelerator`, which must
// outlive them.
struct RankExecutor {
  std::unique_ptr<Accelerator> accelerator;
  ExecutorOptions options;
};
// `accelerator_index`: which of the node's accelerators the rank runs on.
absl::StatusOr<RankExecutor> PrepareRankExecutor(const Model& model,
                                                 const tandem::v1::JobSpec& resolved,
                                                 const NodeOffer& node, int ranks,
                                                 Allocator* host_allocator,
                                                 int accelerator_index = 0);

}  // namespace tandem::node

#endif  // TANDEM_NODE_PLACEMENT_H_
