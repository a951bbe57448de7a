// Pipeline-parallel execution over several accelerators of one node
// (docs/pipeline.md): the model cut into K stages, each a contiguous run of
// layers whose weights, gradients, optimizer state and activations live on
// its own accelerator; a batch split into M micro-batches that flow through
// the stages, activations forward and their gradients back, copied between
// the stage devices over a peer link where the devices have one
// (Accelerator::HasPeerLink: the receiver pulls from the sender's memory),
// else through staging host memory.
//
// Schedules, both synchronous and exactly one-device training at the same
// micro-batches (gradients accumulated over the micro-batches, one update per
// step):
//  - GPipe: every stage runs all M forwards, then all M backwards; a stage
//    holds the activations of all M micro-batches.
//  - 1F1B (PipeDream-Flush): stage s runs min(K-s-1, M) forwards, then
//    alternates one forward and one backward, then the remaining backwards;
//    a stage holds at most K-s micro-batches' activations.
//  - PipeDream (asynchronous 1F1B with weight stashing): 1F1B's order, but
//    each stage updates its layers after every micro-batch's backward, with
//    that micro-batch's mean gradient; the backward runs on the weights the
//    micro-batch's forward used, stashed on the device (stage s keeps
//    min(K-s-1, M) + 1 versions). Stage s's gradient of micro-batch m is
//    min(m, K-s-1) updates stale (continuous: K-s-1 once the stream is
//    full): not one device's training. No gradient clipping (it would need
//    every stage's norm before any update). With vertical sync, every stage
//    runs micro-batch m on the weight version the first stage ran it on
//    (the first stage's count of updates when m entered it), so every
//    stage's gradients of micro-batch m are min(m, K-1) updates stale
//    alike; stage s keeps
//    its last s + 1 versions for that.
//    Continuous (PipelineOptions::continuous, without vertical sync): the
//    pipeline does not drain between steps. Stage s's last K-s-1 backwards
//    of a step run in the next one, each after one of its forwards, as in
//    one long stream of micro-batches: what T steps of M micro-batches do is
//    what one step of the T batches' M x T micro-batches would do, and only
//    the first step fills the pipeline. It drains (the pending backwards
//    and their updates) before evaluation, a read of the state (a
//    checkpoint) and at the end.
// Each stage runs on its own thread (its device's compute stream) and waits
// only for what it consumes; the update of every stage follows its last
// backward (after the global gradient norm, when clipping), except that an
// offloading stage's host updates start layer by layer during that backward
// (PipelineOptions::overlap_host_updates).
//
// Thread-compatible, like every StepRunner: one thread drives it.
#ifndef TANDEM_RUNTIME_EXEC_PIPELINE_RUNNER_H_
#define TANDEM_RUNTIME_EXEC_PIPELINE_RUNNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/core/allocator.h"
#include "runtime/device/accelerator.h"
#include "runtime/exec/step_runner.h"
#include "runtime/model/model.h"
#include "runtime/optim/optimizer.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

enum class PipelineSchedule { kGPipe, kOneFOneB, kPipeDream };
const char* PipelineScheduleName(PipelineSchedule schedule);

struct PipelineStageSpec {
  // Layers [first_layer, end_layer) of the model.
  int first_layer = 0;
  int end_layer = 0;
  // Where the stage lives; not owned, outlives the runner. One device per stage.
  Accelerator* device = nullptr;
  // GPipe's re-materialisation (GPipe and 1F1B): the stage keeps only each
  // micro-batch's input after its forward and runs that forward again
  // (LayerContext::recompute: same result, no running-statistics update)
  // before the backward; the same training, one micro-batch's activations
  // at a time.
  bool recompute = false;
  // ZeRO-Offload within the stage (GPipe and 1F1B): its optimizer state
  // stays in the runner's host copy and its end-of-step update runs on the
  // host (gradients down, the CPU kernel, weights back up); the device holds
  // the stage's weights and gradients only. The same update as on the device.
  bool offload_optimizer = false;
  // With offload_optimizer: only the stage's last this many layers keep
  // their optimizer state on the host and update there (their gradients are
  // final first in the last backward, so their host updates overlap the
  // most of it); the others keep theirs on the device and update there. 0:
  // every layer of the stage.
  int host_updated_layers = 0;
  // With offload_optimizer: the host-updated layers' weights stay in the
  // runner's host copy (their master, which their host update writes) and
  // come up to the device for each forward and backward of each micro-batch
  // (recompute's forward too), on a fetch thread of the stage's own that
  // copies the next layer's while the stage computes the current one (the
  // next op's first across ops). The device holds their gradients and at
  // most two of their layers' weights; nothing goes back up after the
  // update. The same training, for 2M (3M recomputing) copies of those
  // weights a step instead of one.
  bool stream_weights = false;
  // The other way to hold few micro-batches' activations (every schedule;
  // not with recompute): each micro-batch's layer outputs and saved tensors
  // go down to the device's staging host memory after its forward and come
  // back before its backward, on a copy thread of the stage's own while it
  // computes (down as the forward ends, up during the op before the
  // backward). The same training, for two copies of them per micro-batch;
  // the device holds at most two micro-batches' activations (the one
  // computing, and the one moving).
  bool offload_activations = false;
  // With offload_activations: the stage waits for each copy and holds one
  // micro-batch's activations at a time.
  bool wait_for_activation_copies = false;
};

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  // Micro-batches per step; a batch of B splits into ceil(B / ceil(B / M))
  // pieces of ceil(B / M) samples (the last smaller), as the plan executor
  // splits it at micro_batch_size ceil(B / M).
  int micro_batches = 1;
  int64_t max_batch = 0;
  uint64_t init_seed = 0;
  // kPipeDream only: vertical sync (above).
  bool vertical_sync = false;
  // kPipeDream without vertical sync only: no drain between steps (above).
  bool continuous = false;
  // Offloading stages (PipelineStageSpec::offload_optimizer) without gradient
  // clipping update each layer on the host as soon as the step's last
  // backward has made its gradient final, on a thread of their own, while
  // the stage's backward goes on (ZeRO-Offload's overlap of the update with
  // backward); false: the whole stage's update after its last backward. The
  // same update either way. Clipping needs every stage's norm first, and
  // always updates at the end.
  bool overlap_host_updates = true;
  // OpenMP threads of each stage's thread; 0 = the creating thread's count
  // shared among the stages, at least one each. The stages compute side by
  // side: teams of the whole count each would outnumber the cores, and
  // libgomp then makes every team sleep at its barriers
  // (runtime/core/omp_threads.h).
  int threads_per_stage = 0;
};

// What one stage did in the latest step.
struct PipelineStageStats {
  // Forward and backward compute, and PipeDream's weight-version copies.
  double busy_seconds = 0;
  // Copying activations and gradients in and out of its device, and the
  // part of that over a peer link: the stage's thread's time in copies
  // (offloaded activations: its waits for them, the copy thread's own work
  // being in the timeline).
  double copy_seconds = 0;
  double peer_copy_seconds = 0;
  // The rest of the step's forward-backward phase: waiting for a neighbour.
  double bubble_seconds = 0;
  // The optimizer update: after the last backward, or (overlapped host
  // updates) the layers' updates' own time, part of it during backward.
  double update_seconds = 0;
  // Streamed weights: the stage's thread's waits for them (part of
  // copy_seconds).
  double weight_fetch_seconds = 0;
  // Peak device bytes since the runner started.
  int64_t peak_bytes = 0;
};

class PipelineRunner final : public StepRunner {
 public:
  // INVALID_ARGUMENT when the stages do not cover the model's layers in order
  // (each non-empty), share a device, or the micro-batches are not in
  // [1, max_batch]; RESOURCE_EXHAUSTED when a stage's state does not fit its
  // device. `optimizer` must be resolved.
  static absl::StatusOr<std::unique_ptr<PipelineRunner>> Create(
      const Model& model, const tandem::v1::OptimizerSpec& optimizer,
      std::vector<PipelineStageSpec> stages, PipelineOptions options);
  ~PipelineRunner() override;

  // A failed step (or drain) leaves the stages partly updated: some stages'
  // updates applied, others not; a continuous pipeline's pending backwards of
  // a step that will never finish. Nothing is rolled back: until
  // StateChangedOnHost puts a consistent state (a checkpoint's) back,
  // TrainStep, EvalBatch and SyncStateToHost answer FAILED_PRECONDITION
  // naming the first failure, so the partial state is neither trained on
  // nor saved.
  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override;
  absl::Status SyncStateToHost() override;
  HostStateView host_state() override;
  absl::Status StateChangedOnHost() override;
  int64_t peak_host_bytes() const override;
  // The largest stage's peak.
  int64_t peak_accelerator_bytes() const override;

  tandem::v1::Plan plan() const override { return plan_; }
  // The latest step: stage k's forward, backward and update spans on lane k of
  // ACCELERATOR_COMPUTE, its copies in and out on lane k of COPY_H2D and
  // COPY_D2H (activations forward, their gradients back).
  tandem::v1::Timeline last_timeline() const override { return timeline_; }
  std::vector<tandem::v1::PipelineStageStats> pipeline_stats() const override;
  // PipeDream: rule "pipedream", every stage's updates since the runner
  // started, each counted at its lag (the updates the stage applied between
  // the weights its micro-batch ran forward on and it); the other schedules
  // are synchronous (empty: the trainer's default).
  tandem::v1::UpdateStats update_stats() const override;

  // The runner keeps `devices` (its stages' accelerators) alive until after
  // its buffers are freed.
  void AdoptDevices(std::vector<std::unique_ptr<Accelerator>> devices) {
    owned_devices_ = std::move(devices);
  }
  // The plan it runs, for the job record (its stages' predicted memory).
  void set_plan(tandem::v1::Plan plan) { plan_ = std::move(plan); }

  int num_stages() const { return static_cast<int>(stages_.size()); }
  const std::vector<PipelineStageStats>& stage_stats() const { return stats_; }
  // The latest step's forward-backward wall time (the phase the bubbles are of).
  double last_pipeline_seconds() const { return last_pipeline_seconds_; }

 private:
  struct Stage;
  struct Parcel;
  struct Step;
  PipelineRunner(const Model& model, PipelineOptions options);

  // A stage's state on its device, zeroed gradients included.
  absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const PipelineStageSpec& spec, int index,
                                                   int stages) const;
  // PipeDream: how stale the stage's gradients are and how many weight
  // versions it stashes (and, with vertical sync, keeps) among `stages`.
  void SizeWeightVersions(Stage& stage, int stages) const;
  // Stage s's layers forward on micro-batch m's input, filling out/saved
  // (`recompute`: a second time, before its backward).
  absl::Status RunForward(Step& step, int s, int m, bool recompute);
  // Offloading activations: micro-batch m's outputs and saved tensors of
  // `stage` to staging host memory (`down`) or back to its device, on the
  // stage's copy thread (spans into its copy_spans).
  absl::Status MoveActivations(Step& step, Stage& stage, int m, bool down);
  // That move queued on the stage's copy thread (coming back: once per
  // micro-batch); waiting on the stage's thread for micro-batch m's to be
  // back (the wait counted in its copy time); waiting for the copy thread
  // to be idle, its spans taken into the step's, and its first failure.
  void QueueActivations(Step& step, Stage& stage, int m, bool down);
  absl::Status ActivationsBack(Step& step, Stage& stage, int m);
  absl::Status FinishCopies(Stage& stage);
  // Streamed weights (PipelineStageSpec::stream_weights): layer l's weights
  // on the stage's device for the compute about to run (null when l's are
  // resident or it has none): those held since the compute before when it
  // was of l, else fetched (or taken from the fetch queued ahead), the
  // layer before's freed first; then the fetch of the next streamed layer
  // the op computes (`backward`: down), else of `after` (of micro-batch
  // after_m; -1: none), queued behind it. The wait is counted in the
  // stage's copy time, and a fetch's span goes into the timeline when
  // `record`.
  absl::StatusOr<const float*> WeightsFor(Stage& stage, int l, int m, bool backward, int after,
                                          int after_m, bool record);
  // Layer l's weights from the host copy into a new buffer on the stage's
  // device (on the stage's thread or its fetch thread).
  absl::StatusOr<Buffer> FetchWeights(Stage& stage, int l, int m, bool record);
  // The first streamed layer with weights after l in the direction the
  // compute goes (`backward`: down); -1: none.
  int NextStreamed(const Stage& stage, int l, bool backward) const;
  // Queues the fetch of layer l's weights (for micro-batch m; -1: none) on
  // the stage's fetch thread, dropping one of another layer first; nothing
  // when they are held or coming already.
  void PrefetchWeights(Stage& stage, int l, int m, bool record);
  // Waits for a fetch still in flight and drops it.
  void DropFetch(Stage& stage);
  // After the stage's part of a step or evaluation, when the host's state
  // changes, and before the runner goes: no weights held or coming, the
  // fetches' spans taken into the stage's.
  void ReleaseWeights(Stage& stage);
  // EvalBatch's work: each micro-batch through the stages in turn.
  absl::StatusOr<EvalResult> EvalStageAfterStage(const Batch& batch);
  // Continuous PipeDream: every stage's pending backwards (and updates) run,
  // so that the state is the stream's so far.
  absl::Status Drain();
  // PipeDream: stage s's update after micro-batch m's backward.
  absl::Status UpdateAfter(Step& step, int s, int m);
  // Vertical sync: copies the stage's weights into its history slot for its
  // updates so far this step (nothing without a history).
  absl::Status KeepVersion(Stage& stage);
  // The end-of-step update of GPipe and 1F1B, after the global norm.
  absl::Status UpdateAtEnd(Step& step, int s);
  // An offloading stage's update of its parameters [offset, offset + n)
  // (layer `layer`'s, or -1: all of them): their gradients down, the host's
  // update of the host copy, the weights back up; its spans into `spans`.
  absl::Status UpdateOnHost(Stage& stage, const StepConstants& c, int layer, int64_t offset,
                            int64_t n, std::vector<tandem::v1::TimelineSpan>& spans);
  // Overlapped host updates: layer l's update queued on the stage's update
  // thread; waiting for the stage's queue, its spans and work taken into the
  // step's, and its first failure.
  void QueueHostUpdate(const Step& step, Stage& stage, int l);
  absl::Status FinishHostUpdates(Stage& stage);
  // `batch` split into micro-batches, the stages' slots and mailboxes sized.
  void Begin(Step& step, const Batch& batch, bool training);
  // Every stage on its own thread through the step; the stats and the
  // timeline of it.
  absl::Status RunStages(const std::shared_ptr<Step>& step);
  // RunStage on every stage's thread (`step` null: draining), each stage's
  // end time in `ended`; a failure fails every step in flight.
  absl::Status OnEveryStage(const std::shared_ptr<Step>& step, std::vector<double>* ended);
  absl::Status RunStage(const std::shared_ptr<Step>& step, int s);
  // RunStage's forwards, backwards and update, before its copies finish.
  absl::Status RunStageOps(const std::shared_ptr<Step>& step, int s);
  // A stage's input for micro-batch m (the batch's slice, or the stage
  // before's output) and, on the last stage, its targets, on its device.
  absl::Status ReceiveInput(Step& step, int s, int m);
  // The stage's output handed on: to the next stage's mailbox, or (last
  // stage) the losses and, in evaluation, the correct predictions.
  absl::Status SendOutput(Step& step, int s, int m);
  // The gradient of the stage's output for micro-batch m on its device: the
  // loss's (last stage), or the next stage's input gradient.
  absl::StatusOr<Buffer> ReceiveGradient(Step& step, int s, int m);
  // The gradient of the stage's input, `dx`, handed to the stage before.
  absl::Status SendGradient(Step& step, int s, int m, Buffer dx);
  // What a neighbour hands `stage` through `box`, once there, in a new
  // buffer on its device: pulled over the peer link, or copied from staging
  // host memory; counted in the stage's copy time, and (`record`) a span
  // of layer `layer`. ABORTED when another stage failed.
  absl::StatusOr<Buffer> Receive(Step& step, Stage& stage, Parcel& box, int layer, int m,
                                 bool record);
  // `from` (on `stage`'s device) copied down to its staging host memory, to
  // hand on; counted likewise.
  absl::StatusOr<Parcel> Staged(Stage& stage, const Buffer& from, int layer, int m, bool record);
  absl::Status StageForward(Step& step, int s, int m);
  absl::Status StageBackward(Step& step, int s, int m);
  absl::Status Update(const StepOptions& options, double* grad_norm);
  // `weights`: a streamed layer's (WeightsFor).
  LayerContext ContextOf(const Stage& stage, int l, int64_t mb_start, bool training,
                         const StepOptions& options, const float* weights = nullptr) const;

  const Model& model_;
  const PipelineOptions options_;
  // The creating thread's OpenMP threads (evaluation runs at this count) and
  // each stage's share of them.
  int threads_ = 1;
  int stage_threads_ = 1;
  tandem::v1::Plan plan_;
  // Declared before stages_: destroyed after the stages' buffers.
  std::vector<std::unique_ptr<Accelerator>> owned_devices_;
  std::vector<std::unique_ptr<Stage>> stages_;
  std::vector<PipelineStageStats> stats_;
  double last_pipeline_seconds_ = 0;
  // Continuous PipeDream: micro-batches fed to the stream so far (stash
  // slots are by this count, so that two steps' micro-batches in flight
  // never share one).
  int64_t streamed_micro_batches_ = 0;
  // The first failure of a step or drain since the state was last put back
  // (StateChangedOnHost); OK while the state is whole.
  absl::Status broken_;
  // OK, or FAILED_PRECONDITION naming broken_.
  absl::Status CheckWhole() const;
  tandem::v1::Timeline timeline_;
  // The host copy of the state (checkpoints) and the step constants.
  HostAllocator host_alloc_;
  Buffer host_params_, host_buffers_;
  std::unique_ptr<Optimizer> optimizer_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_PIPELINE_RUNNER_H_
