#include "runtime/exec/pipeline_runner.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/core/omp_threads.h"
#include "runtime/core/random.h"
#include "runtime/core/thread_pool.h"

namespace tandem {

const char* PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kPipeDream:
      return "pipedream";
  }
  return "?";
}

struct PipelineRunner::Stage {
  int first = 0, end = 0;
  Accelerator* device = nullptr;
  bool recompute = false;
  // Over a peer link (Accelerator::HasPeerLink): this stage pulls its input
  // from the stage before's device, and the stage before pulls its input
  // gradient from this one's. Else both go through staging host memory.
  bool peer_in = false, peer_back = false;
  // Each micro-batch's outputs and saved tensors go down to staging host
  // memory after its forward and come back before its backward, copied on a
  // thread of their own (the stage's copy engine) while the stage computes:
  // down once the forward is done, up queued an op ahead of its backward.
  // The copy thread records its spans and first failure here, and marks
  // each micro-batch whose activations are back (by its step and index);
  // the stage thread takes them after the queue is idle or under copies_mu.
  bool offload_activations = false;
  std::unique_ptr<ThreadPool> copies;
  std::mutex copies_mu;
  std::condition_variable copies_cv;
  absl::Status copies_status;
  std::set<std::pair<const void*, int>> up_queued, up_done;
  // Micro-batches queued to go down and not yet there: at most one, so that
  // the device holds at most the activations being computed and those moving.
  int downs_pending = 0;
  // PipelineStageSpec::wait_for_activation_copies.
  bool wait_for_copies = false;
  std::vector<tandem::v1::TimelineSpan> copy_spans;
  // Offloading stages: the layers from host_first on keep their moments in
  // the runner's host copy and update on the host, from their gradients'
  // host copy (staging memory, from parameter device_param_n of the stage
  // on); the stage's first device_param_n parameters (all of them when not
  // offloading) have moments on the device and update there.
  int host_first = 0;
  bool offload() const { return host_first < end; }
  // PipelineStageSpec::stream_weights: the host-updated layers' weights come
  // from the host copy for each compute (WeightsFor). `held` is the weights
  // of the layer computed last (held_layer; -1: none), kept while the next
  // compute is of the same layer; `fetched` the one fetch queued ahead, of
  // layer fetched_layer (-1: none). The fetch thread records its spans in
  // fetch_spans. next_op_layer: the first streamed layer the stage's next op
  // computes (-1: none), and next_op_micro_batch that op's micro-batch, set
  // by RunStageOps.
  bool stream_weights = false;
  bool streams(int l) const { return stream_weights && l >= host_first; }
  Buffer held;
  int held_layer = -1;
  int fetched_layer = -1;
  std::future<absl::StatusOr<Buffer>> fetched;
  int next_op_layer = -1, next_op_micro_batch = -1;
  std::mutex fetch_mu;
  std::vector<tandem::v1::TimelineSpan> fetch_spans;
  // After the stage's members its tasks use, so joined before them; the
  // runner's host copy they read goes first, so a runner releases every
  // stage's weights (ReleaseWeights) before it goes.
  std::unique_ptr<ThreadPool> fetches;
  int64_t device_param_n = 0;
  // The parameters whose weights the device keeps (all of them unless
  // streaming).
  int64_t resident_param_n() const { return stream_weights ? device_param_n : param_n; }
  Buffer host_grads;
  // Offloading stages without gradient clipping (PipelineOptions::
  // overlap_host_updates): the host's update of each layer, queued as the
  // step's last backward makes the layer's gradient final and run one at a
  // time on a thread of their own beside the stage's compute; what they
  // did this step (first failure, spans, seconds of work), read after the
  // queue is idle.
  std::unique_ptr<ThreadPool> host_updates;
  absl::Status updates_status;
  std::vector<tandem::v1::TimelineSpan> update_spans;
  double update_work = 0;
  int64_t param_begin = 0, param_n = 0, buffer_begin = 0, buffer_n = 0;
  Buffer params, grads, buffers;
  std::vector<Buffer> moments;
  // Continuous PipeDream: the micro-batches whose forward this stage has run
  // and whose backward it has not, oldest first, with their steps.
  std::deque<std::pair<std::shared_ptr<Step>, int>> pending;
  // PipeDream: weight versions for the micro-batches in flight, and how
  // many updates stale this stage's gradients are.
  std::vector<Buffer> stash;
  int staleness = 0;
  // PipeDream: the updates the stage has applied since the runner started,
  // the count each stash slot's version was taken at, and how many updates
  // lagged by i (applied between their micro-batch's weights and them).
  int64_t applied = 0;
  std::vector<int64_t> stash_applied;
  std::vector<int64_t> lags;
  // Vertical sync (stages after the first): the stage's weights after each
  // of this step's updates, after j of them in slot j % size.
  std::vector<Buffer> history;
  int updates = 0;
  // Timing of the latest step (`peer`: the part of `copy` over a peer
  // link), and its spans (lane = the stage).
  // `phase_end`: when its last backward had ended (0: not yet).
  struct Times {
    // `fetch`: the part of `copy` waiting for streamed weights.
    double busy = 0, copy = 0, peer = 0, fetch = 0, update = 0, phase_end = 0;
    // The stage thread's end-of-step update (UpdateAtEnd), from after the
    // global norm to its end: the part before the pipelined phase's end is
    // not bubble.
    double update_began = 0, update_ended = 0;
  } times;
  std::vector<tandem::v1::TimelineSpan> spans;
  int index = 0;
  double step_start = 0;
  void Span(tandem::v1::TimelineResource resource, tandem::v1::TimelinePhase phase, int layer,
            int m, double start, double end, int64_t bytes = 0) {
    SpanTo(spans, resource, phase, layer, m, start, end, bytes);
  }
  void SpanTo(std::vector<tandem::v1::TimelineSpan>& to, tandem::v1::TimelineResource resource,
              tandem::v1::TimelinePhase phase, int layer, int m, double start, double end,
              int64_t bytes) const {
    tandem::v1::TimelineSpan& s = to.emplace_back();
    s.set_resource(resource);
    s.set_lane(index);
    s.set_layer(layer);
    s.set_phase(phase);
    s.set_micro_batch(m);
    s.set_start_seconds(start - step_start);
    s.set_end_seconds(end - step_start);
    s.set_bytes(bytes);
  }
};

// What one stage hands the next (an activation) or the one before (its
// gradient): `bytes` at `src`, a copy in staging host memory, or (over a
// peer link) the sender's device memory, for the receiver to pull. `owned`
// holds `src` when the sender gave it up (the receiver frees it after the
// pull); empty when the sender keeps it until after the pull (the
// activation its own backward reads).
struct PipelineRunner::Parcel {
  const void* src = nullptr;
  int64_t bytes = 0;
  Buffer owned;
  // The device `src` is on; null: staging host memory.
  Accelerator* from = nullptr;
  bool full() const { return src != nullptr; }

  // A buffer given up, on `device` (null: staging host memory).
  static Parcel Of(Buffer b, Accelerator* device) {
    Parcel p;
    p.src = b.data();
    p.bytes = b.bytes();
    p.owned = std::move(b);
    p.from = device;
    return p;
  }
};

// One step (or evaluation) in flight: the micro-batches, and between each two
// neighbouring stages a mailbox per micro-batch for the activation going
// forward and its gradient coming back.
struct PipelineRunner::Step {
  // Per stage and micro-batch: the stage's input (the batch's, or the stage
  // before's output), the targets (last stage), and per layer of the stage
  // its output and what its forward saved for backward. In the step, not
  // the stage: a continuous pipeline's backward may run in the next step.
  struct Slots {
    std::vector<Buffer> in, targets;
    std::vector<std::vector<Buffer>> out, saved;
    // Offloading activations: out and saved of a micro-batch between its
    // forward and its backward, in staging host memory.
    std::vector<std::vector<Buffer>> host_out, host_saved;
  };
  std::vector<Slots> slots;
  // `batch` is read by forwards alone, which all run within the step's call.
  const Batch* batch = nullptr;
  DType input_dtype = DType::kF32;
  // The stream's count of micro-batches before this step's first (stash slots).
  int64_t first_streamed = 0;
  StepOptions options;
  bool training = true;
  StepConstants constants;
  // PipeDream: the optimizer's step count before this step's updates.
  int64_t t0 = 0;
  std::vector<int64_t> mb_start, mb_size;
  std::vector<double> loss_sums;
  std::vector<int64_t> correct;

  std::mutex mu;
  std::condition_variable cv;
  // [boundary s (between stage s and s + 1)][micro-batch]
  std::vector<std::vector<Parcel>> act, grad;
  bool failed = false;
  // Clipping: the stages' sums of squares, added as each finishes backward.
  int norms_in = 0;
  double sum_of_squares = 0;

  int micro_batches() const { return static_cast<int>(mb_start.size()); }
  // Waits for `box` to fill (false when another stage failed), then takes it.
  bool Take(Parcel& box, Parcel* into) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return failed || box.full(); });
    if (!box.full()) return false;
    *into = std::move(box);
    box = Parcel();
    return true;
  }
  void Put(Parcel& box, Parcel from) {
    {
      std::lock_guard<std::mutex> lock(mu);
      box = std::move(from);
    }
    cv.notify_all();
  }
  void Fail() {
    {
      std::lock_guard<std::mutex> lock(mu);
      failed = true;
    }
    cv.notify_all();
  }
};

PipelineRunner::PipelineRunner(const Model& model, PipelineOptions options)
    : model_(model), options_(options) {}

PipelineRunner::~PipelineRunner() {
  // A fetch in flight reads host_params_, which goes before the stages.
  for (auto& st : stages_) ReleaseWeights(*st);
}

namespace {

// How stage s holds its layers (recompute, offloads, streamed weights)
// against itself and the schedule; INVALID_ARGUMENT naming the fault.
absl::Status CheckHolding(const PipelineStageSpec& st, size_t s, PipelineSchedule schedule) {
  if (st.recompute && schedule == PipelineSchedule::kPipeDream) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: stage ", s,
                     " recomputes its activations, which PipeDream's stashed weights do not "
                     "support (GPipe and 1F1B do)"));
  }
  if (st.offload_activations && st.recompute) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: stage ", s, " both recomputes and offloads its activations; one of them"));
  }
  if (st.wait_for_activation_copies && !st.offload_activations) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: stage ", s, " waits for activation copies but offloads no activations"));
  }
  if (st.host_updated_layers < 0 || st.host_updated_layers > st.end_layer - st.first_layer ||
      (st.host_updated_layers > 0 && !st.offload_optimizer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: stage ", s, " updates ", st.host_updated_layers,
                     " layers on the host; a stage offloading its optimizer state "
                     "(offload_optimizer) updates from 1 to its ",
                     st.end_layer - st.first_layer, " layers there (0: all)"));
  }
  if (st.stream_weights && !st.offload_optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline: stage ", s,
        " streams its weights, which only its host-updated layers can (offload_optimizer)"));
  }
  if (st.offload_optimizer && schedule == PipelineSchedule::kPipeDream) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: stage ", s,
                     " offloads its optimizer state, which PipeDream's update per micro-batch "
                     "does not support (GPipe and 1F1B do)"));
  }
  return absl::OkStatus();
}

// The stages against the model and the options; INVALID_ARGUMENT naming the
// first fault.
absl::Status CheckStages(const Model& model, const std::vector<PipelineStageSpec>& stages,
                         const PipelineOptions& options, float max_grad_norm) {
  const int L = model.num_layers();
  if (stages.empty()) return absl::InvalidArgumentError("pipeline: no stages");
  if (static_cast<int>(stages.size()) > L) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: ", stages.size(), " stages for a model of ", L, " layers"));
  }
  if (options.max_batch <= 0) return absl::InvalidArgumentError("pipeline: max_batch must be > 0");
  if (options.micro_batches < 1 || options.micro_batches > options.max_batch) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline: micro_batches must be in [1, ",
                                                   options.max_batch, "], got ",
                                                   options.micro_batches));
  }
  std::set<Accelerator*> devices;
  for (size_t s = 0; s < stages.size(); ++s) {
    const PipelineStageSpec& st = stages[s];
    const int want = s == 0 ? 0 : stages[s - 1].end_layer;
    if (st.first_layer != want || st.end_layer <= st.first_layer || st.end_layer > L) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: stage ", s, " has layers [", st.first_layer, ", ", st.end_layer,
                       "); stages must be non-empty, contiguous and start at layer ", want));
    }
    if (st.device == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline: stage ", s, " has no device"));
    }
    TANDEM_RETURN_IF_ERROR(CheckHolding(st, s, options.schedule));
    if (!devices.insert(st.device).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("pipeline: stage ", s, " shares device ", st.device->id(),
                       " with an earlier stage (one stage per accelerator)"));
    }
  }
  if (stages.back().end_layer != L) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: the stages end at layer ", stages.back().end_layer, " of ", L));
  }
  if (options.continuous &&
      (options.schedule != PipelineSchedule::kPipeDream || options.vertical_sync)) {
    return absl::InvalidArgumentError(
        "pipeline: only PipeDream without vertical sync runs continuously (GPipe and 1F1B "
        "drain at each step's end to update once; vertical sync ties versions to a step)");
  }
  if (options.schedule == PipelineSchedule::kPipeDream && max_grad_norm > 0) {
    return absl::InvalidArgumentError(
        "pipeline: PipeDream updates each stage on its own, and gradient clipping "
        "(optimizer.max_grad_norm) needs the whole model's norm first");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PipelineRunner::Stage>> PipelineRunner::MakeStage(
    const PipelineStageSpec& spec, int index, int stages) const {
  auto stage = std::make_unique<Stage>();
  stage->first = spec.first_layer;
  stage->end = spec.end_layer;
  stage->device = spec.device;
  stage->recompute = spec.recompute;
  stage->host_first = !spec.offload_optimizer        ? spec.end_layer
                      : spec.host_updated_layers > 0 ? spec.end_layer - spec.host_updated_layers
                                                     : spec.first_layer;
  stage->offload_activations = spec.offload_activations;
  stage->wait_for_copies = spec.wait_for_activation_copies;
  stage->stream_weights = spec.stream_weights;
  if (stage->stream_weights) {
    stage->fetches = std::make_unique<ThreadPool>(1, absl::StrCat("stage", index, "-weights"));
  }
  if (stage->offload_activations) {
    stage->copies = std::make_unique<ThreadPool>(1, absl::StrCat("stage", index, "-copies"));
  }
  stage->index = index;
  stage->param_begin = model_.param_offset(stage->first);
  stage->param_n = model_.param_offset(stage->end) - stage->param_begin;
  stage->device_param_n = model_.param_offset(stage->host_first) - stage->param_begin;
  stage->buffer_begin = model_.buffer_offset(stage->first);
  stage->buffer_n = model_.buffer_offset(stage->end) - stage->buffer_begin;
  Allocator* alloc = stage->device->allocator();
  auto fits = [&](absl::Status st) {
    if (st.ok()) return st;
    return absl::Status(
        st.code(), absl::StrCat("pipeline stage ", index, " (layers ", stage->first, "-",
                                stage->end - 1, ") on ", stage->device->id(), ": ", st.message()));
  };
  auto allocate = [&](Buffer* b, int64_t elements, MemoryCategory c) {
    absl::StatusOr<Buffer> got = Buffer::Allocate(alloc, std::max<int64_t>(elements, 1) * 4, c);
    if (!got.ok()) return fits(got.status());
    *b = *std::move(got);
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(
      allocate(&stage->params, stage->resident_param_n(), MemoryCategory::kParameters));
  TANDEM_RETURN_IF_ERROR(allocate(&stage->grads, stage->param_n, MemoryCategory::kGradients));
  TANDEM_RETURN_IF_ERROR(allocate(&stage->buffers, stage->buffer_n, MemoryCategory::kParameters));
  if (stage->offload()) {
    absl::StatusOr<Buffer> grads =
        Buffer::Allocate(stage->device->host_staging_allocator(),
                         std::max<int64_t>(stage->param_n - stage->device_param_n, 1) * 4,
                         MemoryCategory::kGradients);
    if (!grads.ok()) return fits(grads.status());
    stage->host_grads = *std::move(grads);
    if (options_.overlap_host_updates && optimizer_->spec().max_grad_norm() == 0) {
      stage->host_updates =
          std::make_unique<ThreadPool>(1, absl::StrCat("stage", index, "-update"));
    }
  }
  // (A stage without weights still has its one-element moments: PipeDream's
  // update after every micro-batch runs on them.)
  if (!stage->offload() || stage->device_param_n > 0) {
    stage->moments.resize(optimizer_->state_count());
    for (Buffer& m : stage->moments) {
      TANDEM_RETURN_IF_ERROR(allocate(&m, stage->device_param_n, MemoryCategory::kOptimizerState));
    }
  }
  // The padding between layers' slices is never written by a backward:
  // zero, so the gradient norm and the update see nothing there.
  TANDEM_RETURN_IF_ERROR(fits(stage->device->Fill(stage->grads.f32(), 0, stage->param_n)));
  if (options_.schedule == PipelineSchedule::kPipeDream) {
    SizeWeightVersions(*stage, stages);
    for (auto* versions : {&stage->stash, &stage->history}) {
      for (Buffer& b : *versions) {
        TANDEM_RETURN_IF_ERROR(allocate(&b, stage->param_n, MemoryCategory::kParameters));
      }
    }
  }
  return stage;
}

void PipelineRunner::SizeWeightVersions(Stage& stage, int stages) const {
  const int index = stage.index;
  // Continuous: a step's micro-batches do not bound what is in flight.
  const int in_flight = options_.continuous ? stages - index - 1
                                            : std::min(stages - index - 1, options_.micro_batches);
  // Micro-batch m's gradient lags min(m, in flight ahead of it) updates: a
  // drained step's first micro-batches lag less, so its most is M - 1.
  const int most = options_.continuous ? in_flight : options_.micro_batches - 1;
  stage.staleness = std::min(options_.vertical_sync ? stages - 1 : in_flight, most);
  // The weights each micro-batch in flight ran forward on; with vertical
  // sync even the last stage's may be older than its latest.
  if (in_flight > 0 || options_.vertical_sync) {
    stage.stash.resize(in_flight + 1);
    stage.stash_applied.resize(in_flight + 1);
  }
  // Vertical sync: the first stage is at most `index` updates behind this
  // one, so its version is among this stage's latest index + 1.
  if (options_.vertical_sync && index > 0) stage.history.resize(index + 1);
}

absl::StatusOr<std::unique_ptr<PipelineRunner>> PipelineRunner::Create(
    const Model& model, const tandem::v1::OptimizerSpec& optimizer,
    std::vector<PipelineStageSpec> stages, PipelineOptions options) {
  TANDEM_RETURN_IF_ERROR(CheckStages(model, stages, options, optimizer.max_grad_norm()));
  std::unique_ptr<PipelineRunner> r(new PipelineRunner(model, options));
  r->threads_ = std::max(1, omp_get_max_threads());
  r->stage_threads_ = options.threads_per_stage > 0
                          ? options.threads_per_stage
                          : std::max(1, r->threads_ / static_cast<int>(stages.size()));
  TANDEM_ASSIGN_OR_RETURN(r->host_params_,
                          Buffer::Allocate(&r->host_alloc_, model.parameter_elements() * 4,
                                           MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(
      r->host_buffers_,
      Buffer::Allocate(&r->host_alloc_, std::max<int64_t>(model.buffer_elements(), 1) * 4,
                       MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(
      r->optimizer_, Optimizer::Create(optimizer, model.parameter_elements(), &r->host_alloc_));
  model.Initialize(r->host_params_.f32(), r->host_buffers_.f32(), options.init_seed);
  for (size_t s = 0; s < stages.size(); ++s) {
    TANDEM_ASSIGN_OR_RETURN(
        std::unique_ptr<Stage> stage,
        r->MakeStage(stages[s], static_cast<int>(s), static_cast<int>(stages.size())));
    r->stages_.push_back(std::move(stage));
  }
  for (size_t s = 1; s < r->stages_.size(); ++s) {
    Stage& st = *r->stages_[s];
    Accelerator& before = *r->stages_[s - 1]->device;
    st.peer_in = st.device->HasPeerLink(before);
    st.peer_back = before.HasPeerLink(*st.device);
  }
  r->stats_.resize(r->stages_.size());
  TANDEM_RETURN_IF_ERROR(r->StateChangedOnHost());
  return r;
}

LayerContext PipelineRunner::ContextOf(const Stage& stage, int l, int64_t mb_start, bool training,
                                       const StepOptions& options, const float* weights) const {
  LayerContext ctx = stage.device->ComputeContext();
  // A streamed layer's weights are where WeightsFor put them (none: it has
  // none); stage.params holds the resident layers' alone.
  ctx.params = weights != nullptr ? weights
               : stage.streams(l)
                   ? nullptr
                   : stage.params.f32() + (model_.param_offset(l) - stage.param_begin);
  ctx.grads = stage.grads.f32() + (model_.param_offset(l) - stage.param_begin);
  ctx.buffers = model_.buffer_elements() == 0
                    ? nullptr
                    : stage.buffers.f32() + (model_.buffer_offset(l) - stage.buffer_begin);
  ctx.training = training;
  ctx.running_stats_momentum = options.running_stats_momentum;
  ctx.seed = options.seed;
  // The CPU engine's and the plan executor's dropout stream of (step, layer).
  ctx.rng_stream = MixStream(0xd209, static_cast<uint64_t>(options.step), static_cast<uint64_t>(l));
  ctx.sample_offset = static_cast<uint64_t>(mb_start);
  return ctx;
}

absl::Status PipelineRunner::ReceiveInput(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  Step::Slots& sl = step.slots[s];
  const int64_t n = step.mb_size[m];
  Allocator* alloc = st.device->allocator();
  if (s > 0) {
    TANDEM_ASSIGN_OR_RETURN(sl.in[m], Receive(step, st, step.act[s - 1][m], st.first, m,
                                              /*record=*/step.training));
  }
  const double t = WallSeconds();
  int64_t copied = 0;
  if (s == 0) {
    const int64_t elem = DTypeBytes(step.batch->input_dtype);
    const int64_t bytes = n * model_.data().sample_shape.elements() * elem;
    TANDEM_ASSIGN_OR_RETURN(sl.in[m], Buffer::Allocate(alloc, bytes, MemoryCategory::kActivations));
    const char* src = reinterpret_cast<const char*>(step.batch->inputs.data());
    TANDEM_RETURN_IF_ERROR(st.device->CopyToDevice(
        sl.in[m].data(), src + step.mb_start[m] * model_.data().sample_shape.elements() * elem,
        bytes));
    copied += bytes;
  }
  if (st.end == model_.num_layers()) {
    const int64_t tps = model_.data().targets_per_sample;
    TANDEM_ASSIGN_OR_RETURN(sl.targets[m],
                            Buffer::Allocate(alloc, n * tps * 4, MemoryCategory::kActivations));
    TANDEM_RETURN_IF_ERROR(st.device->CopyToDevice(
        sl.targets[m].data(), step.batch->targets.data() + step.mb_start[m] * tps, n * tps * 4));
    copied += n * tps * 4;
  }
  st.times.copy += WallSeconds() - t;
  if (step.training && copied > 0) {
    st.Span(tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D,
            st.first, m, t, WallSeconds(), copied);
  }
  return absl::OkStatus();
}

absl::Status PipelineRunner::SendOutput(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  Step::Slots& sl = step.slots[s];
  const int64_t n = step.mb_size[m];
  const double t = WallSeconds();
  const int last = st.end - st.first - 1;
  if (st.end < model_.num_layers()) {
    const Buffer& out = sl.out[last][m];
    if (step.training && !st.recompute && !st.offload_activations && stages_[s + 1]->peer_in) {
      // The next stage pulls it; this stage keeps it for its own backward,
      // which waits for that stage's gradient, so after the pull.
      Parcel parcel;
      parcel.src = out.data();
      parcel.bytes = out.bytes();
      parcel.from = st.device;
      step.Put(step.act[s][m], std::move(parcel));
      return absl::OkStatus();
    }
    TANDEM_ASSIGN_OR_RETURN(Parcel staged, Staged(st, out, st.end - 1, m, step.training));
    step.Put(step.act[s][m], std::move(staged));
    return absl::OkStatus();
  }
  // The per-sample losses, and in evaluation the logits (the loss's input).
  std::vector<float> losses(n);
  TANDEM_RETURN_IF_ERROR(st.device->CopyToHost(losses.data(), sl.out[last][m].data(), n * 4));
  double sum = 0;
  for (float v : losses) sum += v;
  step.loss_sums[m] = sum;
  if (!step.training) {
    const CrossEntropy& loss = model_.loss();
    const int64_t positions = n * loss.positions();
    std::vector<float> logits(positions * loss.classes());
    const Buffer& from = last == 0 ? sl.in[m] : sl.out[last - 1][m];
    TANDEM_RETURN_IF_ERROR(
        st.device->CopyToHost(logits.data(), from.data(), logits.size() * sizeof(float)));
    step.correct[m] = CountCorrect(
        logits.data(),
        step.batch->targets.data() + step.mb_start[m] * model_.data().targets_per_sample, positions,
        loss.classes());
  }
  st.times.copy += WallSeconds() - t;
  return absl::OkStatus();
}

absl::Status PipelineRunner::StageForward(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  Step::Slots& sl = step.slots[s];
  TANDEM_RETURN_IF_ERROR(ReceiveInput(step, s, m));
  // PipeDream: the weights this forward and its backward run on, stashed:
  // the stage's latest, or with vertical sync the version the first stage
  // ran micro-batch m on (its updates before m's forward: m - its warm-up).
  if (step.training && !st.stash.empty()) {
    const void* version = st.params.data();
    const size_t slot = (step.first_streamed + m) % st.stash.size();
    st.stash_applied[slot] = st.applied;
    if (!st.history.empty()) {
      const int first_warmup = std::min(num_stages() - 1, step.micro_batches());
      const int j = std::max(0, m - first_warmup);
      version = st.history[j % st.history.size()].data();
      st.stash_applied[slot] = st.applied - st.updates + j;
    }
    // Device work of the stage's stream: busy time, as the forward's.
    const double t = WallSeconds();
    TANDEM_RETURN_IF_ERROR(st.device->CopyOnDevice(st.stash[slot].data(), version, st.param_n * 4));
    st.times.busy += WallSeconds() - t;
  }
  TANDEM_RETURN_IF_ERROR(RunForward(step, s, m, /*recompute=*/false));
  TANDEM_RETURN_IF_ERROR(SendOutput(step, s, m));
  if (step.training && st.offload_activations) {
    QueueActivations(step, st, m, /*down=*/true);
    if (!st.wait_for_copies) return absl::OkStatus();
    const double t = WallSeconds();
    st.copies->WaitIdle();
    st.times.copy += WallSeconds() - t;
    return absl::OkStatus();
  }
  // Nothing is kept for a backward in evaluation; a recomputing stage keeps
  // its input alone and runs the forward again before the backward.
  if (!step.training || st.recompute) {
    for (auto& per_layer : sl.out) per_layer[m].Reset();
    for (auto& per_layer : sl.saved) per_layer[m].Reset();
  }
  if (!step.training) {
    sl.in[m].Reset();
    sl.targets[m].Reset();
  }
  return absl::OkStatus();
}

absl::Status PipelineRunner::MoveActivations(Step& step, Stage& st, int m, bool down) {
  Step::Slots& sl = step.slots[st.index];
  const double t = WallSeconds();
  int64_t bytes = 0;
  for (size_t i = 0; i < sl.out.size(); ++i) {
    for (auto [device, host] : {std::pair{&sl.out[i][m], &sl.host_out[i][m]},
                                std::pair{&sl.saved[i][m], &sl.host_saved[i][m]}}) {
      Buffer& from = down ? *device : *host;
      Buffer& to = down ? *host : *device;
      if (from.empty()) continue;
      Allocator* alloc = down ? st.device->host_staging_allocator() : st.device->allocator();
      TANDEM_ASSIGN_OR_RETURN(to,
                              Buffer::Allocate(alloc, from.bytes(), MemoryCategory::kActivations));
      TANDEM_RETURN_IF_ERROR(down ? st.device->CopyToHost(to.data(), from.data(), from.bytes())
                                  : st.device->CopyToDevice(to.data(), from.data(), from.bytes()));
      bytes += from.bytes();
      from.Reset();
    }
  }
  st.SpanTo(
      st.copy_spans,
      down ? tandem::v1::TIMELINE_RESOURCE_COPY_D2H : tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
      down ? tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H : tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D,
      down ? st.end - 1 : st.first, m, t, WallSeconds(), bytes);
  return absl::OkStatus();
}

void PipelineRunner::QueueActivations(Step& step, Stage& st, int m, bool down) {
  const std::pair<const void*, int> key{&step, m};
  if (!down && !st.up_queued.insert(key).second) return;  // queued already
  if (down) {
    // The micro-batch before must be down first (its memory free): the
    // stage waits here when its copies are slower than its compute.
    const double t = WallSeconds();
    std::unique_lock<std::mutex> lock(st.copies_mu);
    st.copies_cv.wait(lock, [&] { return !st.copies_status.ok() || st.downs_pending == 0; });
    st.times.copy += WallSeconds() - t;
    ++st.downs_pending;
  }
  st.copies->Schedule([this, &step, &st, m, down, key] {
    bool failed;
    {
      std::lock_guard<std::mutex> lock(st.copies_mu);
      failed = !st.copies_status.ok();
    }
    const absl::Status moved = failed ? absl::OkStatus() : MoveActivations(step, st, m, down);
    {
      std::lock_guard<std::mutex> lock(st.copies_mu);
      if (!moved.ok() && st.copies_status.ok()) st.copies_status = moved;
      if (down) --st.downs_pending;
      if (!down) st.up_done.insert(key);
    }
    st.copies_cv.notify_all();
  });
}

absl::Status PipelineRunner::ActivationsBack(Step& step, Stage& st, int m) {
  const std::pair<const void*, int> key{&step, m};
  QueueActivations(step, st, m, /*down=*/false);
  const double t = WallSeconds();
  std::unique_lock<std::mutex> lock(st.copies_mu);
  st.copies_cv.wait(lock, [&] { return !st.copies_status.ok() || st.up_done.count(key) > 0; });
  // What the stage's thread waited for its activations: its share of the
  // copies.
  st.times.copy += WallSeconds() - t;
  st.up_done.erase(key);
  st.up_queued.erase(key);
  return st.copies_status;
}

absl::Status PipelineRunner::FinishCopies(Stage& st) {
  if (st.copies == nullptr) return absl::OkStatus();
  st.copies->WaitIdle();
  std::lock_guard<std::mutex> lock(st.copies_mu);
  st.spans.insert(st.spans.end(), st.copy_spans.begin(), st.copy_spans.end());
  st.copy_spans.clear();
  // Empty unless the step failed between queueing and taking a
  // micro-batch's activations.
  st.up_queued.clear();
  st.up_done.clear();
  st.downs_pending = 0;
  return std::exchange(st.copies_status, absl::OkStatus());
}

int PipelineRunner::NextStreamed(const Stage& st, int l, bool backward) const {
  for (int j = backward ? l - 1 : l + 1; j >= st.first && j < st.end; j += backward ? -1 : 1) {
    if (st.streams(j) && model_.param_slice(j) > 0) return j;
  }
  return -1;
}

absl::StatusOr<Buffer> PipelineRunner::FetchWeights(Stage& st, int l, int m, bool record) {
  const int64_t bytes = model_.param_slice(l) * 4;
  const double t = WallSeconds();
  TANDEM_ASSIGN_OR_RETURN(
      Buffer b, Buffer::Allocate(st.device->allocator(), bytes, MemoryCategory::kParameters));
  TANDEM_RETURN_IF_ERROR(
      st.device->CopyToDevice(b.data(), host_params_.f32() + model_.param_offset(l), bytes));
  if (record) {
    std::lock_guard<std::mutex> lock(st.fetch_mu);
    st.SpanTo(st.fetch_spans, tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
              tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, m, t, WallSeconds(), bytes);
  }
  return b;
}

absl::StatusOr<const float*> PipelineRunner::WeightsFor(Stage& st, int l, int m, bool backward,
                                                        int after, int after_m, bool record) {
  if (!st.streams(l) || model_.param_slice(l) == 0) return nullptr;
  const double t = WallSeconds();
  if (st.held_layer != l) {
    // The layer before's weights go first: the device holds at most two
    // layers' (the one computing, the one coming).
    st.held.Reset();
    st.held_layer = -1;
    absl::StatusOr<Buffer> got;
    if (st.fetched_layer == l) {
      got = st.fetched.get();
      st.fetched_layer = -1;
    } else {
      DropFetch(st);  // one the compute did not take (none in order)
      got = FetchWeights(st, l, m, record);
    }
    if (!got.ok()) return got.status();
    st.held = *std::move(got);
    st.held_layer = l;
  }
  int next = NextStreamed(st, l, backward), next_m = m;
  if (next < 0) {
    next = after;
    next_m = after_m;
  }
  PrefetchWeights(st, next, next_m, record);
  // The stage's thread waited for the copies: copy time.
  const double waited = WallSeconds() - t;
  st.times.copy += waited;
  st.times.fetch += waited;
  return st.held.f32();
}

void PipelineRunner::PrefetchWeights(Stage& st, int l, int m, bool record) {
  if (l < 0 || l == st.held_layer || l == st.fetched_layer) return;
  DropFetch(st);
  auto promise = std::make_shared<std::promise<absl::StatusOr<Buffer>>>();
  st.fetched = promise->get_future();
  st.fetched_layer = l;
  st.fetches->Schedule(
      [this, &st, promise, l, m, record] { promise->set_value(FetchWeights(st, l, m, record)); });
}

void PipelineRunner::DropFetch(Stage& st) {
  if (st.fetched_layer < 0) return;
  st.fetched.wait();
  st.fetched = {};
  st.fetched_layer = -1;
}

void PipelineRunner::ReleaseWeights(Stage& st) {
  if (!st.stream_weights) return;
  st.next_op_layer = st.next_op_micro_batch = -1;
  DropFetch(st);
  st.held.Reset();
  st.held_layer = -1;
  std::lock_guard<std::mutex> lock(st.fetch_mu);
  st.spans.insert(st.spans.end(), st.fetch_spans.begin(), st.fetch_spans.end());
  st.fetch_spans.clear();
}

absl::Status PipelineRunner::RunForward(Step& step, int s, int m, bool recompute) {
  Stage& st = *stages_[s];
  Step::Slots& sl = step.slots[s];
  const int64_t n = step.mb_size[m];
  Allocator* alloc = st.device->allocator();
  const Buffer* stashed =
      st.stash.empty() ? nullptr : &st.stash[(step.first_streamed + m) % st.stash.size()];
  // Streamed weights: the next op's first, or after a recompute its
  // backward's.
  const int after = recompute ? NextStreamed(st, st.end, /*backward=*/true) : st.next_op_layer;
  const int after_m = recompute ? m : st.next_op_micro_batch;
  const double t = WallSeconds(), fetched = st.times.fetch;
  for (int l = st.first; l < st.end; ++l) {
    const Layer& layer = model_.layer(l);
    const int i = l - st.first;
    const Tensor x = l == st.first
                         ? Tensor(sl.in[m].data(), l == 0 ? step.input_dtype : DType::kF32,
                                  l == 0 ? model_.data().sample_shape.WithBatch(n)
                                         : layer.input_shape().WithBatch(n))
                         : Tensor::F32(sl.out[i - 1][m].f32(), layer.input_shape().WithBatch(n));
    TANDEM_ASSIGN_OR_RETURN(
        sl.out[i][m], Buffer::Allocate(alloc, layer.OutputBytes(n), MemoryCategory::kActivations));
    TANDEM_ASSIGN_OR_RETURN(
        sl.saved[i][m], Buffer::Allocate(alloc, layer.SavedBytes(n), MemoryCategory::kActivations));
    TANDEM_ASSIGN_OR_RETURN(
        Buffer ws, Buffer::Allocate(alloc, layer.WorkspaceBytes(n), MemoryCategory::kWorkspace));
    TANDEM_ASSIGN_OR_RETURN(const float* weights, WeightsFor(st, l, m, /*backward=*/false, after,
                                                             after_m, step.training));
    LayerContext ctx = ContextOf(st, l, step.mb_start[m], step.training, step.options, weights);
    ctx.recompute = recompute;
    if (stashed != nullptr && step.training) {
      ctx.params = stashed->f32() + (model_.param_offset(l) - st.param_begin);
    }
    ctx.workspace = ws.data();
    ctx.targets = reinterpret_cast<const int32_t*>(sl.targets[m].data());
    const double began = WallSeconds();
    layer.Forward(ctx, x, Tensor::F32(sl.out[i][m].f32(), layer.output_shape().WithBatch(n)),
                  sl.saved[i][m].data());
    TANDEM_RETURN_IF_ERROR(st.device->FinishCompute());
    if (step.training) {
      st.Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
              recompute ? tandem::v1::TIMELINE_PHASE_RECOMPUTE : tandem::v1::TIMELINE_PHASE_FORWARD,
              l, m, began, WallSeconds());
    }
  }
  // The waits for streamed weights are copy time.
  st.times.busy += WallSeconds() - t - (st.times.fetch - fetched);
  return absl::OkStatus();
}

absl::StatusOr<Buffer> PipelineRunner::ReceiveGradient(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  const int64_t n = step.mb_size[m];
  Allocator* alloc = st.device->allocator();
  if (st.end == model_.num_layers()) {
    // d(mean loss)/d(per-sample loss) = 1 / (whole batch); PipeDream steps
    // on each micro-batch's mean.
    const bool pipedream = options_.schedule == PipelineSchedule::kPipeDream;
    TANDEM_ASSIGN_OR_RETURN(Buffer dy,
                            Buffer::Allocate(alloc, n * 4, MemoryCategory::kActivations));
    TANDEM_RETURN_IF_ERROR(
        st.device->Fill(dy.f32(), 1.0f / static_cast<float>(pipedream ? n : step.batch->size), n));
    return dy;
  }
  return Receive(step, st, step.grad[s][m], st.end - 1, m, /*record=*/true);
}

absl::StatusOr<Buffer> PipelineRunner::Receive(Step& step, Stage& st, Parcel& box, int layer, int m,
                                               bool record) {
  Parcel parcel;
  if (!step.Take(box, &parcel)) return absl::AbortedError("another stage failed");
  // The wait was bubble; the copy is not.
  const double t = WallSeconds();
  TANDEM_ASSIGN_OR_RETURN(Buffer to, Buffer::Allocate(st.device->allocator(), parcel.bytes,
                                                      MemoryCategory::kActivations));
  TANDEM_RETURN_IF_ERROR(
      parcel.from != nullptr
          ? st.device->CopyFromPeer(to.data(), *parcel.from, parcel.src, parcel.bytes)
          : st.device->CopyToDevice(to.data(), parcel.src, parcel.bytes));
  // A buffer the sender gave up (its device memory, or staging) goes now.
  parcel.owned.Reset();
  const double end = WallSeconds();
  st.times.copy += end - t;
  if (parcel.from != nullptr) st.times.peer += end - t;
  if (record) {
    st.Span(tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
            parcel.from != nullptr ? tandem::v1::TIMELINE_PHASE_PEER_COPY
                                   : tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D,
            layer, m, t, end, parcel.bytes);
  }
  return to;
}

absl::StatusOr<PipelineRunner::Parcel> PipelineRunner::Staged(Stage& st, const Buffer& from,
                                                              int layer, int m, bool record) {
  const double t = WallSeconds();
  TANDEM_ASSIGN_OR_RETURN(Buffer staged,
                          Buffer::Allocate(st.device->host_staging_allocator(), from.bytes(),
                                           MemoryCategory::kActivations));
  TANDEM_RETURN_IF_ERROR(st.device->CopyToHost(staged.data(), from.data(), from.bytes()));
  const double end = WallSeconds();
  st.times.copy += end - t;
  if (record) {
    st.Span(tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H,
            layer, m, t, end, from.bytes());
  }
  return Parcel::Of(std::move(staged), nullptr);
}

absl::Status PipelineRunner::SendGradient(Step& step, int s, int m, Buffer dx) {
  Stage& st = *stages_[s];
  if (st.peer_back) {
    // The stage before pulls it from this device, then frees it. It takes
    // the place of the input of m this backward has just freed.
    step.Put(step.grad[s - 1][m], Parcel::Of(std::move(dx), st.device));
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(Parcel staged, Staged(st, dx, st.first, m, /*record=*/true));
  dx.Reset();
  step.Put(step.grad[s - 1][m], std::move(staged));
  return absl::OkStatus();
}

absl::Status PipelineRunner::StageBackward(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  Step::Slots& sl = step.slots[s];
  const int64_t n = step.mb_size[m];
  Allocator* alloc = st.device->allocator();
  // A recomputing stage's activations, again, or an offloading one's back
  // (while the gradient comes).
  if (st.recompute) TANDEM_RETURN_IF_ERROR(RunForward(step, s, m, /*recompute=*/true));
  if (st.offload_activations) {
    TANDEM_RETURN_IF_ERROR(ActivationsBack(step, st, m));
  }
  TANDEM_ASSIGN_OR_RETURN(Buffer dy, ReceiveGradient(step, s, m));
  const double t = WallSeconds(), fetched = st.times.fetch;
  for (int l = st.end - 1; l >= st.first; --l) {
    const Layer& layer = model_.layer(l);
    const int i = l - st.first;
    Buffer dx;
    if (l > 0) {
      TANDEM_ASSIGN_OR_RETURN(dx, Buffer::Allocate(alloc, layer.input_shape().elements() * n * 4,
                                                   MemoryCategory::kActivations));
    }
    TANDEM_ASSIGN_OR_RETURN(
        Buffer ws, Buffer::Allocate(alloc, layer.WorkspaceBytes(n), MemoryCategory::kWorkspace));
    TANDEM_ASSIGN_OR_RETURN(const float* weights,
                            WeightsFor(st, l, m, /*backward=*/true, st.next_op_layer,
                                       st.next_op_micro_batch, /*record=*/true));
    LayerContext ctx = ContextOf(st, l, step.mb_start[m], true, step.options, weights);
    ctx.workspace = ws.data();
    if (options_.schedule == PipelineSchedule::kPipeDream) {
      ctx.accumulate_grads = false;
      if (!st.stash.empty()) {
        ctx.params = st.stash[(step.first_streamed + m) % st.stash.size()].f32() +
                     (model_.param_offset(l) - st.param_begin);
      }
    } else {
      ctx.accumulate_grads = m > 0;
    }
    ctx.targets = reinterpret_cast<const int32_t*>(sl.targets[m].data());
    const Tensor x = i == 0 ? Tensor(sl.in[m].data(), l == 0 ? step.input_dtype : DType::kF32,
                                     l == 0 ? model_.data().sample_shape.WithBatch(n)
                                            : layer.input_shape().WithBatch(n))
                            : Tensor::F32(sl.out[i - 1][m].f32(), layer.input_shape().WithBatch(n));
    const double began = WallSeconds();
    layer.Backward(ctx, x, Tensor::F32(sl.out[i][m].f32(), layer.output_shape().WithBatch(n)),
                   sl.saved[i][m].data(), Tensor::F32(dy.f32(), layer.output_shape().WithBatch(n)),
                   l == 0 ? Tensor() : Tensor::F32(dx.f32(), layer.input_shape().WithBatch(n)));
    TANDEM_RETURN_IF_ERROR(st.device->FinishCompute());
    st.Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_PHASE_BACKWARD,
            l, m, began, WallSeconds());
    // The step's last backward (GPipe's and 1F1B's last micro-batch) has
    // made the layer's gradient final: its host update can start.
    if (st.host_updates != nullptr && l >= st.host_first && m == step.micro_batches() - 1 &&
        model_.param_slice(l) > 0) {
      QueueHostUpdate(step, st, l);
    }
    sl.out[i][m].Reset();
    sl.saved[i][m].Reset();
    dy = std::move(dx);
  }
  sl.in[m].Reset();
  sl.targets[m].Reset();
  st.times.busy += WallSeconds() - t - (st.times.fetch - fetched);
  // dy is now the gradient of the stage's input.
  if (s > 0) TANDEM_RETURN_IF_ERROR(SendGradient(step, s, m, std::move(dy)));
  if (options_.schedule == PipelineSchedule::kPipeDream) return UpdateAfter(step, s, m);
  return absl::OkStatus();
}

absl::Status PipelineRunner::UpdateAfter(Step& step, int s, int m) {
  Stage& st = *stages_[s];
  const double t = WallSeconds();
  // The stage's (m+1)-th update of this step; every stage counts alike.
  const StepConstants c = optimizer_->ConstantsAt(step.t0 + m + 1, step.options.learning_rate, 1);
  std::vector<float*> states;
  for (Buffer& b : st.moments) states.push_back(b.f32());
  TANDEM_RETURN_IF_ERROR(
      st.device->UpdateSlice(c, st.params.f32(), st.grads.f32(), states.data(), st.param_n));
  TANDEM_RETURN_IF_ERROR(st.device->FinishCompute());
  st.times.update += WallSeconds() - t;
  st.Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_PHASE_UPDATE, -1,
          m, t, WallSeconds(), st.param_n * 4);
  const int64_t lag =
      st.stash.empty() ? 0
                       : st.applied - st.stash_applied[(step.first_streamed + m) % st.stash.size()];
  if (static_cast<int64_t>(st.lags.size()) <= lag) st.lags.resize(lag + 1);
  ++st.lags[lag];
  ++st.applied;
  ++st.updates;
  return KeepVersion(st);
}

absl::Status PipelineRunner::KeepVersion(Stage& st) {
  if (st.history.empty()) return absl::OkStatus();
  // Device work of the stage's stream: busy time.
  const double t = WallSeconds();
  const absl::Status copied = st.device->CopyOnDevice(
      st.history[st.updates % st.history.size()].data(), st.params.data(), st.param_n * 4);
  st.times.busy += WallSeconds() - t;
  return copied;
}

absl::Status PipelineRunner::RunStage(const std::shared_ptr<Step>& current, int s) {
  Stage& st = *stages_[s];
  const absl::Status done = RunStageOps(current, s);
  // Nothing of this stage's runs on past its part of the step: its copies
  // end (their spans join the step's), and after a failure its host updates.
  ReleaseWeights(st);
  const absl::Status copied = FinishCopies(st);
  if (!done.ok() && st.host_updates != nullptr) FinishHostUpdates(st).IgnoreError();
  return done.ok() ? copied : done;
}

absl::Status PipelineRunner::RunStageOps(const std::shared_ptr<Step>& current, int s) {
  Stage& st = *stages_[s];
  // A continuous pipeline's oldest pending backward (of this step or the one
  // before), with its update.
  auto backward_oldest = [&]() -> absl::Status {
    const std::pair<std::shared_ptr<Step>, int> oldest = std::move(st.pending.front());
    st.pending.pop_front();
    return StageBackward(*oldest.first, s, oldest.second);
  };
  if (current == nullptr) {  // draining
    while (!st.pending.empty()) TANDEM_RETURN_IF_ERROR(backward_oldest());
    return absl::OkStatus();
  }
  Step& step = *current;
  const int K = num_stages(), M = step.micro_batches();
  if (options_.continuous) {
    // One forward, then a backward once more than the warm-up's worth are
    // in flight: 1F1B's order over the whole stream.
    const size_t warmup = K - s - 1;
    for (int m = 0; m < M; ++m) {
      TANDEM_RETURN_IF_ERROR(StageForward(step, s, m));
      st.pending.emplace_back(current, m);
      if (st.pending.size() > warmup) TANDEM_RETURN_IF_ERROR(backward_oldest());
    }
    return absl::OkStatus();
  }
  // Vertical sync: the step's first version, before any update.
  if (step.training) TANDEM_RETURN_IF_ERROR(KeepVersion(st));
  // Streamed weights: the first forward's first layer comes while the stage
  // waits for its input (stages after the first) or sets up.
  if (st.stream_weights) {
    PrefetchWeights(st, NextStreamed(st, st.first - 1, /*backward=*/false), 0, step.training);
  }
  std::vector<std::pair<bool, int>> ops;  // (backward, micro-batch) in order
  if (options_.schedule == PipelineSchedule::kGPipe) {
    for (int m = 0; m < M; ++m) ops.push_back({false, m});
    for (int m = 0; m < M; ++m) ops.push_back({true, m});
  } else {
    const int warmup = std::min(K - s - 1, M);
    for (int m = 0; m < warmup; ++m) ops.push_back({false, m});
    for (int m = warmup; m < M; ++m) {
      ops.push_back({false, m});
      ops.push_back({true, m - warmup});
    }
    for (int m = M - warmup; m < M; ++m) ops.push_back({true, m});
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    const auto [backward, m] = ops[i];
    // Streamed weights: the first the next op computes, fetched during this
    // one's last (a recomputing backward starts with a forward).
    if (st.stream_weights) {
      const bool down = i + 1 < ops.size() && ops[i + 1].first && !st.recompute;
      st.next_op_layer =
          i + 1 == ops.size() ? -1 : NextStreamed(st, down ? st.end : st.first - 1, down);
      st.next_op_micro_batch = i + 1 == ops.size() ? -1 : ops[i + 1].second;
    }
    // Offloading activations: those of the next op, a backward whose
    // forward has run, start coming back during this one.
    if (st.offload_activations && !st.wait_for_copies && step.training && i + 1 < ops.size() &&
        ops[i + 1].first && (backward || ops[i + 1].second != m)) {
      QueueActivations(step, st, ops[i + 1].second, /*down=*/false);
    }
    TANDEM_RETURN_IF_ERROR(backward ? StageBackward(step, s, m) : StageForward(step, s, m));
  }
  if (options_.schedule == PipelineSchedule::kPipeDream) return absl::OkStatus();
  return UpdateAtEnd(step, s);
}

absl::Status PipelineRunner::UpdateAtEnd(Step& step, int s) {
  const int K = num_stages();
  Stage& st = *stages_[s];
  const double t = WallSeconds();
  st.times.phase_end = t;
  st.updates = 1;
  const float max_norm = optimizer_->spec().max_grad_norm();
  float scale = 1;
  // Overlapped host updates are queued already (no clipping).
  if (st.host_updates == nullptr && max_norm > 0) {
    TANDEM_ASSIGN_OR_RETURN(const double sum, st.device->SumOfSquares(st.grads.f32(), st.param_n));
    std::unique_lock<std::mutex> lock(step.mu);
    step.sum_of_squares += sum;
    ++step.norms_in;
    step.cv.notify_all();
    step.cv.wait(lock, [&] { return step.failed || step.norms_in == K; });
    if (step.norms_in < K) return absl::AbortedError("another stage failed");
    scale = Optimizer::ClipScale(std::sqrt(step.sum_of_squares), max_norm);
  }
  // The update's time starts here: the wait for the other stages' norms is
  // the stage's bubble (the phase ends at the last stage's phase_end).
  const double began = st.times.update_began = WallSeconds();
  StepConstants c = step.constants;
  c.adam.grad_scale = c.sgd.grad_scale = scale;
  // The device's part (every stage not offloading all of it, weights or
  // not), while overlapped host updates go on.
  if (!st.moments.empty()) {
    std::vector<float*> states;
    for (Buffer& b : st.moments) states.push_back(b.f32());
    const double device_began = WallSeconds();
    TANDEM_RETURN_IF_ERROR(st.device->UpdateSlice(c, st.params.f32(), st.grads.f32(), states.data(),
                                                  st.device_param_n));
    TANDEM_RETURN_IF_ERROR(st.device->FinishCompute());
    st.Span(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_PHASE_UPDATE,
            -1, 0, device_began, WallSeconds(), st.device_param_n * 4);
  }
  if (st.host_updates != nullptr) {
    const double device = WallSeconds() - began;
    const absl::Status hosted = FinishHostUpdates(st);
    st.times.update += device;
    st.times.update_ended = WallSeconds();
    return hosted;
  }
  if (st.device_param_n < st.param_n) {
    TANDEM_RETURN_IF_ERROR(
        UpdateOnHost(st, c, -1, st.device_param_n, st.param_n - st.device_param_n, st.spans));
  }
  st.times.update_ended = WallSeconds();
  st.times.update = st.times.update_ended - began;
  return absl::OkStatus();
}

absl::Status PipelineRunner::UpdateOnHost(Stage& st, const StepConstants& c, int layer,
                                          int64_t offset, int64_t n,
                                          std::vector<tandem::v1::TimelineSpan>& spans) {
  const int64_t bytes = n * 4;
  const double t = WallSeconds();
  float* host_grads = st.host_grads.f32() + (offset - st.device_param_n);
  TANDEM_RETURN_IF_ERROR(st.device->CopyToHost(host_grads, st.grads.f32() + offset, bytes));
  const double down = WallSeconds();
  st.SpanTo(spans, tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H,
            layer, 0, t, down, bytes);
  // The host copy of the weights is the master: the same kernel the device's
  // update runs on the emulated accelerator.
  float* params = host_params_.f32() + st.param_begin + offset;
  std::vector<float*> states;
  for (int i = 0; i < optimizer_->state_count(); ++i) {
    states.push_back(optimizer_->state(i) + st.param_begin + offset);
  }
  Optimizer::UpdateSlice(c, params, host_grads, states.data(), n);
  const double updated = WallSeconds();
  st.SpanTo(spans, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE,
            layer, 0, down, updated, bytes);
  // Streamed weights come up from the host copy when next computed.
  if (st.stream_weights) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(st.device->CopyToDevice(st.params.f32() + offset, params, bytes));
  st.SpanTo(spans, tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D,
            layer, 0, updated, WallSeconds(), bytes);
  return absl::OkStatus();
}

void PipelineRunner::QueueHostUpdate(const Step& step, Stage& st, int l) {
  StepConstants c = step.constants;
  c.adam.grad_scale = c.sgd.grad_scale = 1;  // no clipping where the updates overlap
  st.host_updates->Schedule([this, &st, c, l] {
    if (!st.updates_status.ok()) return;
    omp_set_num_threads(stage_threads_);
    const double t = WallSeconds();
    st.updates_status = UpdateOnHost(st, c, l, model_.param_offset(l) - st.param_begin,
                                     model_.param_slice(l), st.update_spans);
    st.update_work += WallSeconds() - t;
  });
}

absl::Status PipelineRunner::FinishHostUpdates(Stage& st) {
  st.host_updates->WaitIdle();
  st.spans.insert(st.spans.end(), st.update_spans.begin(), st.update_spans.end());
  st.update_spans.clear();
  st.times.update = st.update_work;
  st.update_work = 0;
  return std::exchange(st.updates_status, absl::OkStatus());
}

void PipelineRunner::Begin(Step& step, const Batch& batch, bool training) {
  const int K = num_stages();
  step.batch = &batch;
  step.training = training;
  const int64_t mb = (batch.size + options_.micro_batches - 1) / options_.micro_batches;
  for (int64_t first = 0; first < batch.size; first += mb) {
    step.mb_start.push_back(first);
    step.mb_size.push_back(std::min(mb, batch.size - first));
  }
  const int M = step.micro_batches();
  step.input_dtype = batch.input_dtype;
  step.loss_sums.assign(M, 0);
  step.correct.assign(M, 0);
  step.act.resize(K - 1);
  step.grad.resize(K - 1);
  for (int s = 0; s + 1 < K; ++s) {
    step.act[s].resize(M);
    step.grad[s].resize(M);
  }
  step.slots.resize(K);
  for (int s = 0; s < K; ++s) {
    Step::Slots& sl = step.slots[s];
    sl.in.resize(M);
    sl.targets.resize(M);
    for (auto* v : {&sl.out, &sl.saved, &sl.host_out, &sl.host_saved}) {
      v->resize(stages_[s]->end - stages_[s]->first);
      for (auto& per_layer : *v) per_layer.resize(M);
    }
  }
}

absl::Status PipelineRunner::OnEveryStage(const std::shared_ptr<Step>& step,
                                          std::vector<double>* ended) {
  const int K = num_stages();
  // Every step whose mailboxes a stage may wait on: failed together.
  std::vector<std::shared_ptr<Step>> live;
  if (step != nullptr) live.push_back(step);
  for (auto& st : stages_) {
    for (const auto& [pending, m] : st->pending) {
      if (std::find(live.begin(), live.end(), pending) == live.end()) live.push_back(pending);
    }
  }
  std::vector<absl::Status> results(K);
  ended->assign(K, 0);
  {
    std::vector<std::thread> threads;
    for (int s = 0; s < K; ++s) {
      threads.emplace_back([&, s] {
        omp_set_num_threads(stage_threads_);
        results[s] = RunStage(step, s);
        (*ended)[s] = WallSeconds();
        if (!results[s].ok()) {
          for (const auto& p : live) p->Fail();
        }
      });
    }
    for (std::thread& t : threads) t.join();
  }
  // The first failure, not the stages it stopped; it leaves the stages
  // partly updated (CheckWhole).
  for (int s = 0; s < K; ++s) {
    if (!results[s].ok() && !absl::IsAborted(results[s])) return broken_ = results[s];
  }
  for (const absl::Status& r : results) {
    if (!r.ok()) return broken_ = r;
  }
  return absl::OkStatus();
}

absl::Status PipelineRunner::CheckWhole() const {
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("an earlier step failed (", broken_.ToString(),
                   ") and left the stages partly updated; put a checkpoint's state back first "
                   "(StateChangedOnHost)"));
}

absl::Status PipelineRunner::Drain() {
  TANDEM_RETURN_IF_ERROR(CheckWhole());
  bool pending = false;
  for (const auto& st : stages_) pending |= !st->pending.empty();
  if (!pending) return absl::OkStatus();
  // The latest step's figures stay its own.
  struct Figures {
    Stage::Times times;
    int updates;
    size_t spans;
  };
  std::vector<Figures> kept;
  for (const auto& st : stages_) kept.push_back({st->times, st->updates, st->spans.size()});
  std::vector<double> ended;
  const absl::Status drained = OnEveryStage(nullptr, &ended);
  for (int s = 0; s < num_stages(); ++s) {
    Stage& st = *stages_[s];
    st.times = kept[s].times;
    st.updates = kept[s].updates;
    st.spans.resize(kept[s].spans);
  }
  return drained;
}

absl::Status PipelineRunner::RunStages(const std::shared_ptr<Step>& step) {
  const int K = num_stages();
  const double start = WallSeconds();
  for (auto& st : stages_) {
    st->times = {};
    st->updates = 0;
    st->step_start = start;
    st->spans.clear();
  }
  std::vector<double> ended;
  TANDEM_RETURN_IF_ERROR(OnEveryStage(step, &ended));

  // The phase ends with the last stage's last backward: before its update
  // (phase_end, set by UpdateAtEnd), or, under PipeDream, whose updates
  // follow each micro-batch's backward inside the phase, when it ended.
  double end = start;
  for (int s = 0; s < K; ++s) {
    const Stage::Times& times = stages_[s]->times;
    end = std::max(end, times.phase_end > 0 ? times.phase_end : ended[s]);
  }
  last_pipeline_seconds_ = end - start;
  timeline_.Clear();
  for (int s = 0; s < K; ++s) {
    const Stage& st = *stages_[s];
    PipelineStageStats& out = stats_[s];
    out.busy_seconds = st.times.busy;
    out.copy_seconds = st.times.copy;
    out.peer_copy_seconds = st.times.peer;
    out.update_seconds = st.times.update;
    out.weight_fetch_seconds = st.times.fetch;
    // Update time within the phase, which is not bubble.
    double updating = 0;
    if (options_.schedule == PipelineSchedule::kPipeDream) {
      updating = st.times.update;  // one after each micro-batch's backward
    } else if (st.times.update_ended > 0) {
      // A stage whose phase ended before the last one's updated meanwhile.
      updating = std::max(0.0, std::min(st.times.update_ended, end) - st.times.update_began);
    }
    out.bubble_seconds =
        std::max(0.0, last_pipeline_seconds_ - st.times.busy - st.times.copy - updating);
    out.peak_bytes = st.device->allocator()->stats().peak_total_bytes;
    for (const tandem::v1::TimelineSpan& span : st.spans) *timeline_.add_spans() = span;
  }
  timeline_.set_iteration_seconds(WallSeconds() - start);
  return absl::OkStatus();
}

absl::StatusOr<StepResult> PipelineRunner::TrainStep(const Batch& batch,
                                                     const StepOptions& options) {
  if (batch.size > options_.max_batch || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  TANDEM_RETURN_IF_ERROR(CheckWhole());
  const std::shared_ptr<Step> current = std::make_shared<Step>();
  Step& step = *current;
  step.options = options;
  Begin(step, batch, /*training=*/true);
  if (options_.continuous) {
    step.first_streamed = streamed_micro_batches_;
    streamed_micro_batches_ += step.micro_batches();
  }
  if (options_.schedule == PipelineSchedule::kPipeDream) {
    step.t0 = optimizer_->step();  // one update per micro-batch, counted below
  } else {
    step.constants = optimizer_->BeginStep(options.learning_rate, 1.0f);
  }
  TANDEM_RETURN_IF_ERROR(RunStages(current));
  if (options_.schedule == PipelineSchedule::kPipeDream) {
    optimizer_->set_step(step.t0 + step.micro_batches());
  }
  StepResult result;
  result.samples = batch.size;
  double sum = 0;
  for (double v : step.loss_sums) sum += v;
  result.loss = sum / static_cast<double>(batch.size);
  if (optimizer_->spec().max_grad_norm() > 0) result.grad_norm = std::sqrt(step.sum_of_squares);
  return result;
}

absl::StatusOr<EvalResult> PipelineRunner::EvalBatch(const Batch& batch) {
  if (batch.size > options_.max_batch || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  // On the weights of every update so far.
  TANDEM_RETURN_IF_ERROR(Drain());
  // On a thread of its own, whose team leaves with it (runtime/core/omp_threads.h).
  absl::StatusOr<EvalResult> result;
  RunOnOwnOmpThread(threads_, [&] { result = EvalStageAfterStage(batch); });
  return result;
}

absl::StatusOr<EvalResult> PipelineRunner::EvalStageAfterStage(const Batch& batch) {
  Step step;
  Begin(step, batch, /*training=*/false);
  // Stage after stage, each micro-batch: evaluation needs no overlap.
  absl::Status ran;
  for (int m = 0; m < step.micro_batches() && ran.ok(); ++m) {
    for (int s = 0; s < num_stages() && ran.ok(); ++s) ran = StageForward(step, s, m);
  }
  // Failed or not, no weights held or coming.
  for (auto& st : stages_) ReleaseWeights(*st);
  TANDEM_RETURN_IF_ERROR(ran);
  EvalResult r;
  r.samples = batch.size;
  for (int m = 0; m < step.micro_batches(); ++m) {
    r.loss_sum += step.loss_sums[m];
    r.correct += step.correct[m];
  }
  r.positions = batch.size * model_.loss().positions();
  return r;
}

absl::Status PipelineRunner::SyncStateToHost() {
  TANDEM_RETURN_IF_ERROR(Drain());
  for (auto& st : stages_) {
    TANDEM_RETURN_IF_ERROR(st->device->CopyToHost(host_params_.f32() + st->param_begin,
                                                  st->params.data(), st->resident_param_n() * 4));
    if (st->buffer_n > 0) {
      TANDEM_RETURN_IF_ERROR(st->device->CopyToHost(host_buffers_.f32() + st->buffer_begin,
                                                    st->buffers.data(), st->buffer_n * 4));
    }
    for (size_t i = 0; i < st->moments.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(st->device->CopyToHost(optimizer_->state(i) + st->param_begin,
                                                    st->moments[i].data(), st->device_param_n * 4));
    }
  }
  return absl::OkStatus();
}

HostStateView PipelineRunner::host_state() {
  HostStateView v;
  v.params = host_params_.f32();
  v.buffers = host_buffers_.f32();
  for (int i = 0; i < optimizer_->state_count(); ++i) v.moments.push_back(optimizer_->state(i));
  v.optimizer = optimizer_.get();
  return v;
}

absl::Status PipelineRunner::StateChangedOnHost() {
  // The host's state replaces whatever a continuous pipeline had in flight,
  // and any weights fetched from the host before.
  for (auto& st : stages_) {
    st->pending.clear();
    ReleaseWeights(*st);
  }
  for (auto& st : stages_) {
    TANDEM_RETURN_IF_ERROR(st->device->CopyToDevice(
        st->params.data(), host_params_.f32() + st->param_begin, st->resident_param_n() * 4));
    if (st->buffer_n > 0) {
      TANDEM_RETURN_IF_ERROR(st->device->CopyToDevice(
          st->buffers.data(), host_buffers_.f32() + st->buffer_begin, st->buffer_n * 4));
    }
    for (size_t i = 0; i < st->moments.size(); ++i) {
      TANDEM_RETURN_IF_ERROR(st->device->CopyToDevice(
          st->moments[i].data(), optimizer_->state(i) + st->param_begin, st->device_param_n * 4));
    }
  }
  broken_ = absl::OkStatus();
  return absl::OkStatus();
}

tandem::v1::UpdateStats PipelineRunner::update_stats() const {
  tandem::v1::UpdateStats out;
  if (options_.schedule != PipelineSchedule::kPipeDream) return out;  // synchronous
  out.set_rule("pipedream");
  std::vector<int64_t> counts;
  double lagged = 0;
  for (const auto& st : stages_) {
    out.set_updates(out.updates() + st->applied);
    if (counts.size() < st->lags.size()) counts.resize(st->lags.size());
    for (size_t i = 0; i < st->lags.size(); ++i) {
      counts[i] += st->lags[i];
      lagged += static_cast<double>(i) * static_cast<double>(st->lags[i]);
      if (st->lags[i] > 0) out.set_max_staleness(std::max<int64_t>(out.max_staleness(), i));
    }
  }
  for (const int64_t c : counts) out.add_staleness_counts(c);
  if (out.updates() > 0) out.set_mean_staleness(lagged / static_cast<double>(out.updates()));
  return out;
}

std::vector<tandem::v1::PipelineStageStats> PipelineRunner::pipeline_stats() const {
  std::vector<tandem::v1::PipelineStageStats> out;
  for (int s = 0; s < num_stages(); ++s) {
    const Stage& st = *stages_[s];
    tandem::v1::PipelineStageStats& o = out.emplace_back();
    o.set_stage(s);
    o.set_device(st.device->id());
    o.set_first_layer(st.first);
    o.set_last_layer(st.end - 1);
    o.set_busy_seconds(stats_[s].busy_seconds);
    o.set_bubble_seconds(stats_[s].bubble_seconds);
    o.set_copy_seconds(stats_[s].copy_seconds);
    o.set_peer_copy_seconds(stats_[s].peer_copy_seconds);
    o.set_peer_link(st.peer_in);
    o.set_update_seconds(stats_[s].update_seconds);
    o.set_peak_bytes(st.device->allocator()->stats().peak_total_bytes);
    if (s < plan_.pipeline_size()) o.set_predicted_bytes(plan_.pipeline(s).memory_bytes());
    o.set_staleness(st.staleness);
    o.set_updates(st.updates);
    o.set_recompute(st.recompute);
    o.set_offload_optimizer(st.offload());
    o.set_host_updated_layers(st.offload() && st.host_first > st.first ? st.end - st.host_first
                                                                       : 0);
    o.set_offload_activations(st.offload_activations);
    o.set_wait_for_activation_copies(st.wait_for_copies);
    o.set_stream_weights(st.stream_weights);
    o.set_weight_fetch_seconds(stats_[s].weight_fetch_seconds);
  }
  return out;
}

int64_t PipelineRunner::peak_host_bytes() const { return host_alloc_.stats().peak_total_bytes; }

int64_t PipelineRunner::peak_accelerator_bytes() const {
  int64_t peak = 0;
  for (const auto& st : stages_) {
    peak = std::max(peak, st->device->allocator()->stats().peak_total_bytes);
  }
  return peak;
}

}  // namespace tandem
