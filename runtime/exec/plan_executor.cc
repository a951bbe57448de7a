#include "runtime/exec/plan_executor.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "runtime/core/clock.h"
#include "runtime/core/random.h"
#include "runtime/core/status_macros.h"
#include "runtime/optim/kernels.h"

namespace tandem {
namespace {

using tandem::v1::ActivationPolicy;
using tandem::v1::TimelinePhase;
using tandem::v1::TimelineResource;

constexpr TimelineResource kAccel = tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
constexpr TimelineResource kH2D = tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
constexpr TimelineResource kD2H = tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
constexpr TimelineResource kHostUpdate = tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE;
constexpr TimelineResource kHostCompute = tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE;
constexpr ActivationPolicy kKeep = tandem::v1::ACTIVATION_POLICY_KEEP;
constexpr ActivationPolicy kOffload = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
constexpr ActivationPolicy kRecompute = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;

// The dropout stream of (step, layer), as the CPU engine draws it.
uint64_t RngStream(int64_t step, int layer) {
  return MixStream(0xd209, static_cast<uint64_t>(step), static_cast<uint64_t>(layer));
}

absl::Status PlanError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("plan.", field, ": ", message));
}

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

// One layer's decisions and its state on the accelerator.
struct PlanExecutor::Layer {
  const tandem::Layer* layer = nullptr;
  int index = 0;
  bool accel_compute = true;
  bool streamed = false;
  bool accel_update = true;
  ActivationPolicy policy = kKeep;
  bool has_params = false;
  int64_t param_elements = 0;  // the layer's slice of the flat buffers (padded)
  int64_t buffer_elements = 0;
  int64_t param_offset = 0, buffer_offset = 0;
  // Accelerator state: resident weights, running statistics, optimizer moments,
  // and the gradient from a step's first backward until copied or applied.
  Buffer params, buffers, grads;
  std::vector<Buffer> moments;
  // What the next step's first forward of this layer waits for: the span that
  // made its updated weights available (H2D copy, accelerator update, or the
  // host update for host compute and streamed weights).
  SpanId weights_ready = 0;
  // Delayed updates: the host update not yet copied back, and the copy of the
  // one before, which the next forward waits for.
  SpanId dpu_pending_update = 0;
  SpanId dpu_ready = 0;
  // hetero_dp: the host replica's update of the previous step.
  SpanId host_weights_ready = 0;
  // The span that last released `grads` (its D2H copy or its update): the next
  // step's first backward writes the buffer afresh only after it.
  SpanId grads_free = 0;
};

// Where a replica computes: its memory, layer contexts and copies to and from
// the host. The host side copies with memcpy.
struct PlanExecutor::Side {
  Accelerator* dev = nullptr;  // null on the host
  Allocator* alloc = nullptr;
  TimelineResource compute = kHostCompute;

  LayerContext Context() const {
    if (dev != nullptr) return dev->ComputeContext();
    return LayerContext();
  }
  absl::Status Finish() const { return dev != nullptr ? dev->FinishCompute() : absl::OkStatus(); }
  absl::Status FromHost(void* dst, const void* src, int64_t bytes) const {
    if (dev != nullptr) return dev->CopyToDevice(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status ToHost(void* dst, const void* src, int64_t bytes) const {
    if (dev != nullptr) return dev->CopyToHost(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Fill(float* dst, float value, int64_t n) const {
    if (dev != nullptr) return dev->Fill(dst, value, n);
    std::fill(dst, dst + n, value);
    return absl::OkStatus();
  }
};

// The tensors of one replica's work in one step, touched by spans in
// dependency order.
struct PlanExecutor::Replica {
  Side side;
  // Samples of the whole batch this replica computes, in micro-batches.
  std::vector<int64_t> mb_start, mb_size;
  // [layer][micro-batch]
  std::vector<std::vector<Buffer>> out, saved, host_out, host_saved, grad, fwd_weights, bwd_weights;
  std::vector<Buffer> x, targets;
  // Host replica only: its gradients (hetero_dp keeps them apart from the
  // accelerator's, which arrive in the executor's host gradient buffer).
  float* host_grads = nullptr;

  void Size(int layers, int64_t first, int64_t samples, int64_t micro_batch) {
    for (int64_t s = 0; s < samples; s += micro_batch) {
      mb_start.push_back(first + s);
      mb_size.push_back(std::min(micro_batch, samples - s));
    }
    const size_t M = mb_start.size();
    for (auto* v : {&out, &saved, &host_out, &host_saved, &grad, &fwd_weights, &bwd_weights}) {
      v->clear();
      v->resize(layers);
      for (auto& per_layer : *v) per_layer.resize(M);
    }
    x.resize(M);
    targets.resize(M);
  }
};

struct PlanExecutor::Iteration {
  int64_t k = 0;
  int64_t batch = 0;
  StepOptions options;
  StepConstants step;
  const Batch* input = nullptr;
  Replica accel, host;
  std::vector<float> losses;
  float grad_scale = 1.0f;
  double grad_norm = 0;
};

PlanExecutor::PlanExecutor(const Model& model, ExecutorOptions options)
    : model_(model), options_(std::move(options)), accel_(options_.accelerator) {}

PlanExecutor::~PlanExecutor() {
  if (engine_) engine_->WaitAll().IgnoreError();
  engine_.reset();
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
  Allocator* host = options_.host_allocator;

  // Host state, laid out as the model's flat buffers.
  const int64_t P = model_.parameter_elements(), Bf = model_.buffer_elements();
  TANDEM_ASSIGN_OR_RETURN(host_params_, Buffer::Allocate(host, P * 4, MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(host_grads_, Buffer::Allocate(host, P * 4, MemoryCategory::kGradients));
  TANDEM_ASSIGN_OR_RETURN(host_buffers_,
                          Buffer::Allocate(host, Bf * 4, MemoryCategory::kParameters));
  model_.Initialize(host_params_.f32(), host_buffers_.f32(), options_.init_seed);
  std::memset(host_grads_.data(), 0, P * 4);
  if (hetero_) {
    TANDEM_ASSIGN_OR_RETURN(host_replica_grads_,
                            Buffer::Allocate(host, P * 4, MemoryCategory::kGradients));
    std::memset(host_replica_grads_.data(), 0, P * 4);
  }
  optimizer_ = Optimizer::Stateless(options_.optimizer);
  const int states = optimizer_->state_count();

  bool any_host_update = false;
  for (int l = 0; l < L; ++l) {
    const tandem::v1::LayerPlan& lp = plan.layers(l);
    auto layer = std::make_unique<Layer>();
    layer->layer = &model_.layer(l);
    layer->index = l;
    layer->accel_compute = !host_only_;
    layer->streamed =
        !host_only_ && lp.parameter_home() == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
    layer->accel_update = !host_only_ && lp.update() != tandem::v1::PLACEMENT_HOST;
    layer->policy = lp.activation_policy() == tandem::v1::ACTIVATION_POLICY_UNSPECIFIED
                        ? kKeep
                        : lp.activation_policy();
    layer->param_offset = model_.param_offset(l);
    layer->buffer_offset = model_.buffer_offset(l);
    layer->param_elements = model_.param_slice(l);
    layer->buffer_elements = model_.buffer_slice(l);
    layer->has_params = layer->layer->ParamCount() > 0;
    if (!host_only_ && lp.compute() == tandem::v1::PLACEMENT_HOST) {
      return PlanError(absl::StrCat("layers[", l, "].compute"),
                       "host compute of single layers inside an accelerator plan is not supported");
    }
    if (hetero_) {
      // Both replicas keep their state resident and update with the same gradient.
      layer->streamed = false;
      layer->accel_update = true;
      if (layer->policy == kOffload) layer->policy = kKeep;
    }
    if (host_only_ && layer->policy == kOffload) layer->policy = kKeep;
    if (layer->streamed && layer->accel_update) {
      return PlanError(absl::StrCat("layers[", l, "].update"),
                       "a streamed layer must update on the host");
    }
    if (plan.delayed_parameter_update() && layer->streamed) {
      return PlanError("delayed_parameter_update", "is not supported with streamed layers");
    }
    if (!host_only_ && !layer->accel_update && layer->has_params) any_host_update = true;

    if (layer->accel_compute) {
      Allocator* dev = accel_->allocator();
      if (!layer->streamed && layer->param_elements > 0) {
        TANDEM_ASSIGN_OR_RETURN(layer->params, Buffer::Allocate(dev, layer->param_elements * 4,
                                                                MemoryCategory::kParameters));
        TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->params.data(),
                                                    host_params_.f32() + layer->param_offset,
                                                    layer->param_elements * 4));
      }
      if (layer->buffer_elements > 0) {
        TANDEM_ASSIGN_OR_RETURN(layer->buffers, Buffer::Allocate(dev, layer->buffer_elements * 4,
                                                                 MemoryCategory::kParameters));
        TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->buffers.data(),
                                                    host_buffers_.f32() + layer->buffer_offset,
                                                    layer->buffer_elements * 4));
      }
      if (layer->accel_update && layer->param_elements > 0) {
        for (int s = 0; s < states; ++s) {
          TANDEM_ASSIGN_OR_RETURN(Buffer m, Buffer::Allocate(dev, layer->param_elements * 4,
                                                             MemoryCategory::kOptimizerState));
          TANDEM_RETURN_IF_ERROR(accel_->Fill(m.f32(), 0.0f, layer->param_elements));
          layer->moments.push_back(std::move(m));
        }
      }
    }
    layers_.push_back(std::move(layer));
  }
  // Host moments for host updates: cpu_only, hetero_dp's host replica, CPU-updated layers.
  if (host_only_ || hetero_ || any_host_update) {
    for (int s = 0; s < states; ++s) {
      TANDEM_ASSIGN_OR_RETURN(Buffer m,
                              Buffer::Allocate(host, P * 4, MemoryCategory::kOptimizerState));
      std::memset(m.data(), 0, P * 4);
      host_moments_.push_back(std::move(m));
    }
  }
  const int update_threads = std::max(1, plan.host_update_threads());
  const int compute_threads = omp_get_max_threads();
  std::vector<TimelineResource> resources = {kHostUpdate};
  if (!host_only_) resources.insert(resources.end(), {kAccel, kH2D, kD2H});
  if (host_only_ || hetero_) resources.push_back(kHostCompute);
  engine_ = std::make_unique<SpanEngine>(
      resources,
      [=](TimelineResource r) {
        // The update pool runs one layer's step at a time on all its threads;
        // compute streams use the job's threads; copy engines one.
        omp_set_num_threads(r == kHostUpdate           ? update_threads
                            : (r == kH2D || r == kD2H) ? 1
                                                       : compute_threads);
      },
      options_.span_jitter_seconds);
  if (accel_ != nullptr) {
    device_alloc_ = std::make_unique<BackpressureAllocator>(
        accel_->allocator(), [engine = engine_.get()] { return engine->active(); });
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::Drain() {
  if (!engine_) return absl::OkStatus();
  return engine_->WaitAll();
}

SpanId PlanExecutor::Add(Iteration& it, TimelineResource resource, TimelinePhase phase, int layer,
                         int micro_batch, int64_t bytes, std::vector<SpanId> deps,
                         std::function<absl::Status()> work) {
  SpanInfo info;
  info.resource = resource;
  info.phase = phase;
  info.layer = layer;
  info.micro_batch = micro_batch;
  info.bytes = bytes;
  info.iteration = it.k;
  ++iteration_spans_[it.k];
  return engine_->Add(info, std::move(deps), std::move(work));
}

absl::StatusOr<StepResult> PlanExecutor::TrainStep(const Batch& batch, const StepOptions& options) {
  TANDEM_RETURN_IF_ERROR(engine_->status());
  if (batch.size <= 0 || batch.size > options_.max_batch) {
    return absl::InvalidArgumentError("batch larger than the executor was sized for");
  }
  auto it = std::make_shared<Iteration>();
  it->k = iteration_++;
  it->batch = batch.size;
  it->options = options;
  it->input = &batch;
  it->losses.assign(batch.size, 0.0f);
  it->step = optimizer_->BeginStep(options.learning_rate, 1.0f);
  const int L = model_.num_layers();
  const tandem::v1::Plan& plan = options_.plan;
  Side accel_side{accel_, device_alloc_.get(), kAccel};
  Side host_side{nullptr, options_.host_allocator, kHostCompute};
  last_spans_.clear();
  last_backward_[0].assign(L, 0);
  last_backward_[1].assign(L, 0);
  if (host_only_) {
    it->host.side = host_side;
    it->host.Size(L, 0, batch.size, std::min<int64_t>(plan.micro_batch_size(), batch.size));
    it->host.host_grads = host_grads_.f32();
    BuildReplica(it, it->host, /*updates=*/true);
  } else if (hetero_) {
    // The accelerator takes its share of this batch (scaled for a short last batch).
    const int64_t share = plan.batch_size() > 0
                              ? (static_cast<int64_t>(plan.accelerator_batch_share()) * batch.size +
                                 plan.batch_size() / 2) /
                                    plan.batch_size()
                              : batch.size / 2;
    const int64_t a = std::clamp<int64_t>(share, 1, batch.size - 1);
    it->accel.side = accel_side;
    it->accel.Size(L, 0, a, std::min<int64_t>(plan.micro_batch_size(), a));
    it->host.side = host_side;
    it->host.Size(L, a, batch.size - a, batch.size - a);
    it->host.host_grads = host_replica_grads_.f32();
    if (batch.size < 2)
      return absl::InvalidArgumentError("hetero_dp needs batches of at least 2 samples");
    BuildReplica(it, it->accel, /*updates=*/false);
    BuildReplica(it, it->host, /*updates=*/false);
    BuildGradientSync(it);
  } else {
    it->accel.side = accel_side;
    it->accel.Size(L, 0, batch.size, std::min<int64_t>(plan.micro_batch_size(), batch.size));
    BuildReplica(it, it->accel, /*updates=*/true);
  }
  // The step's compute is done when its last compute spans are; updates and
  // copies may still run on.
  for (SpanId id : last_spans_) TANDEM_RETURN_IF_ERROR(engine_->Wait(id));
  TANDEM_RETURN_IF_ERROR(engine_->status());
  CollectTimelines();
  StepResult result;
  result.samples = batch.size;
  double sum = 0;
  for (float l : it->losses) sum += l;
  result.loss = sum / static_cast<double>(batch.size);
  result.grad_norm = it->grad_norm;
  return result;
}

void PlanExecutor::BuildReplica(const std::shared_ptr<Iteration>& shared, Replica& rep,
                                bool updates) {
  Iteration& it = *shared;
  const int L = model_.num_layers();
  const int M = static_cast<int>(rep.mb_start.size());
  const bool on_accel = rep.side.dev != nullptr;
  const bool dpu = on_accel && options_.plan.delayed_parameter_update();
  const bool clip = options_.optimizer.max_grad_norm() > 0;
  const Shape sample = model_.data().sample_shape;
  const int64_t B = it.batch;
  Replica* r = &rep;
  std::vector<SpanId> program = {on_accel ? last_accel_compute_ : last_host_compute_};
  // Prefetches are issued when the compute stream starts the span before the one
  // they feed, i.e. when the span two back ends.
  auto prefetch_point = [&program]() {
    return program.size() >= 2 ? program[program.size() - 2] : program.back();
  };
  auto compute = [&](TimelinePhase phase, int l, int j, std::vector<SpanId> deps,
                     std::function<absl::Status()> work) {
    deps.push_back(program.back());
    const SpanId id = Add(it, rep.side.compute, phase, l, j, 0, std::move(deps), std::move(work));
    program.push_back(id);
    return id;
  };
  // The weights a layer's call reads on this replica.
  auto weights = [this, r, on_accel](int l, int j, bool backward) -> float* {
    Layer& layer = *layers_[l];
    if (!on_accel) return host_params_.f32() + layer.param_offset;
    if (!layer.streamed) return layer.params.f32();
    return (backward ? r->bwd_weights : r->fwd_weights)[l][j].f32();
  };
  auto context = [this, shared, r, on_accel](int l, int j, bool training) {
    Layer& layer = *layers_[l];
    LayerContext ctx = r->side.Context();
    ctx.training = training;
    ctx.seed = shared->options.seed;
    ctx.rng_stream = RngStream(shared->options.step, l);
    ctx.sample_offset = static_cast<uint64_t>(r->mb_start[j]);
    ctx.accumulate_grads = j > 0;
    ctx.buffers = on_accel ? layer.buffers.f32()
                           : (layer.buffer_elements > 0 ? host_buffers_.f32() + layer.buffer_offset
                                                        : nullptr);
    // Gradients are set by the backward alone: a forward runs while the
    // previous step's gradient copy may still be releasing layer.grads.
    ctx.targets = reinterpret_cast<const int32_t*>(r->targets[j].data());
    return ctx;
  };
  auto run_forward = [this, shared, r, weights, context, sample](int l, int j,
                                                                 bool recompute) -> absl::Status {
    const tandem::Layer& layer = *layers_[l]->layer;
    const int64_t n = r->mb_size[j];
    Allocator* alloc = r->side.alloc;
    Buffer& out = r->out[l][j];
    Buffer& saved = r->saved[l][j];
    if (out.empty()) {
      TANDEM_ASSIGN_OR_RETURN(
          out, Buffer::Allocate(alloc, layer.OutputBytes(n), MemoryCategory::kActivations));
    }
    if (saved.empty() && layer.SavedBytes(n) > 0) {
      TANDEM_ASSIGN_OR_RETURN(
          saved, Buffer::Allocate(alloc, layer.SavedBytes(n), MemoryCategory::kActivations));
    }
    TANDEM_ASSIGN_OR_RETURN(
        Buffer ws, Buffer::Allocate(alloc, layer.WorkspaceBytes(n), MemoryCategory::kWorkspace));
    LayerContext ctx = context(l, j, /*training=*/true);
    ctx.params = weights(l, j, recompute);
    ctx.workspace = ws.data();
    ctx.recompute = recompute;
    const Tensor x = l == 0
                         ? Tensor(r->x[j].data(), shared->input->input_dtype, sample.WithBatch(n))
                         : Tensor::F32(r->out[l - 1][j].f32(), layer.input_shape().WithBatch(n));
    layer.Forward(ctx, x, Tensor::F32(out.f32(), layer.output_shape().WithBatch(n)), saved.data());
    return r->side.Finish();
  };
  // A streamed layer's weights, copied in for one call; freed when the call ends.
  auto stream_weights = [&](int l, int j, bool backward, std::vector<SpanId> deps) {
    const int64_t bytes = layers_[l]->param_elements * 4;
    deps.push_back(prefetch_point());
    return Add(it, kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, j, bytes, std::move(deps),
               [this, r, l, j, backward, bytes]() -> absl::Status {
                 Buffer& dst = (backward ? r->bwd_weights : r->fwd_weights)[l][j];
                 TANDEM_ASSIGN_OR_RETURN(
                     dst, Buffer::Allocate(r->side.alloc, bytes, MemoryCategory::kParameters));
                 return r->side.FromHost(dst.data(), host_params_.f32() + layers_[l]->param_offset,
                                         bytes);
               });
  };

  // Offloaded activations: (layer, micro-batch) -> its D2H.
  std::map<std::pair<int, int>, SpanId> offloaded;
  // An offloaded layer comes back before the first backward that reads it: the
  // next layer's (its input) or its own recompute.
  std::map<std::pair<int, int>, SpanId> restored;
  auto restore = [&](int p, int j) -> SpanId {
    if (p < 0 || !offloaded.count({p, j})) return 0;
    if (restored.count({p, j})) return restored[{p, j}];
    const int64_t bytes = layers_[p]->layer->OutputBytes(r->mb_size[j]) +
                          layers_[p]->layer->SavedBytes(r->mb_size[j]);
    return restored[{p, j}] = Add(
               it, kH2D, tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D, p, j, bytes,
               {offloaded[{p, j}], prefetch_point()}, [r, p, j]() -> absl::Status {
                 for (auto [dst, src] : {std::make_pair(&r->out[p][j], &r->host_out[p][j]),
                                         std::make_pair(&r->saved[p][j], &r->host_saved[p][j])}) {
                   if (src->empty()) continue;
                   TANDEM_ASSIGN_OR_RETURN(*dst, Buffer::Allocate(r->side.alloc, src->bytes(),
                                                                  MemoryCategory::kActivations));
                   TANDEM_RETURN_IF_ERROR(r->side.FromHost(dst->data(), src->data(), src->bytes()));
                   src->Reset();
                 }
                 return absl::OkStatus();
               });
  };
  std::vector<SpanId> d2h_spans;
  std::vector<int> deferred_accel_updates, deferred_host_compute_updates;
  std::vector<std::pair<int, SpanId>> deferred_host_updates;
  // Each micro-batch runs forward then backward before the next starts (the
  // simulator's program), so only one micro-batch's activations are live.
  for (int j = 0; j < M; ++j) {
    // ---- Forward of micro-batch j ----
    for (int l = 0; l < L; ++l) {
      Layer& layer = *layers_[l];
      std::vector<SpanId> deps;
      if (j == 0 && layer.has_params) {
        if (!on_accel) {
          deps.push_back(hetero_ ? layer.host_weights_ready : layer.weights_ready);
        } else if (layer.streamed) {
          deps.push_back(stream_weights(l, j, false, {layer.weights_ready}));
        } else if (!layer.accel_update) {
          deps.push_back(dpu ? layer.dpu_ready : layer.weights_ready);
        }
      } else if (on_accel && layer.streamed && layer.has_params) {
        deps.push_back(stream_weights(l, j, false, {}));
      }
      compute(tandem::v1::TIMELINE_PHASE_FORWARD, l, j, deps,
              [this, shared, r, run_forward, sample, l, j, L]() -> absl::Status {
                const int64_t n = r->mb_size[j];
                if (l == 0) {
                  // The micro-batch's inputs and targets come to the compute side first.
                  const int64_t elem = DTypeBytes(shared->input->input_dtype);
                  const int64_t in_bytes = n * sample.elements() * elem;
                  const int64_t tps = model_.data().targets_per_sample;
                  TANDEM_ASSIGN_OR_RETURN(r->x[j], Buffer::Allocate(r->side.alloc, in_bytes,
                                                                    MemoryCategory::kActivations));
                  TANDEM_ASSIGN_OR_RETURN(
                      r->targets[j],
                      Buffer::Allocate(r->side.alloc, n * tps * 4, MemoryCategory::kActivations));
                  const char* src = reinterpret_cast<const char*>(shared->input->inputs.data());
                  TANDEM_RETURN_IF_ERROR(r->side.FromHost(
                      r->x[j].data(), src + r->mb_start[j] * sample.elements() * elem, in_bytes));
                  TANDEM_RETURN_IF_ERROR(r->side.FromHost(
                      r->targets[j].data(), shared->input->targets.data() + r->mb_start[j] * tps,
                      n * tps * 4));
                }
                TANDEM_RETURN_IF_ERROR(run_forward(l, j, /*recompute=*/false));
                if (layers_[l]->streamed) r->fwd_weights[l][j].Reset();
                // A recomputing layer drops its saved tensors once the next layer has
                // read its output (the last layer at once).
                if (l > 0 && layers_[l - 1]->policy == kRecompute) r->saved[l - 1][j].Reset();
                if (l == L - 1) {
                  if (layers_[l]->policy == kRecompute) r->saved[l][j].Reset();
                  TANDEM_RETURN_IF_ERROR(r->side.ToHost(shared->losses.data() + r->mb_start[j],
                                                        r->out[l][j].data(), n * 4));
                }
                return absl::OkStatus();
              });
      // Offload layer l-1 now that layer l has read its output.
      if (on_accel && l > 0 && layers_[l - 1]->policy == kOffload) {
        const int p = l - 1;
        const int64_t bytes = layers_[p]->layer->OutputBytes(r->mb_size[j]) +
                              layers_[p]->layer->SavedBytes(r->mb_size[j]);
        offloaded[{p, j}] =
            Add(it, kD2H, tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H, p, j, bytes, {program.back()},
                [this, r, p, j]() -> absl::Status {
                  for (auto [dst, src] : {std::make_pair(&r->host_out[p][j], &r->out[p][j]),
                                          std::make_pair(&r->host_saved[p][j], &r->saved[p][j])}) {
                    if (src->empty()) continue;
                    TANDEM_ASSIGN_OR_RETURN(*dst,
                                            Buffer::Allocate(options_.host_allocator, src->bytes(),
                                                             MemoryCategory::kActivations));
                    TANDEM_RETURN_IF_ERROR(r->side.ToHost(dst->data(), src->data(), src->bytes()));
                    src->Reset();
                  }
                  return absl::OkStatus();
                });
      }
    }
    // ---- Backward of micro-batch j; after the last, each layer's update ----
    for (int l = L - 1; l >= 0; --l) {
      Layer& layer = *layers_[l];
      std::vector<SpanId> deps;
      // The gradient buffer must have been read out by the previous step.
      if (j == 0 && on_accel) deps.push_back(layer.grads_free);
      for (SpanId s : {restore(l, j), restore(l - 1, j)}) {
        if (s != 0) deps.push_back(s);
      }
      if (on_accel && layer.streamed && layer.has_params)
        deps.push_back(stream_weights(l, j, true, {}));
      if (layer.policy == kRecompute) {
        compute(tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, j, deps,
                [run_forward, l, j]() { return run_forward(l, j, /*recompute=*/true); });
        deps.clear();
      }
      const SpanId bwd = compute(
          tandem::v1::TIMELINE_PHASE_BACKWARD, l, j, deps,
          [this, shared, r, on_accel, weights, context, sample, B, l, j, L]() -> absl::Status {
            Layer& layer = *layers_[l];
            const tandem::Layer& impl = *layer.layer;
            const int64_t n = r->mb_size[j];
            Allocator* alloc = r->side.alloc;
            if (on_accel && layer.has_params && layer.grads.empty()) {
              TANDEM_ASSIGN_OR_RETURN(layer.grads, Buffer::Allocate(alloc, layer.param_elements * 4,
                                                                    MemoryCategory::kGradients));
              TANDEM_RETURN_IF_ERROR(r->side.Fill(layer.grads.f32(), 0.0f, layer.param_elements));
            }
            if (l == L - 1) {
              // d(mean loss)/d(per-sample loss) = 1 / (whole batch).
              TANDEM_ASSIGN_OR_RETURN(r->grad[l][j],
                                      Buffer::Allocate(alloc, n * 4, MemoryCategory::kActivations));
              TANDEM_RETURN_IF_ERROR(
                  r->side.Fill(r->grad[l][j].f32(), 1.0f / static_cast<float>(B), n));
            }
            Buffer dx;
            if (l > 0) {
              TANDEM_ASSIGN_OR_RETURN(dx,
                                      Buffer::Allocate(alloc, impl.input_shape().elements() * n * 4,
                                                       MemoryCategory::kActivations));
            }
            TANDEM_ASSIGN_OR_RETURN(Buffer ws, Buffer::Allocate(alloc, impl.WorkspaceBytes(n),
                                                                MemoryCategory::kWorkspace));
            LayerContext ctx = context(l, j, /*training=*/true);
            ctx.params = weights(l, j, true);
            ctx.grads = on_accel ? layer.grads.f32() : r->host_grads + layer.param_offset;
            ctx.workspace = ws.data();
            const Tensor x =
                l == 0 ? Tensor(r->x[j].data(), shared->input->input_dtype, sample.WithBatch(n))
                       : Tensor::F32(r->out[l - 1][j].f32(), impl.input_shape().WithBatch(n));
            const Tensor y = Tensor::F32(r->out[l][j].f32(), impl.output_shape().WithBatch(n));
            const Tensor dy = Tensor::F32(r->grad[l][j].f32(), impl.output_shape().WithBatch(n));
            const Tensor dxt =
                l == 0 ? Tensor() : Tensor::F32(dx.f32(), impl.input_shape().WithBatch(n));
            impl.Backward(ctx, x, y, r->saved[l][j].data(), dy, dxt);
            TANDEM_RETURN_IF_ERROR(r->side.Finish());
            // This layer's activations and incoming gradient are done with.
            r->out[l][j].Reset();
            r->saved[l][j].Reset();
            r->grad[l][j].Reset();
            if (l > 0) r->grad[l - 1][j] = std::move(dx);
            if (l == 0) {
              r->x[j].Reset();
              r->targets[j].Reset();
            }
            if (layer.streamed) r->bwd_weights[l][j].Reset();
            return absl::OkStatus();
          });
      if (j == M - 1) last_backward_[&rep == &it.accel ? 0 : 1][l] = bwd;
      if (!updates || j != M - 1 || !layer.has_params) continue;

      // ---- This layer's update ----
      if (!on_accel) {
        // Host compute: the host update pool steps the layer.
        if (clip) {
          deferred_host_compute_updates.push_back(l);
        } else {
          layer.weights_ready = Add(
              it, kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, layer.param_elements * 4,
              {bwd}, [this, shared, r, l]() { return HostUpdate(*shared, l, r->host_grads); });
        }
        continue;
      }
      if (layer.accel_update) {
        if (clip) {
          deferred_accel_updates.push_back(l);
        } else {
          layer.weights_ready =
              compute(tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, {},
                      [this, shared, l]() { return AcceleratorUpdate(*shared, l); });
          layer.grads_free = layer.weights_ready;
        }
        continue;
      }
      // CPU update: the gradient goes down, the CPU steps, the weights come back.
      const int64_t bytes = layer.param_elements * 4;
      if (dpu && layer.dpu_pending_update != 0) {
        // The previous step's update comes back now that this step's backward
        // no longer reads the weights: the next forward uses weights one update old.
        layer.dpu_ready =
            Add(it, kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, -1, bytes,
                {layer.dpu_pending_update, bwd}, [this, l, bytes]() {
                  return accel_->CopyToDevice(layers_[l]->params.data(),
                                              host_params_.f32() + layers_[l]->param_offset, bytes);
                });
      }
      std::vector<SpanId> d2h_deps = {bwd};
      // Delayed: the previous update may still read the host gradient.
      if (dpu) d2h_deps.push_back(layer.dpu_pending_update);
      const SpanId d2h =
          Add(it, kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H, l, -1, bytes, d2h_deps,
              [this, l, bytes]() -> absl::Status {
                Layer& layer = *layers_[l];
                TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host_grads_.f32() + layer.param_offset,
                                                          layer.grads.data(), bytes));
                layer.grads.Reset();
                return absl::OkStatus();
              });
      d2h_spans.push_back(d2h);
      layer.grads_free = d2h;
      if (clip) {
        deferred_host_updates.push_back({l, d2h});
        continue;
      }
      EmitHostUpdate(shared, l, {d2h, dpu ? layer.dpu_ready : 0});
    }
  }
  if (updates && clip) {
    // The global norm needs every gradient: all backward done and every CPU-bound
    // gradient on the host. Then the updates; accelerator ones in program order.
    const SpanId norm = compute(tandem::v1::TIMELINE_PHASE_UPDATE, -1, -1, d2h_spans,
                                [this, shared]() { return ClipNorm(*shared); });
    for (int l : deferred_accel_updates) {
      layers_[l]->weights_ready =
          compute(tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, {},
                  [this, shared, l]() { return AcceleratorUpdate(*shared, l); });
      layers_[l]->grads_free = layers_[l]->weights_ready;
    }
    for (auto& [l, d2h] : deferred_host_updates) {
      EmitHostUpdate(shared, l, {d2h, norm, dpu ? layers_[l]->dpu_ready : 0});
    }
    for (int l : deferred_host_compute_updates) {
      layers_[l]->weights_ready = Add(
          it, kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, layers_[l]->param_elements * 4,
          {norm}, [this, shared, r, l]() { return HostUpdate(*shared, l, r->host_grads); });
    }
  }
  if (on_accel) {
    last_accel_compute_ = program.back();
  } else {
    last_host_compute_ = program.back();
  }
  last_spans_.push_back(program.back());
}

void PlanExecutor::EmitHostUpdate(const std::shared_ptr<Iteration>& shared, int l,
                                  std::vector<SpanId> deps) {
  Iteration& it = *shared;
  Layer& layer = *layers_[l];
  const bool dpu = options_.plan.delayed_parameter_update();
  const int64_t bytes = layer.param_elements * 4;
  const SpanId upd =
      Add(it, kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, bytes, std::move(deps),
          [this, shared, l]() { return HostUpdate(*shared, l, host_grads_.f32()); });
  if (layer.streamed) {
    // The next forward's weight copy brings the update; no separate copy back.
    layer.weights_ready = upd;
  } else if (dpu) {
    layer.dpu_pending_update = upd;
  } else {
    layer.weights_ready =
        Add(it, kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, -1, bytes, {upd},
            [this, l, bytes]() {
              return accel_->CopyToDevice(layers_[l]->params.data(),
                                          host_params_.f32() + layers_[l]->param_offset, bytes);
            });
  }
}

absl::Status PlanExecutor::HostUpdate(const Iteration& it, int l, float* grads) {
  const Layer& layer = *layers_[l];
  StepConstants s = it.step;
  s.adam.grad_scale = s.sgd.grad_scale = it.grad_scale;
  std::vector<float*> states;
  for (Buffer& m : host_moments_) states.push_back(m.f32() + layer.param_offset);
  Optimizer::UpdateSlice(s, host_params_.f32() + layer.param_offset, grads + layer.param_offset,
                         states.data(), layer.param_elements);
  return absl::OkStatus();
}

absl::Status PlanExecutor::AcceleratorUpdate(const Iteration& it, int l) {
  Layer& layer = *layers_[l];
  StepConstants s = it.step;
  s.adam.grad_scale = s.sgd.grad_scale = it.grad_scale;
  std::vector<float*> states;
  for (Buffer& m : layer.moments) states.push_back(m.f32());
  TANDEM_RETURN_IF_ERROR(accel_->UpdateSlice(s, layer.params.f32(), layer.grads.f32(),
                                             states.data(), layer.param_elements));
  TANDEM_RETURN_IF_ERROR(accel_->FinishCompute());
  layer.grads.Reset();
  return absl::OkStatus();
}

absl::Status PlanExecutor::ClipNorm(Iteration& it) {
  double sum = 0;
  for (auto& layer : layers_) {
    if (!layer->has_params) continue;
    if (layer->accel_compute && layer->accel_update) {
      TANDEM_ASSIGN_OR_RETURN(const double s,
                              accel_->SumOfSquares(layer->grads.f32(), layer->param_elements));
      sum += s;
    } else {
      sum += optim::SumOfSquares(host_grads_.f32() + layer->param_offset, layer->param_elements);
    }
  }
  it.grad_norm = std::sqrt(sum);
  it.grad_scale = Optimizer::ClipScale(it.grad_norm, options_.optimizer.max_grad_norm());
  return absl::OkStatus();
}

void PlanExecutor::BuildGradientSync(const std::shared_ptr<Iteration>& shared) {
  Iteration& it = *shared;
  const int L = model_.num_layers();
  const bool clip = options_.optimizer.max_grad_norm() > 0;
  // Per layer, L-1 first: the accelerator's gradient comes down, the two are
  // added on the host (each replica's gradient already carries 1/batch), the sum
  // goes back, and both replicas step with it.
  std::vector<SpanId> sums(L, 0), ups(L, 0);
  std::vector<int> order;
  for (int l = L - 1; l >= 0; --l) {
    if (layers_[l]->has_params) order.push_back(l);
  }
  SpanId norm = 0;
  for (int l : order) {
    Layer& layer = *layers_[l];
    const int64_t bytes = layer.param_elements * 4;
    // host_grads_ is also what the previous step's host-replica update read:
    // overwrite it only once that update is done.
    const SpanId down =
        Add(it, kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, -1, bytes,
            {last_backward_[0][l], layer.host_weights_ready}, [this, l, bytes]() {
              return accel_->CopyToHost(host_grads_.f32() + layers_[l]->param_offset,
                                        layers_[l]->grads.data(), bytes);
            });
    sums[l] = Add(it, kHostUpdate, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, -1, bytes,
                  {down, last_backward_[1][l]}, [this, l]() {
                    const Layer& layer = *layers_[l];
                    float* a = host_grads_.f32() + layer.param_offset;
                    const float* h = host_replica_grads_.f32() + layer.param_offset;
                    for (int64_t i = 0; i < layer.param_elements; ++i) a[i] += h[i];
                    return absl::OkStatus();
                  });
    ups[l] = Add(it, kH2D, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, -1, bytes, {sums[l]},
                 [this, l, bytes]() {
                   return accel_->CopyToDevice(layers_[l]->grads.data(),
                                               host_grads_.f32() + layers_[l]->param_offset, bytes);
                 });
  }
  if (clip) {
    std::vector<SpanId> all(sums.begin(), sums.end());
    norm =
        Add(it, kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, -1, -1, 0, all, [this, shared]() {
          Iteration& it = *shared;
          double sum = 0;
          for (auto& layer : layers_) {
            if (layer->has_params)
              sum += optim::SumOfSquares(host_grads_.f32() + layer->param_offset,
                                         layer->param_elements);
          }
          it.grad_norm = std::sqrt(sum);
          it.grad_scale = Optimizer::ClipScale(it.grad_norm, options_.optimizer.max_grad_norm());
          return absl::OkStatus();
        });
  }
  SpanId program = last_accel_compute_;
  for (int l : order) {
    Layer& layer = *layers_[l];
    // The host replica steps with the summed gradient.
    layer.host_weights_ready = Add(
        it, kHostUpdate, tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, layer.param_elements * 4,
        {sums[l], norm}, [this, shared, l]() { return HostUpdate(*shared, l, host_grads_.f32()); });
    // The accelerator replica, in program order after its backward.
    program =
        Add(it, kAccel, tandem::v1::TIMELINE_PHASE_UPDATE, l, -1, layer.param_elements * 4,
            {program, ups[l], norm}, [this, shared, l]() { return AcceleratorUpdate(*shared, l); });
    layer.grads_free = program;
  }
  last_accel_compute_ = program;
  last_spans_ = {last_accel_compute_, last_host_compute_};
}

absl::StatusOr<EvalResult> PlanExecutor::EvalBatch(const Batch& batch) {
  TANDEM_RETURN_IF_ERROR(Drain());
  const int L = model_.num_layers();
  const Shape& sample = model_.data().sample_shape;
  const bool on_accel = !host_only_ && !hetero_;
  Side side = on_accel ? Side{accel_, device_alloc_.get(), kAccel}
                       : Side{nullptr, options_.host_allocator, kHostCompute};
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
      Buffer streamed;
      LayerContext ctx = side.Context();
      ctx.training = false;
      ctx.workspace = ws.data();
      ctx.targets = reinterpret_cast<const int32_t*>(targets.data());
      if (on_accel) {
        ctx.buffers = layer.buffers.f32();
        if (layer.streamed && layer.param_elements > 0) {
          TANDEM_ASSIGN_OR_RETURN(streamed, Buffer::Allocate(side.alloc, layer.param_elements * 4,
                                                             MemoryCategory::kParameters));
          TANDEM_RETURN_IF_ERROR(side.FromHost(
              streamed.data(), host_params_.f32() + layer.param_offset, layer.param_elements * 4));
          ctx.params = streamed.f32();
        } else {
          ctx.params = layer.params.f32();
        }
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
    // hetero_dp's host replica already holds the same weights and moments.
    if (hetero_ || !layer->accel_update || layer->param_elements == 0) continue;
    TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host_params_.f32() + layer->param_offset,
                                              layer->params.data(), layer->param_elements * 4));
    for (size_t s = 0; s < layer->moments.size(); ++s) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host_moments_.at(s).f32() + layer->param_offset,
                                                layer->moments[s].data(),
                                                layer->param_elements * 4));
    }
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::StateChangedOnHost() {
  TANDEM_RETURN_IF_ERROR(Drain());
  // The optimizer's step counter was set through host_state().optimizer.
  if (host_only_) return absl::OkStatus();
  for (auto& layer : layers_) {
    if (layer->buffer_elements > 0) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->buffers.data(),
                                                  host_buffers_.f32() + layer->buffer_offset,
                                                  layer->buffer_elements * 4));
    }
    if (layer->streamed || layer->param_elements == 0) continue;
    TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(
        layer->params.data(), host_params_.f32() + layer->param_offset, layer->param_elements * 4));
    for (size_t s = 0; s < layer->moments.size(); ++s) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(layer->moments[s].data(),
                                                  host_moments_.at(s).f32() + layer->param_offset,
                                                  layer->param_elements * 4));
    }
  }
  return absl::OkStatus();
}

HostStateView PlanExecutor::host_state() {
  HostStateView v;
  v.params = host_params_.f32();
  v.buffers = host_buffers_.f32();
  for (Buffer& m : host_moments_) v.moments.push_back(m.f32());
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
    batch.pinned_host_bytes = accel_->host_staging_allocator()->stats().total_in_use_bytes;
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

}  // namespace tandem
