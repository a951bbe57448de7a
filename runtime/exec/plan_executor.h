// The plan executor: runs training steps under any tandem.v1.Plan from the
// planner, on the host and an accelerator (CUDA or emulated) together.
//
// A step is the plan's Schedule (schedule/lower.h), the same program the
// planner's simulator times: every operation of it becomes one span of a
// SpanEngine, with one worker per resource (the accelerator's compute stream,
// the H2D and D2H copy engines, the host update pool, host compute), with the
// schedule's dependencies (same-step, iterations back, and start-dependencies
// for prefetches) and, on a compute stream, the schedule's order. So, as
// CoTrain does, the moment layer l's gradient is ready its D2H copy starts and
// a CPU update takes it while the accelerator goes on with backward; the
// updated weights come back by H2D, and the next step's forward of l waits
// only for those. A step returns when its compute is done; CPU updates still
// in flight overlap the next step.
//
// The files: plan_executor.cc the lifecycle (state, checkpoints, evaluation,
// timelines), step_program.cc the schedule turned into spans (and the buffer
// hazards it adds), span_work.cc what each operation does to the tensors.
//
// What each operation moves, where the runtime's tensors differ from the
// schedule's byte accounting (a layer's backward reads its input, which is
// the previous layer's output):
//   OFFLOAD   ACTIVATION_D2H(l), after the layer's forward, takes its input
//             (the previous layer's output, which no forward reads again) and
//             its saved tensors to the host; ACTIVATION_H2D(l) brings them back
//             before its backward;
//   RECOMPUTE the layer keeps its output and drops its saved tensors after the
//             next layer's forward; a RECOMPUTE rebuilds them;
//   running statistics (BatchNorm) stay resident wherever the layer computes;
//   the input batch, targets and the two gradients in flight between layers
//   are held outside the plan's accounting.
// The daemon's runner factory (node/placement.h) plans under the device capacity minus
// a margin for these (ExecutorMemoryMargin), so the accelerator's hard budget is
// never exceeded by a plan the planner accepted.
// delayed_parameter_update is supported for plans without streamed layers.
//
// Driven by one thread (the trainer's); internally multi-threaded.
#ifndef TANDEM_RUNTIME_EXEC_PLAN_EXECUTOR_H_
#define TANDEM_RUNTIME_EXEC_PLAN_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "runtime/device/accelerator.h"
#include "runtime/exec/backpressure_allocator.h"
#include "runtime/exec/gradient_collective.h"
#include "runtime/exec/span_engine.h"
#include "runtime/exec/step_runner.h"
#include "schedule/lower.h"
#include "schedule/schedule.h"
#include "tandem/v1/schedule.pb.h"

namespace tandem {

struct ExecutorOptions {
  tandem::v1::Plan plan;
  tandem::v1::OptimizerSpec optimizer;
  // Largest batch TrainStep or EvalBatch will see.
  int64_t max_batch = 1;
  uint64_t init_seed = 0;
  // Host memory (master weights, host-side state, staging); must outlive the executor.
  Allocator* host_allocator = nullptr;
  // Null for cpu_only plans; must outlive the executor.
  Accelerator* accelerator = nullptr;
  // Tests only: random delay before each span, up to this (SpanEngine).
  double span_jitter_seconds = 0;
  // Tests only: an accelerator plan's layers keep bf16 working copies, as a
  // bf16 model's do, while the model computes in fp32 (each call widens the
  // copy): mixed precision's bookkeeping (masters, rounding, partitioned
  // masters, checkpoints) where oneDNN has no bf16 products to run a bf16
  // model with.
  bool test_working_copies = false;
  // Tests and benchmarks: called on a worker thread with every span's record
  // as it ends (SpanInfo::op is its schedule operation); must be thread-safe.
  std::function<void(const SpanRecord&)> span_recorder;
  // The full-batch step program to run, as the job record keeps it
  // (LowerStepProgram, Job.schedule); empty = lower the plan here. It runs
  // when it is exactly this plan's lowering for this model; one that is not
  // (damaged, or stored by another version) is replaced by the lowering, and
  // program() then differs from it, which the caller can report.
  tandem::v1::Schedule schedule;
  // A data-parallel rank's (runtime/dist/plan_rank.h): the executor steps on
  // its share of every global batch (StepOptions::sample_offset and
  // global_batch) and sums each gradient bucket over the ranks through it
  // before the bucket's updates (schedule/lower.h, DATA-PARALLEL RANKS). Null
  // for one replica. Must outlive the executor.
  GradientCollective* collective = nullptr;
  // The ranks' gradient bucket size (LowerOptions::bucket_bytes).
  int64_t bucket_bytes = int64_t{25} << 20;
  // With `collective`: ZeRO-partitioned host state (LowerOptions::
  // partition_host_state). Each host bucket is cut into one piece per rank;
  // this rank keeps the optimizer state of its pieces alone and updates them,
  // and the ranks gather each other's updated weights. host_state() then has
  // no moments: state_partition() is what this rank keeps. In bf16 mixed
  // precision the fp32 master weights are cut the same way: the rank keeps
  // its pieces of them and the ranks gather the bf16 working copies.
  bool partition_host_state = false;
};

// The step program a full batch of `plan` runs on `model` (a plan without a
// batch size takes `max_batch` samples): what PlanExecutor::schedule() will
// be. tandemd lowers it once, when it plans a job, and stores it in the job
// record. INVALID_ARGUMENT naming the plan field the executor cannot run.
absl::StatusOr<schedule::Schedule> LowerStepProgram(const Model& model,
                                                    const tandem::v1::Plan& plan,
                                                    const tandem::v1::OptimizerSpec& optimizer,
                                                    int64_t max_batch);

// Device bytes the executor holds outside the plan's accounting at `micro_batch`
// (see the file comment); plan under capacity minus this. It is
// ExecutorTransientBytes, which are live whenever a micro-batch is, plus the
// slack an offloaded or prefetched layer's activations may take while their
// copy is in flight, plus allocation rounding.
int64_t ExecutorMemoryMargin(const Model& model, int64_t micro_batch);

// Whether the executor running `plan` on `model` keeps bf16 working copies
// on the host: a bf16 copy and a bf16 gradient of its weights beside the
// fp32 masters (a bf16 model, a plan that computes on the accelerator and
// updates a layer on the host or streams its state; pipelines keep none).
bool KeepsWorkingCopies(const Model& model, const tandem::v1::Plan& plan);
int64_t ExecutorTransientBytes(const Model& model, int64_t micro_batch);

class PlanExecutor final : public StepRunner {
 public:
  // Validates the plan against the model (INVALID_ARGUMENT naming the plan
  // field), allocates the resident state and initialises the weights from
  // `init_seed` exactly as the CPU engine does.
  static absl::StatusOr<std::unique_ptr<PlanExecutor>> Create(const Model& model,
                                                              ExecutorOptions options);
  ~PlanExecutor() override;

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override;
  absl::Status SyncStateToHost() override;
  HostStateView host_state() override;
  absl::Status StateChangedOnHost() override;
  int64_t peak_host_bytes() const override;
  int64_t peak_accelerator_bytes() const override;
  tandem::v1::Plan plan() const override { return options_.plan; }
  tandem::v1::Schedule program() const override;
  // Partitioned host state: this rank's optimizer state (its pieces of the
  // host buckets, then the whole state of the layers the accelerator
  // updates), cut the same way on every rank.
  std::optional<StatePartition> state_partition() override;
  // Floats per moment of optimizer state the host keeps.
  int64_t host_state_elements() const { return host_state_elements_; }
  // fp32 master weights the host keeps (fewer than the model's under
  // partitioned masters).
  int64_t master_weight_elements() const { return host_params_.bytes() / 4; }
  tandem::v1::Timeline last_timeline() const override;
  // One line, with RegisterHost's reason, when it refused a buffer.
  std::vector<std::string> warnings() const override;
  // The program a step of a full batch runs: the plan lowered (schedule/lower.h)
  // with the layers' bytes at the plan's micro-batch. A short batch runs the
  // same program over fewer micro-batches.
  const schedule::Schedule& schedule() const;

 private:
  struct Layer;
  struct Side;
  struct Replica;
  struct Iteration;
  struct Program;
  PlanExecutor(const Model& model, ExecutorOptions options);
  absl::Status Init();
  // The host's weights (or, under partitioned masters, their whole view),
  // gradients and running statistics, initialised from the seed.
  absl::Status InitHostState();
  // Init's steps after the layers: a rank's refusals (CheckRankLayers), the
  // host's optimizer moments, and the span engine for `full`'s resources.
  absl::Status CheckRankLayers() const;
  absl::Status AllocateHostMoments();
  void StartEngine(const Program& full);
  absl::Status InitLayer(int l);
  // A layer's resident weights, running statistics and moments on the accelerator.
  absl::Status PlaceOnAccelerator(Layer& layer);
  // Waits for every span (updates and copies in flight included).
  absl::Status Drain();
  // EvalBatch's work, on a thread of its own at the compute streams' thread
  // count: run on the caller's, its parallel regions would leave workers
  // docked there and slow every later step (runtime/core/omp_threads.h).
  absl::StatusOr<EvalResult> EvalBatchOnOwnThread(const Batch& batch);

  // ---- The step program (step_program.cc) ----
  // The schedule of a step of `micro_batches` micro-batches on the replica
  // that computes layers (hetero_dp: on the accelerator), lowered on first use.
  // The program of a step of `micro_batches` micro-batches, lowered once.
  // For the full batch, the stored program (options_.schedule) when it is
  // exactly this lowering.
  absl::StatusOr<const Program*> ScheduleFor(int micro_batches, bool full_batch = false);
  void AdoptStoredProgram(int micro_batches, schedule::Schedule lowered);
  // One span per operation of `it`'s schedule.
  // Sizes the step's replicas (accelerator, host, or both for hetero_dp) for
  // its batch; returns the micro-batches the schedule runs.
  int SizeReplicas(Iteration& it) const;
  void BuildStep(const std::shared_ptr<Iteration>& it);
  // Until every compute stream's last operation of `it` (and, under loss
  // scaling, its gradient norm) is done; the engine's status.
  absl::Status WaitForCompute(const Iteration& it);
  // Adds operation `op` of iteration `it` with its schedule's dependencies,
  // its stream order and `extra` (hazards).
  void AddOp(const std::shared_ptr<Iteration>& it, int op, std::vector<SpanId> extra);
  // The span of operation `op` of the step `lag` steps before `it`, 0 if none.
  SpanId SpanOf(const Iteration& it, int op, int lag) const;
  // The dependencies the executor adds to the schedule's, for buffers the
  // schedule does not model as one copy (step_program.cc).
  std::vector<SpanId> Hazards(const Iteration& it, int op) const;
  // delayed_parameter_update: the copy back of `past`'s update of `layer`,
  // issued by the step `now` after its last backward of the layer.
  void AddDeferredReturn(const std::shared_ptr<Iteration>& past, const Iteration& now, int layer);

  // ---- The work of each operation (span_work.cc) ----
  std::function<absl::Status()> Work(const std::shared_ptr<Iteration>& it, int op);
  absl::Status Forward(Iteration& it, Replica& r, int op, bool recompute);
  absl::Status Backward(Iteration& it, Replica& r, int op);
  absl::Status LoadInputs(Iteration& it, Replica& r, int j);
  absl::Status Copy(Iteration& it, int op);
  absl::Status MoveActivations(Replica& r, int l, int j, bool to_host);
  // A streamed-state layer's moments (and master weights) in or out.
  absl::Status MoveState(Layer& layer, bool to_host);
  absl::Status HostUpdate(const Iteration& it, int layer);
  absl::Status AcceleratorUpdate(const Iteration& it, int layer);
  absl::Status AverageGradients(int layer);
  // A bucket of gradients summed over the data-parallel ranks.
  absl::Status AllReduceBucket(const Iteration& it, int op);
  // Partitioned host state: a host bucket's gradients reduce-scattered, and
  // its updated weights gathered (then rounded to the working copies).
  absl::Status ReduceScatterBucket(int op_layer);
  absl::Status GatherBucket(int op_layer);
  // Cuts each host bucket of the full program into the ranks' pieces and
  // sets each layer's share of the host moments (Layer::moment_*).
  absl::Status PartitionHostState();
  // Partitioned masters: host_params_ allocated as this rank's share, laid
  // out as the moments, and filled from the whole weights (WholeWeights).
  absl::Status KeepOwnMasters();
  // Partitioned masters: this rank's share of them from WholeWeights().
  void MastersFromWholeWeights();
  // Partitioned masters: the whole fp32 weights into WholeWeights(), each
  // host bucket's gathered from the ranks' pieces (a collective).
  absl::Status GatherMasters();
  // The first fp32 master weight of `layer` this rank keeps: of its share
  // [moment_first, moment_first + moment_elements) under partitioned host
  // state, else of the whole layer.
  float* MasterOf(const Layer& layer) const;
  // The model's whole fp32 weights as host_state() shows them: the masters,
  // or under partitioned masters the view SyncStateToHost gathers.
  float* WholeWeights() const;
  // A working copy's bf16 gradient on the host widened into host_grads_
  // (for the norm and the ranks' sums); nothing for other layers.
  void WidenHostGradient(const Layer& layer);
  // Global gradient norm for clipping, over wherever each layer's gradient is.
  absl::Status ClipNorm(Iteration& it);
  // The weights operation `op` (a forward, recompute or backward) reads as
  // they lie on its side (a working copy's in bf16).
  void* WeightsOf(Iteration& it, const Replica& r, int op);
  // The fp32 weights a layer computes with on `side`, from `weights`
  // (WeightsOf): those, or a working copy widened into `widened`.
  absl::StatusOr<const float*> ComputeWeights(const Side& side, const Layer& layer, void* weights,
                                              Buffer& widened);
  // An accelerator-updated layer's gradient in fp32: its own, or a working
  // copy's (streamed state) bf16 gradient widened into `widened`.
  absl::StatusOr<const float*> Fp32Gradient(const Layer& layer, Buffer& widened);
  // The host's working copies and bf16 gradients, where a layer has one.
  absl::Status InitWorkingCopies();
  // The working copy of every layer rounded from the host master weights.
  void RoundWorkingCopies();
  // What an H2D copy of `layer`'s weights reads: its working copy, or the
  // master weights (Layer::state_bytes() of them).
  const void* HostWeights(const Layer& layer) const;
  LayerContext ContextOf(const Iteration& it, const Replica& r, int l, int j) const;

  // Page-locks the host buffers every step copies to or from (RegisterHost); a
  // refusal leaves them pageable and is kept for warnings().
  void RegisterCopyBuffers();
  // Builds the measured timeline of the newest finished iteration.
  void CollectTimelines();
  // The timing sink's view of finished spans.
  ResourceSpanBatch ResourceSpansOf(const std::vector<SpanRecord>& records);

  const Model& model_;
  ExecutorOptions options_;
  // OpenMP threads of the compute streams (the creating thread's count).
  int compute_threads_ = 0;
  Accelerator* const accel_;
  std::unique_ptr<Optimizer> optimizer_;
  // The accelerator's memory as spans allocate it: a refusal waits for copies
  // in flight (backpressure_allocator.h). Outlives every span's buffers.
  std::unique_ptr<BackpressureAllocator> device_alloc_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // Host copies: master weights, gradients (the accelerator's, when they come
  // down), optimizer moments, running statistics; hetero_dp's host replica
  // gradients. Under partitioned masters host_params_ holds this rank's share
  // alone (MasterOf), and host_grads_ doubles as the whole weights' view
  // between steps (WholeWeights): every step's gradients overwrite it.
  Buffer host_params_, host_grads_, host_buffers_, host_replica_grads_;
  // Mixed precision (Layer::working_copy): the bf16 working copy of the master
  // weights, which the host updates write and H2D copies take up, and the
  // bf16 gradients the D2H copies bring down. Empty unless a layer has one.
  Buffer host_copy_, host_grads16_;
  // Each layer's moments at Layer::moment_offset (all of P floats unless the
  // host state is partitioned).
  std::vector<Buffer> host_moments_;
  int64_t host_state_elements_ = 0;
  // options_.partition_host_state with ranks: host_moments_ holds this rank's
  // share alone, laid out by Layer::moment_offset.
  bool partitioned_state_ = false;
  // partitioned_state_ in bf16 mixed precision: every host-updated layer has
  // a working copy, and the ranks keep pieces of its fp32 master weights.
  bool partitioned_masters_ = false;
  // Partitioned masters: whether WholeWeights() holds the weights (from
  // creation, or SyncStateToHost, until the next step).
  bool whole_view_current_ = true;
  // Partitioned host state: per host bucket (keyed by its first layer) its
  // first float in the flat buffers and its pieces, one per rank.
  struct HostBucket {
    int layers = 0;
    int64_t begin = 0;
    std::vector<int64_t> pieces;
  };
  std::map<int, HostBucket> host_buckets_;
  // Of those, the ones copies read or write every step and the accelerator
  // page-locked (Accelerator::RegisterHost); unregistered before they are freed.
  std::vector<void*> registered_host_;
  // Why a range stayed pageable ("" when all were registered).
  std::string pageable_reason_;
  // The plan's decisions as the executor runs them, the layers' bytes, and
  // the schedules lowered from them, by micro-batch count.
  schedule::Decisions decisions_;
  std::vector<schedule::LayerSizes> sizes_;
  std::map<int, std::unique_ptr<Program>> schedules_;
  const Program* full_schedule_ = nullptr;
  std::unique_ptr<SpanEngine> engine_;
  int64_t iteration_ = 0;
  // The newest steps (up to the longest lag), for dependencies iterations back.
  std::map<int64_t, std::shared_ptr<Iteration>> recent_;
  // Timeline bookkeeping: spans not yet finished, and finished records, per iteration.
  std::map<int64_t, int64_t> iteration_spans_;
  std::map<int64_t, std::vector<SpanRecord>> records_;
  tandem::v1::Timeline last_timeline_;
  bool hetero_ = false, host_only_ = false;
  // ExecutorStateType: kBF16 when host-updated layers keep working copies.
  DType state_type_ = DType::kF32;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_PLAN_EXECUTOR_H_
