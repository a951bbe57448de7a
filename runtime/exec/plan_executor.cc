#include "runtime/exec/plan_executor.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/core/omp_threads.h"
#include "runtime/cpu/kernels.h"
#include "runtime/exec/executor_state.h"
#include "schedule/decisions.h"
#include "schedule/schedule_proto.h"

namespace tandem {
namespace {

using schedule::OpKind;
using tandem::v1::ActivationPolicy;
using tandem::v1::TimelineResource;

constexpr TimelineResource kH2D = tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
constexpr TimelineResource kD2H = tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
constexpr TimelineResource kHostUpdate = tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE;

}  // namespace

int64_t ExecutorTransientBytes(const Model& model, int64_t micro_batch) {
  int64_t max_out = 0, buffers = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    max_out = std::max(max_out, model.layer(l).OutputBytes(micro_batch));
    buffers += model.buffer_slice(l) * 4;
  }
  const int64_t input = micro_batch * model.data().sample_shape.elements() * 4;
  const int64_t targets = micro_batch * model.data().targets_per_sample * 4;
  // Two gradients between layers, the input and targets, the running statistics.
  return 2 * max_out + input + targets + buffers;
}

int64_t ExecutorMemoryMargin(const Model& model, int64_t micro_batch) {
  int64_t max_activation = 0;
  for (int l = 0; l < model.num_layers(); ++l) {
    const tandem::Layer& layer = model.layer(l);
    max_activation =
        std::max(max_activation, layer.OutputBytes(micro_batch) + layer.SavedBytes(micro_batch));
  }
  // One layer's activations of prefetch/offload slack on each side, and
  // 64-byte rounding of every buffer.
  return ExecutorTransientBytes(model, micro_batch) + 2 * max_activation +
         64 * 8 * (model.num_layers() + 4);
}

PlanExecutor::PlanExecutor(const Model& model, ExecutorOptions options)
    : model_(model), options_(std::move(options)), accel_(options_.accelerator) {}

PlanExecutor::~PlanExecutor() {
  if (engine_) engine_->WaitAll().IgnoreError();
  engine_.reset();
  for (void* p : registered_host_) accel_->UnregisterHost(p);
}

std::vector<std::string> PlanExecutor::warnings() const {
  if (pageable_reason_.empty()) return {};
  return {absl::StrCat("host copies of weights and gradients stay pageable (slower transfers): ",
                       pageable_reason_)};
}

void PlanExecutor::RegisterCopyBuffers() {
  if (accel_ == nullptr || host_only_) return;
  std::vector<Buffer*> buffers = {&host_params_, &host_grads_, &host_replica_grads_, &host_copy_,
                                  &host_grads16_};
  // The moments travel only where a layer's state is streamed.
  bool streams = false;
  for (const auto& layer : layers_) streams |= layer->stream_state;
  if (streams) {
    for (Buffer& m : host_moments_) buffers.push_back(&m);
  }
  for (Buffer* b : buffers) {
    if (b->empty()) continue;
    const absl::Status s = accel_->RegisterHost(b->data(), b->bytes());
    if (s.ok()) {
      registered_host_.push_back(b->data());
    } else if (pageable_reason_.empty()) {
      pageable_reason_ = std::string(s.message());
    }
  }
}

absl::StatusOr<std::unique_ptr<PlanExecutor>> PlanExecutor::Create(const Model& model,
                                                                   ExecutorOptions options) {
  std::unique_ptr<PlanExecutor> e(new PlanExecutor(model, std::move(options)));
  TANDEM_RETURN_IF_ERROR(e->Init());
  return e;
}

absl::Status PlanExecutor::Init() {
  const tandem::v1::Plan& plan = options_.plan;
  const int L = model_.num_layers();
  if (plan.layers_size() != L) {
    return PlanError("layers",
                     absl::StrCat("has ", plan.layers_size(), " layers; the model has ", L));
  }
  hetero_ = plan.strategy() == tandem::v1::STRATEGY_HETERO_DP;
  host_only_ = plan.strategy() == tandem::v1::STRATEGY_CPU_ONLY;
  if (!host_only_ && accel_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        tandem::v1::Strategy_Name(plan.strategy()), " needs an accelerator and none is available"));
  }
  if (plan.micro_batch_size() <= 0) return PlanError("micro_batch_size", "must be > 0");
  if (options_.host_allocator == nullptr) return absl::InvalidArgumentError("no host allocator");

  state_type_ = options_.test_working_copies && !host_only_ && !hetero_
                    ? DType::kBF16
                    : ExecutorStateType(model_, plan);
  // ZeRO's mixed precision: a rank keeps its pieces of the fp32 masters,
  // which KeepOwnMasters lays out once the buckets are cut; until then the
  // whole weights live in their view (host_grads_), and there is never a
  // whole fp32 copy besides.
  partitioned_state_ = options_.partition_host_state && options_.collective != nullptr && !hetero_;
  partitioned_masters_ = partitioned_state_ && state_type_ == DType::kBF16;

  TANDEM_RETURN_IF_ERROR(InitHostState());
  optimizer_ = Optimizer::Stateless(options_.optimizer);
  TANDEM_ASSIGN_OR_RETURN(decisions_, ExecutorDecisions(model_, plan));
  TANDEM_RETURN_IF_ERROR(InitWorkingCopies());

  sizes_ =
      ExecutorLayerSizes(model_, plan.micro_batch_size(), optimizer_->state_count(), state_type_);
  for (int l = 0; l < L; ++l) TANDEM_RETURN_IF_ERROR(InitLayer(l));
  TANDEM_RETURN_IF_ERROR(CheckRankLayers());
  // The program of a full batch: an invalid plan fails here, not at its first
  // step. The job record's stored program runs when it is this lowering.
  TANDEM_ASSIGN_OR_RETURN(full_schedule_, ScheduleFor(FullMicroBatches(plan, options_.max_batch),
                                                      /*full_batch=*/true));
  const Program* full = full_schedule_;
  TANDEM_RETURN_IF_ERROR(PartitionHostState());
  TANDEM_RETURN_IF_ERROR(KeepOwnMasters());
  TANDEM_RETURN_IF_ERROR(AllocateHostMoments());
  // Pinned where the device can, so that copies run at the link's rate.
  RegisterCopyBuffers();
  StartEngine(*full);
  return absl::OkStatus();
}

absl::Status PlanExecutor::CheckRankLayers() const {
  if (options_.collective == nullptr) return absl::OkStatus();
  for (size_t l = 0; l < layers_.size(); ++l) {
    // Its 16-bit gradient would be summed over the ranks as fp32 with the
    // resident layers' (AllReduceBucket's accelerator buckets).
    if (layers_[l]->stream_state && layers_[l]->working_copy) {
      return PlanError(absl::StrCat("layers[", l, "].stream_optimizer_state"),
                       "a data-parallel rank streams optimizer state in fp32 only so far; "
                       "keep this layer's state resident or update it on the host");
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::AllocateHostMoments() {
  // Host moments: for host updates (cpu_only, hetero_dp's host replica,
  // CPU-updated layers) and, for every plan, the checkpoint's copy of the
  // accelerator's (SyncStateToHost).
  for (int s = 0; s < optimizer_->state_count(); ++s) {
    TANDEM_ASSIGN_OR_RETURN(Buffer m,
                            Buffer::Allocate(options_.host_allocator, host_state_elements_ * 4,
                                             MemoryCategory::kOptimizerState));
    std::memset(m.data(), 0, host_state_elements_ * 4);
    host_moments_.push_back(std::move(m));
  }
  return absl::OkStatus();
}

void PlanExecutor::StartEngine(const Program& full) {
  const int update_threads = decisions_.host_update_threads;
  compute_threads_ = omp_get_max_threads();
  const int compute_threads = compute_threads_;
  std::vector<TimelineResource> resources;
  for (size_t r = 0; r < full.resources.size(); ++r) {
    if (!full.order[r].empty() || full.resources[r].kind == kHostUpdate)
      resources.push_back(full.resources[r].kind);
  }
  engine_ = std::make_unique<SpanEngine>(
      resources,
      [=](TimelineResource r) {
        // The update pool runs one layer's step at a time on all its threads;
        // compute streams use the job's threads; copy engines one.
        omp_set_num_threads(r == kHostUpdate ? update_threads
                            : (r == kH2D || r == kD2H || r == tandem::v1::TIMELINE_RESOURCE_NETWORK)
                                ? 1
                                : compute_threads);
      },
      options_.span_jitter_seconds, options_.span_recorder);
  if (accel_ != nullptr) {
    device_alloc_ = std::make_unique<BackpressureAllocator>(
        accel_->allocator(), [engine = engine_.get()] { return engine->active(); });
  }
}

absl::Status PlanExecutor::InitHostState() {
  Allocator* host = options_.host_allocator;
  // Laid out as the model's flat buffers.
  const int64_t P = model_.parameter_elements(), Bf = model_.buffer_elements();
  if (!partitioned_masters_) {
    TANDEM_ASSIGN_OR_RETURN(host_params_,
                            Buffer::Allocate(host, P * 4, MemoryCategory::kParameters));
  }
  TANDEM_ASSIGN_OR_RETURN(host_grads_, Buffer::Allocate(host, P * 4, MemoryCategory::kGradients));
  TANDEM_ASSIGN_OR_RETURN(host_buffers_,
                          Buffer::Allocate(host, Bf * 4, MemoryCategory::kParameters));
  if (!partitioned_masters_) std::memset(host_grads_.data(), 0, P * 4);
  model_.Initialize(WholeWeights(), host_buffers_.f32(), options_.init_seed);
  if (hetero_) {
    TANDEM_ASSIGN_OR_RETURN(host_replica_grads_,
                            Buffer::Allocate(host, P * 4, MemoryCategory::kGradients));
    std::memset(host_replica_grads_.data(), 0, P * 4);
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::PartitionHostState() {
  GradientCollective* ranks = options_.collective;
  const int64_t P = model_.parameter_elements();
  for (auto& layer : layers_) {
    layer->moment_offset = layer->moment_first = layer->param_offset;
    layer->moment_elements = layer->param_elements;
  }
  host_state_elements_ = P;
  if (!partitioned_state_) return absl::OkStatus();
  const int n = ranks->ranks(), rank = ranks->rank();
  for (const schedule::Op& op : full_schedule_->ops) {
    if (op.kind != OpKind::kReduceScatter) continue;
    HostBucket b;
    b.layers = op.bucket_layers;
    b.begin = layers_[op.layer]->param_offset;
    const Layer& last = *layers_[op.layer + op.bucket_layers - 1];
    const int64_t count = last.param_offset + last.param_elements - b.begin;
    if (count < n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "distributed.sharding: PARTITIONED cuts each bucket into one piece per rank; layers ",
          op.layer, "..", op.layer + op.bucket_layers - 1, " hold ", count,
          " weights, fewer than the ", n, " ranks (a larger distributed.bucket_bytes joins them)"));
    }
    int64_t own = b.begin;
    for (int r = 0; r < n; ++r) {
      b.pieces.push_back(count / n + (r < count % n ? 1 : 0));
      if (r < rank) own += b.pieces.back();
    }
    const int64_t own_end = own + b.pieces[rank];
    for (int l = op.layer; l < op.layer + b.layers; ++l) {
      Layer& layer = *layers_[l];
      const int64_t first = std::max(own, layer.param_offset);
      const int64_t end = std::min(own_end, layer.param_offset + layer.param_elements);
      layer.partitioned = true;
      layer.moment_first = end > first ? first : layer.param_offset;
      layer.moment_elements = std::max<int64_t>(0, end - first);
    }
    host_buckets_[op.layer] = std::move(b);
  }
  // This rank's pieces and the whole state of every other layer, one after
  // another.
  host_state_elements_ = 0;
  for (auto& layer : layers_) {
    layer->moment_offset = host_state_elements_;
    host_state_elements_ += layer->moment_elements;
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::KeepOwnMasters() {
  if (!partitioned_masters_) return absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(host_params_,
                          Buffer::Allocate(options_.host_allocator, host_state_elements_ * 4,
                                           MemoryCategory::kParameters));
  MastersFromWholeWeights();
  return absl::OkStatus();
}

void PlanExecutor::MastersFromWholeWeights() {
  const float* whole = WholeWeights();
  for (const auto& layer : layers_) {
    std::memcpy(MasterOf(*layer), whole + layer->moment_first, layer->moment_elements * 4);
  }
}

absl::Status PlanExecutor::GatherMasters() {
  float* whole = WholeWeights();
  for (const auto& layer : layers_) {
    std::memcpy(whole + layer->moment_first, MasterOf(*layer), layer->moment_elements * 4);
  }
  for (const auto& [low, b] : host_buckets_) {
    TANDEM_RETURN_IF_ERROR(options_.collective->AllGatherHost(whole + b.begin, b.pieces));
  }
  return absl::OkStatus();
}

float* PlanExecutor::MasterOf(const Layer& layer) const {
  return host_params_.f32() + (partitioned_masters_ ? layer.moment_offset : layer.moment_first);
}

float* PlanExecutor::WholeWeights() const {
  return partitioned_masters_ ? host_grads_.f32() : host_params_.f32();
}

std::optional<StatePartition> PlanExecutor::state_partition() {
  if (!partitioned_state_) return std::nullopt;
  StatePartition part;
  part.rank = options_.collective->rank();
  part.ranks = options_.collective->ranks();
  part.elements = host_state_elements_;
  for (Buffer& m : host_moments_) part.moments.push_back(m.f32());
  std::vector<std::string> cuts;
  for (const auto& [low, b] : host_buckets_) {
    cuts.push_back(absl::StrCat(b.begin, "+", absl::StrJoin(b.pieces, ",")));
  }
  int64_t whole = 0;
  for (const auto& layer : layers_) whole += layer->partitioned ? 0 : layer->param_elements;
  part.layout = absl::StrCat("plan ranks=", part.ranks, " host buckets=", absl::StrJoin(cuts, ";"),
                             " whole=", whole);
  return part;
}

absl::Status PlanExecutor::InitLayer(int l) {
  const schedule::LayerDecisions& d = decisions_.layers[l];
  auto layer = std::make_unique<Layer>();
  layer->layer = &model_.layer(l);
  layer->param_offset = model_.param_offset(l);
  layer->buffer_offset = model_.buffer_offset(l);
  layer->param_elements = model_.param_slice(l);
  layer->buffer_elements = model_.buffer_slice(l);
  layer->has_params = layer->layer->ParamCount() > 0;
  layer->streamed = d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  layer->accel_update = !host_only_ && d.update != tandem::v1::PLACEMENT_HOST;
  layer->stream_state = layer->accel_update && d.stream_state;
  layer->working_copy = HasWorkingCopy(model_, state_type_, decisions_, l);
  if (!host_only_) TANDEM_RETURN_IF_ERROR(PlaceOnAccelerator(*layer));
  layers_.push_back(std::move(layer));
  return absl::OkStatus();
}

absl::Status PlanExecutor::PlaceOnAccelerator(Layer& layer) {
  Allocator* dev = accel_->allocator();
  if (!layer.streamed && layer.param_elements > 0) {
    TANDEM_ASSIGN_OR_RETURN(
        layer.params, Buffer::Allocate(dev, layer.state_bytes(), MemoryCategory::kParameters));
    // Before KeepOwnMasters: a layer without a working copy from the whole
    // weights.
    const void* weights = layer.working_copy
                              ? HostWeights(layer)
                              : static_cast<const void*>(WholeWeights() + layer.param_offset);
    TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer.params.data(), weights, layer.state_bytes()));
  }
  if (layer.buffer_elements > 0) {
    TANDEM_ASSIGN_OR_RETURN(layer.buffers, Buffer::Allocate(dev, layer.buffer_elements * 4,
                                                            MemoryCategory::kParameters));
    TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer.buffers.data(),
                                                host_buffers_.f32() + layer.buffer_offset,
                                                layer.buffer_elements * 4));
  }
  if (layer.accel_update && !layer.stream_state && layer.param_elements > 0) {
    for (int s = 0; s < optimizer_->state_count(); ++s) {
      TANDEM_ASSIGN_OR_RETURN(Buffer m, Buffer::Allocate(dev, layer.param_elements * 4,
                                                         MemoryCategory::kOptimizerState));
      TANDEM_RETURN_IF_ERROR(accel_->Fill(m.f32(), 0.0f, layer.param_elements));
      layer.moments.push_back(std::move(m));
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::InitWorkingCopies() {
  bool any = false;
  for (int l = 0; l < model_.num_layers(); ++l)
    any |= HasWorkingCopy(model_, state_type_, decisions_, l);
  if (!any) return absl::OkStatus();
  const int64_t P = model_.parameter_elements();
  Allocator* host = options_.host_allocator;
  TANDEM_ASSIGN_OR_RETURN(host_copy_, Buffer::Allocate(host, P * 2, MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(host_grads16_, Buffer::Allocate(host, P * 2, MemoryCategory::kGradients));
  std::memset(host_grads16_.data(), 0, P * 2);
  RoundWorkingCopies();
  return absl::OkStatus();
}

void PlanExecutor::RoundWorkingCopies() {
  if (host_copy_.empty()) return;
  cpu::ToBf16(WholeWeights(), host_copy_.bf16(), model_.parameter_elements());
}

const void* PlanExecutor::HostWeights(const Layer& layer) const {
  if (layer.working_copy) return host_copy_.bf16() + layer.param_offset;
  // The whole layer's weights. Where masters are partitioned, a layer
  // without a working copy is not (it is updated on the accelerator) and its
  // share is the whole layer.
  return partitioned_masters_ ? MasterOf(layer) : host_params_.f32() + layer.param_offset;
}

absl::Status PlanExecutor::Drain() {
  if (!engine_) return absl::OkStatus();
  return engine_->WaitAll();
}

absl::StatusOr<StepResult> PlanExecutor::TrainStep(const Batch& batch, const StepOptions& options) {
  TANDEM_RETURN_IF_ERROR(engine_->status());
  if (batch.size <= 0 || batch.size > options_.max_batch) {
    return absl::InvalidArgumentError("batch larger than the executor was sized for");
  }
  if (hetero_ && batch.size == 1) {
    // A last batch of one sample (an epoch of k x batch + 1): both replicas
    // take a copy. Each copy's gradient weighs 1/2, so the step's gradient and
    // loss are the sample's own (dropout draws a mask per copy).
    Batch twice = batch;
    twice.size = 2;
    twice.inputs.insert(twice.inputs.end(), batch.inputs.begin(), batch.inputs.end());
    twice.targets.insert(twice.targets.end(), batch.targets.begin(), batch.targets.end());
    absl::StatusOr<StepResult> result = TrainStep(twice, options);
    if (result.ok()) result->samples = 1;
    return result;
  }
  auto it = std::make_shared<Iteration>();
  it->k = iteration_;
  it->batch = batch.size;
  it->options = options;
  it->input = &batch;
  it->losses.assign(batch.size, 0.0f);
  it->step = optimizer_->BeginStep(options.learning_rate, 1.0f);
  TANDEM_ASSIGN_OR_RETURN(it->schedule, ScheduleFor(SizeReplicas(*it)));
  ++iteration_;
  // The step's gradients overwrite the whole weights' view.
  whole_view_current_ = !partitioned_masters_;
  BuildStep(it);
  TANDEM_RETURN_IF_ERROR(WaitForCompute(*it));
  CollectTimelines();
  StepResult result;
  result.samples = batch.size;
  double sum = 0;
  for (float l : it->losses) sum += l;
  result.loss = sum / static_cast<double>(batch.size);
  result.grad_norm = it->grad_norm;
  if (options.loss_scale > 0 && it->grad_scale == 0) {
    // Skipped: the optimizer's step count goes back to where it was (no
    // update of this step reads it any more: each took its constants).
    result.skipped = true;
    optimizer_->set_step(optimizer_->step() - 1);
  }
  return result;
}

int PlanExecutor::SizeReplicas(Iteration& it) const {
  const int L = model_.num_layers();
  const tandem::v1::Plan& plan = options_.plan;
  const Side accel_side{accel_, device_alloc_.get()};
  const Side host_side{nullptr, options_.host_allocator};
  const int64_t micro = plan.micro_batch_size(), batch = it.batch;
  if (host_only_) {
    it.host.side = host_side;
    it.host.Size(L, 0, batch, std::min<int64_t>(micro, batch));
    it.host.host_grads = host_grads_.f32();
    return it.host.micro_batches();
  }
  if (hetero_) {
    // The accelerator takes its share of this batch (scaled for a short last batch).
    const int64_t share = plan.batch_size() > 0
                              ? (static_cast<int64_t>(plan.accelerator_batch_share()) * batch +
                                 plan.batch_size() / 2) /
                                    plan.batch_size()
                              : batch / 2;
    const int64_t a = std::clamp<int64_t>(share, 1, batch - 1);
    it.accel.side = accel_side;
    it.accel.Size(L, 0, a, std::min<int64_t>(micro, a));
    it.host.side = host_side;
    it.host.Size(L, a, batch - a, batch - a);
    it.host.host_grads = host_replica_grads_.f32();
    return it.accel.micro_batches();
  }
  it.accel.side = accel_side;
  it.accel.Size(L, 0, batch, std::min<int64_t>(micro, batch));
  return it.accel.micro_batches();
}

absl::Status PlanExecutor::WaitForCompute(const Iteration& it) {
  // The step's compute is done when each compute stream's last operation is;
  // updates and copies may still run on.
  const Program& s = *it.schedule;
  for (size_t r = 0; r < s.resources.size(); ++r) {
    if (s.resources[r].in_order && !s.order[r].empty())
      TANDEM_RETURN_IF_ERROR(engine_->Wait(it.spans[s.order[r].back()]));
  }
  if (it.options.loss_scale > 0) {
    // Whether this step updates at all: the norm decides.
    if (s.gradient_norm < 0) {
      return absl::FailedPreconditionError(
          "loss scaling needs an fp16 model (the step program takes no gradient norm)");
    }
    TANDEM_RETURN_IF_ERROR(engine_->Wait(it.spans[s.gradient_norm]));
  }
  return engine_->status();
}

absl::StatusOr<EvalResult> PlanExecutor::EvalBatch(const Batch& batch) {
  TANDEM_RETURN_IF_ERROR(Drain());
  absl::StatusOr<EvalResult> result;
  RunOnOwnOmpThread(compute_threads_, [&] { result = EvalBatchOnOwnThread(batch); });
  return result;
}

absl::StatusOr<EvalResult> PlanExecutor::EvalBatchOnOwnThread(const Batch& batch) {
  const int L = model_.num_layers();
  const Shape& sample = model_.data().sample_shape;
  const bool on_accel = !host_only_ && !hetero_;
  const Side side =
      on_accel ? Side{accel_, device_alloc_.get()} : Side{nullptr, options_.host_allocator};
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(options_.plan.micro_batch_size(), batch.size));
  EvalResult result;
  result.samples = batch.size;
  std::vector<float> losses(chunk), logits;
  const int64_t classes = model_.loss().classes();
  for (int64_t start = 0; start < batch.size; start += chunk) {
    const int64_t n = std::min(chunk, batch.size - start);
    const int64_t elem = DTypeBytes(batch.input_dtype);
    const int64_t tps = model_.data().targets_per_sample;
    TANDEM_ASSIGN_OR_RETURN(Buffer x, Buffer::Allocate(side.alloc, n * sample.elements() * elem,
                                                       MemoryCategory::kActivations));
    TANDEM_ASSIGN_OR_RETURN(
        Buffer targets, Buffer::Allocate(side.alloc, n * tps * 4, MemoryCategory::kActivations));
    TANDEM_RETURN_IF_ERROR(side.FromHost(
        x.data(),
        reinterpret_cast<const char*>(batch.inputs.data()) + start * sample.elements() * elem,
        n * sample.elements() * elem));
    TANDEM_RETURN_IF_ERROR(
        side.FromHost(targets.data(), batch.targets.data() + start * tps, n * tps * 4));
    Tensor in(x.data(), batch.input_dtype, sample.WithBatch(n));
    Buffer prev_out;
    for (int l = 0; l < L; ++l) {
      Layer& layer = *layers_[l];
      const tandem::Layer& impl = *layer.layer;
      TANDEM_ASSIGN_OR_RETURN(Buffer out, Buffer::Allocate(side.alloc, impl.OutputBytes(n),
                                                           MemoryCategory::kActivations));
      TANDEM_ASSIGN_OR_RETURN(Buffer saved, Buffer::Allocate(side.alloc, impl.SavedBytes(n),
                                                             MemoryCategory::kActivations));
      TANDEM_ASSIGN_OR_RETURN(Buffer ws, Buffer::Allocate(side.alloc, impl.WorkspaceBytes(n),
                                                          MemoryCategory::kWorkspace));
      Buffer streamed, widened;
      LayerContext ctx = side.Context();
      ctx.training = false;
      ctx.workspace = ws.data();
      ctx.targets = reinterpret_cast<const int32_t*>(targets.data());
      if (on_accel) {
        ctx.buffers = layer.buffers.f32();
        void* weights = layer.params.data();
        if (layer.streamed && layer.param_elements > 0) {
          TANDEM_ASSIGN_OR_RETURN(streamed, Buffer::Allocate(side.alloc, layer.state_bytes(),
                                                             MemoryCategory::kParameters));
          TANDEM_RETURN_IF_ERROR(
              side.FromHost(streamed.data(), HostWeights(layer), layer.state_bytes()));
          weights = streamed.data();
        }
        TANDEM_ASSIGN_OR_RETURN(ctx.params, ComputeWeights(side, layer, weights, widened));
      } else {
        ctx.params = host_params_.f32() + layer.param_offset;
        ctx.buffers =
            layer.buffer_elements > 0 ? host_buffers_.f32() + layer.buffer_offset : nullptr;
      }
      impl.Forward(ctx, in, Tensor::F32(out.f32(), impl.output_shape().WithBatch(n)), saved.data());
      TANDEM_RETURN_IF_ERROR(side.Finish());
      if (l == L - 2) {
        logits.resize(n * impl.output_shape().elements());
        TANDEM_RETURN_IF_ERROR(side.ToHost(logits.data(), out.data(), logits.size() * 4));
      }
      if (l == L - 1) TANDEM_RETURN_IF_ERROR(side.ToHost(losses.data(), out.data(), n * 4));
      prev_out = std::move(out);
      in = Tensor::F32(prev_out.f32(), impl.output_shape().WithBatch(n));
    }
    for (int64_t i = 0; i < n; ++i) result.loss_sum += losses[i];
    result.positions += n * tps;
    result.correct +=
        CountCorrect(logits.data(), batch.targets.data() + start * tps, n * tps, classes);
  }
  return result;
}

absl::Status PlanExecutor::SyncStateToHost() {
  TANDEM_RETURN_IF_ERROR(Drain());
  if (host_only_) return absl::OkStatus();
  for (auto& layer : layers_) {
    if (layer->buffer_elements > 0 && !hetero_) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host_buffers_.f32() + layer->buffer_offset,
                                                layer->buffers.data(), layer->buffer_elements * 4));
    }
    // hetero_dp's host replica already holds the same weights and moments;
    // a working copy's master weights are the host's (streamed state too,
    // whose moments are back on the host once the step has drained).
    if (hetero_ || !layer->accel_update || layer->working_copy || layer->param_elements == 0)
      continue;
    TANDEM_RETURN_IF_ERROR(
        accel_->CopyToHost(MasterOf(*layer), layer->params.data(), layer->param_elements * 4));
    for (size_t s = 0; s < layer->moments.size(); ++s) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host_moments_.at(s).f32() + layer->moment_offset,
                                                layer->moments[s].data(),
                                                layer->param_elements * 4));
    }
  }
  // Every rank's pieces of the masters into the whole weights' view, which
  // host_state() shows (rank 0's checkpoint holds them whole), once a step
  // has overwritten it. Until then the view is newer than the other ranks'
  // pieces: rank 0 may have loaded a checkpoint into it. Every rank steps
  // alike, so all gather or none does.
  if (!partitioned_masters_ || whole_view_current_) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(GatherMasters());
  whole_view_current_ = true;
  return absl::OkStatus();
}

absl::Status PlanExecutor::StateChangedOnHost() {
  TANDEM_RETURN_IF_ERROR(Drain());
  // The optimizer's step counter was set through host_state().optimizer.
  if (host_only_) return absl::OkStatus();
  if (partitioned_masters_) {
    if (!whole_view_current_) {
      return absl::FailedPreconditionError(
          "the weights host_state() shows are current only after SyncStateToHost: with "
          "partitioned master weights they share memory with the gradients");
    }
    // This rank's pieces of the masters from the (written) whole weights.
    MastersFromWholeWeights();
  }
  RoundWorkingCopies();
  for (auto& layer : layers_) {
    if (layer->buffer_elements > 0) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->buffers.data(),
                                                  host_buffers_.f32() + layer->buffer_offset,
                                                  layer->buffer_elements * 4));
    }
    if (layer->streamed || layer->param_elements == 0) continue;
    TANDEM_RETURN_IF_ERROR(
        accel_->CopyToDevice(layer->params.data(), HostWeights(*layer), layer->state_bytes()));
    for (size_t s = 0; s < layer->moments.size(); ++s) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->moments[s].data(),
                                                  host_moments_.at(s).f32() + layer->moment_offset,
                                                  layer->param_elements * 4));
    }
  }
  return absl::OkStatus();
}

HostStateView PlanExecutor::host_state() {
  HostStateView v;
  v.params = WholeWeights();
  v.buffers = host_buffers_.f32();
  // Partitioned, the host holds pieces of the moments (state_partition()).
  if (!partitioned_state_) {
    for (Buffer& m : host_moments_) v.moments.push_back(m.f32());
  }
  v.optimizer = optimizer_.get();
  return v;
}

int64_t PlanExecutor::peak_host_bytes() const {
  return options_.host_allocator->stats().peak_total_bytes;
}

int64_t PlanExecutor::peak_accelerator_bytes() const {
  return accel_ != nullptr ? accel_->allocator()->stats().peak_total_bytes : 0;
}

void PlanExecutor::CollectTimelines() {
  std::vector<SpanRecord> finished = engine_->TakeRecords();
  if (timing_sink_ != nullptr) timing_sink_->RecordSpans(ResourceSpansOf(finished));
  for (SpanRecord& r : finished) {
    // The always-on per-layer histograms: every forward, backward and update
    // span of a layer, wherever it ran (recompute, copies and syncs are not
    // layer phases).
    if (timing_sink_ != nullptr && r.info.layer >= 0) {
      switch (r.info.phase) {
        case tandem::v1::TIMELINE_PHASE_FORWARD:
          timing_sink_->Record(r.info.layer, Phase::kForward, r.end - r.start);
          break;
        case tandem::v1::TIMELINE_PHASE_BACKWARD:
          timing_sink_->Record(r.info.layer, Phase::kBackward, r.end - r.start);
          break;
        case tandem::v1::TIMELINE_PHASE_UPDATE:
          timing_sink_->Record(r.info.layer, Phase::kUpdate, r.end - r.start);
          break;
        default:
          break;
      }
    }
    records_[r.info.iteration].push_back(r);
    --iteration_spans_[r.info.iteration];
  }
  // The newest iteration that is complete and whose successor has started.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    const int64_t k = it->first;
    if (iteration_spans_[k] != 0) continue;
    auto next = records_.find(k + 1);
    if (next == records_.end() || next->second.empty()) continue;
    auto first_compute = [](const std::vector<SpanRecord>& spans) {
      double start = 1e300;
      for (const SpanRecord& s : spans) {
        if (s.info.phase == tandem::v1::TIMELINE_PHASE_FORWARD) start = std::min(start, s.start);
      }
      return start;
    };
    const double start = first_compute(it->second);
    const double next_start = first_compute(next->second);
    if (start > 1e299 || next_start > 1e299) continue;
    tandem::v1::Timeline timeline;
    timeline.set_source("measured");
    timeline.set_iteration_seconds(next_start - start);
    for (const SpanRecord& s : it->second) {
      auto* span = timeline.add_spans();
      span->set_resource(s.info.resource);
      span->set_layer(s.info.layer);
      span->set_phase(s.info.phase);
      span->set_micro_batch(std::max(0, s.info.micro_batch));
      span->set_bytes(s.info.bytes);
      span->set_start_seconds(s.start - start);
      span->set_end_seconds(s.end - start);
    }
    last_timeline_ = std::move(timeline);
    // Older iterations are no longer needed.
    for (auto old = records_.begin(); old != records_.end() && old->first < k;) {
      iteration_spans_.erase(old->first);
      old = records_.erase(old);
    }
    break;
  }
}

ResourceSpanBatch PlanExecutor::ResourceSpansOf(const std::vector<SpanRecord>& records) {
  ResourceSpanBatch batch;
  if (accel_ != nullptr) {
    batch.accelerator = accel_->id();
    batch.pinned_host_bytes = accel_->pinned_host_bytes();
    batch.accelerator_memory = accel_->allocator()->stats();
  }
  batch.spans.reserve(records.size());
  for (const SpanRecord& r : records) {
    batch.spans.push_back({.resource = r.info.resource,
                           .busy_seconds = r.end - r.start,
                           .bytes = r.info.bytes,
                           .wait_seconds = r.wait_seconds,
                           .waited_on = r.waited_on});
  }
  return batch;
}

tandem::v1::Timeline PlanExecutor::last_timeline() const { return last_timeline_; }

const schedule::Schedule& PlanExecutor::schedule() const { return *full_schedule_; }

tandem::v1::Schedule PlanExecutor::program() const { return schedule::ToProto(*full_schedule_); }

}  // namespace tandem
