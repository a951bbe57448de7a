// The plan executor: runs training steps under any tandem.v1.Plan from the
// planner, on the host and an accelerator (CUDA or emulated) together.
//
// Each step is a graph of spans built from the plan, following the simulator's
// program and issue rules (schedule/lower.h) and run by a SpanEngine with one
// worker per resource: the accelerator's compute stream, the H2D and D2H copy
// engines, the host update pool, host compute. So, as CoTrain does, the moment
// layer l's gradient is ready its D2H copy starts and a CPU update takes it
// while the accelerator goes on with backward; the updated weights come back by
// H2D, and the next step's forward of l waits only for those. A step returns
// when its compute is done; CPU updates still in flight overlap the next step.
//
// Where the runtime's tensors differ from the simulator's byte accounting (a
// layer's backward reads its input, which is the previous layer's output):
//   OFFLOAD   the layer's output and saved tensors go to the host once the next
//             layer's forward has read them, and come back before the next
//             layer's backward;
//   RECOMPUTE the layer keeps its output and drops its saved tensors after the
//             next layer's forward; a RECOMPUTE span rebuilds them;
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
#include "runtime/exec/span_engine.h"
#include "runtime/exec/step_runner.h"

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
};

// Device bytes the executor holds outside the plan's accounting at `micro_batch`
// (see the file comment); plan under capacity minus this. It is
// ExecutorTransientBytes, which are live whenever a micro-batch is, plus the
// slack an offloaded or prefetched layer's activations may take while their
// copy is in flight, plus allocation rounding.
int64_t ExecutorMemoryMargin(const Model& model, int64_t micro_batch);
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
  tandem::v1::Timeline last_timeline() const override;

 private:
  struct Layer;
  struct Side;
  struct Replica;
  struct Iteration;
  PlanExecutor(const Model& model, ExecutorOptions options);
  absl::Status Init();
  // Waits for every span (updates and copies in flight included).
  absl::Status Drain();
  SpanId Add(Iteration& it, tandem::v1::TimelineResource resource, tandem::v1::TimelinePhase phase,
             int layer, int micro_batch, int64_t bytes, std::vector<SpanId> deps,
             std::function<absl::Status()> work);
  // One replica's forward and backward (and, with `updates`, its per-layer
  // updates) for this step.
  void BuildReplica(const std::shared_ptr<Iteration>& it, Replica& replica, bool updates);
  // hetero_dp: sum the replicas' gradients and step both.
  void BuildGradientSync(const std::shared_ptr<Iteration>& it);
  // A CPU-updated layer of an accelerator plan: the host step, then the copy back.
  void EmitHostUpdate(const std::shared_ptr<Iteration>& it, int layer, std::vector<SpanId> deps);
  absl::Status HostUpdate(const Iteration& it, int layer, float* grads);
  absl::Status AcceleratorUpdate(const Iteration& it, int layer);
  // Global gradient norm for clipping, over wherever each layer's gradient is.
  absl::Status ClipNorm(Iteration& it);
  // Builds the measured timeline of the newest finished iteration.
  void CollectTimelines();
  // The timing sink's view of finished spans.
  ResourceSpanBatch ResourceSpansOf(const std::vector<SpanRecord>& records);

  const Model& model_;
  ExecutorOptions options_;
  Accelerator* const accel_;
  std::unique_ptr<Optimizer> optimizer_;
  // The accelerator's memory as spans allocate it: a refusal waits for copies
  // in flight (backpressure_allocator.h). Outlives every span's buffers.
  std::unique_ptr<BackpressureAllocator> device_alloc_;
  std::vector<std::unique_ptr<Layer>> layers_;
  // Host copies: master weights, gradients (the accelerator's, when they come
  // down), optimizer moments, running statistics; hetero_dp's host replica
  // gradients.
  Buffer host_params_, host_grads_, host_buffers_, host_replica_grads_;
  std::vector<Buffer> host_moments_;
  std::unique_ptr<SpanEngine> engine_;
  int64_t iteration_ = 0;
  // The last span of each compute stream (program order).
  SpanId last_accel_compute_ = 0, last_host_compute_ = 0;
  // What TrainStep waits for: the step's last compute spans.
  std::vector<SpanId> last_spans_;
  // Each replica's last backward of every layer, this step (0: accelerator, 1: host).
  std::vector<SpanId> last_backward_[2];
  // Timeline bookkeeping: spans not yet finished, and finished records, per iteration.
  std::map<int64_t, int64_t> iteration_spans_;
  std::map<int64_t, std::vector<SpanRecord>> records_;
  tandem::v1::Timeline last_timeline_;
  bool hetero_ = false, host_only_ = false;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_PLAN_EXECUTOR_H_
