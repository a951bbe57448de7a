// What each operation of a step's schedule does to the tensors (the spans'
// work): forward, recompute and backward of a layer for a micro-batch on a
// replica, the copies of weights, gradients and activations, the updates, the
// gradient average and norm. The order they run in is step_program.cc's.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/exec/executor_state.h"
#include "runtime/layers/device_ops.h"
#include "runtime/optim/kernels.h"

namespace tandem {
namespace {

using schedule::Op;
using schedule::OpKind;

// The dropout stream of (step, layer), as the CPU engine draws it.
uint64_t RngStream(int64_t step, int layer) {
  return MixStream(0xd209, static_cast<uint64_t>(step), static_cast<uint64_t>(layer));
}

}  // namespace

std::function<absl::Status()> PlanExecutor::Work(const std::shared_ptr<Iteration>& shared, int o) {
  return [this, shared, o]() -> absl::Status {
    Iteration& it = *shared;
    const Op& op = it.schedule->ops[o];
    switch (op.kind) {
      case OpKind::kForward:
        return Forward(it, it.ReplicaOf(op), o, /*recompute=*/false);
      case OpKind::kRecompute:
        return Forward(it, it.ReplicaOf(op), o, /*recompute=*/true);
      case OpKind::kBackward:
        return Backward(it, it.ReplicaOf(op), o);
      case OpKind::kUpdate:
        return it.schedule->resources[op.resource].kind ==
                       tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE
                   ? AcceleratorUpdate(it, op.layer)
                   : HostUpdate(it, op.layer);
      case OpKind::kCopy:
        return Copy(it, o);
      case OpKind::kGradientAverage:
        return AverageGradients(op.layer);
      case OpKind::kGradientNorm:
        return ClipNorm(it);
      case OpKind::kAllReduce:
        return AllReduceBucket(it, o);
      case OpKind::kReduceScatter:
        return ReduceScatterBucket(op.layer);
      case OpKind::kAllGather:
        return GatherBucket(op.layer);
      default:
        return absl::UnimplementedError(
            absl::StrCat("no work for ", schedule::OpKindName(op.kind), " operations"));
    }
  };
}

void* PlanExecutor::WeightsOf(Iteration& it, const Replica& r, int o) {
  const Op& op = it.schedule->ops[o];
  Layer& layer = *layers_[op.layer];
  if (r.side.dev == nullptr) return host_params_.f32() + layer.param_offset;
  if (!layer.streamed) return layer.params.data();
  // A streamed layer reads the weights of the copy the schedule feeds it from.
  for (const schedule::Dep& d : op.deps) {
    const Op& from = it.schedule->ops[d.op];
    if (d.lag == 0 && from.kind == OpKind::kCopy && from.tensor == schedule::TensorKind::kWeights &&
        from.layer == op.layer) {
      return it.streamed[d.op].data();
    }
  }
  return nullptr;
}

absl::StatusOr<const float*> PlanExecutor::ComputeWeights(const Side& side, const Layer& layer,
                                                          void* weights, Buffer& widened) {
  if (side.dev == nullptr || !layer.working_copy) return static_cast<const float*>(weights);
  TANDEM_ASSIGN_OR_RETURN(
      widened, Buffer::Allocate(side.alloc, layer.param_elements * 4, MemoryCategory::kWorkspace));
  device_ops::FromBf16(side.Context(), static_cast<const uint16_t*>(weights), widened.f32(),
                       layer.param_elements);
  return widened.f32();
}

absl::StatusOr<const float*> PlanExecutor::Fp32Gradient(const Layer& layer, Buffer& widened) {
  if (!layer.working_copy) return static_cast<const float*>(layer.grads.f32());
  TANDEM_ASSIGN_OR_RETURN(widened, Buffer::Allocate(device_alloc_.get(), layer.param_elements * 4,
                                                    MemoryCategory::kWorkspace));
  device_ops::FromBf16(accel_->ComputeContext(), layer.grads.bf16(), widened.f32(),
                       layer.param_elements);
  return static_cast<const float*>(widened.f32());
}

LayerContext PlanExecutor::ContextOf(const Iteration& it, const Replica& r, int l, int j) const {
  const Layer& layer = *layers_[l];
  LayerContext ctx = r.side.Context();
  ctx.training = true;
  ctx.seed = it.options.seed;
  ctx.rng_stream = RngStream(it.options.step, l);
  // A data-parallel rank's share starts at sample_offset of the global batch.
  ctx.sample_offset = static_cast<uint64_t>(it.options.sample_offset + r.mb_start[j]);
  ctx.accumulate_grads = j > 0;
  ctx.buffers =
      r.side.dev != nullptr
          ? layer.buffers.f32()
          : (layer.buffer_elements > 0 ? host_buffers_.f32() + layer.buffer_offset : nullptr);
  // Gradients are set by the backward alone: a forward runs while the
  // previous step's gradient copy may still be releasing layer.grads.
  ctx.targets = reinterpret_cast<const int32_t*>(r.targets[j].data());
  return ctx;
}

absl::Status PlanExecutor::LoadInputs(Iteration& it, Replica& r, int j) {
  const Shape& sample = model_.data().sample_shape;
  const int64_t n = r.mb_size[j];
  const int64_t elem = DTypeBytes(it.input->input_dtype);
  const int64_t in_bytes = n * sample.elements() * elem;
  const int64_t tps = model_.data().targets_per_sample;
  TANDEM_ASSIGN_OR_RETURN(r.x[j],
                          Buffer::Allocate(r.side.alloc, in_bytes, MemoryCategory::kActivations));
  TANDEM_ASSIGN_OR_RETURN(
      r.targets[j], Buffer::Allocate(r.side.alloc, n * tps * 4, MemoryCategory::kActivations));
  const char* src = reinterpret_cast<const char*>(it.input->inputs.data());
  TANDEM_RETURN_IF_ERROR(
      r.side.FromHost(r.x[j].data(), src + r.mb_start[j] * sample.elements() * elem, in_bytes));
  return r.side.FromHost(r.targets[j].data(), it.input->targets.data() + r.mb_start[j] * tps,
                         n * tps * 4);
}

absl::Status PlanExecutor::Forward(Iteration& it, Replica& r, int o, bool recompute) {
  const Op& op = it.schedule->ops[o];
  const int l = op.layer, j = op.micro_batch, L = model_.num_layers();
  const tandem::Layer& impl = *layers_[l]->layer;
  const int64_t n = r.mb_size[j];
  if (l == 0 && !recompute) TANDEM_RETURN_IF_ERROR(LoadInputs(it, r, j));
  Buffer& out = r.out[l][j];
  Buffer& saved = r.saved[l][j];
  if (out.empty()) {
    TANDEM_ASSIGN_OR_RETURN(
        out, Buffer::Allocate(r.side.alloc, impl.OutputBytes(n), MemoryCategory::kActivations));
  }
  if (saved.empty() && impl.SavedBytes(n) > 0) {
    TANDEM_ASSIGN_OR_RETURN(
        saved, Buffer::Allocate(r.side.alloc, impl.SavedBytes(n), MemoryCategory::kActivations));
  }
  TANDEM_ASSIGN_OR_RETURN(Buffer ws, Buffer::Allocate(r.side.alloc, impl.WorkspaceBytes(n),
                                                      MemoryCategory::kWorkspace));
  LayerContext ctx = ContextOf(it, r, l, j);
  Buffer widened;
  TANDEM_ASSIGN_OR_RETURN(ctx.params,
                          ComputeWeights(r.side, *layers_[l], WeightsOf(it, r, o), widened));
  ctx.workspace = ws.data();
  ctx.recompute = recompute;
  const Shape& sample = model_.data().sample_shape;
  const Tensor x = l == 0 ? Tensor(r.x[j].data(), it.input->input_dtype, sample.WithBatch(n))
                          : Tensor::F32(r.out[l - 1][j].f32(), impl.input_shape().WithBatch(n));
  impl.Forward(ctx, x, Tensor::F32(out.f32(), impl.output_shape().WithBatch(n)), saved.data());
  TANDEM_RETURN_IF_ERROR(r.side.Finish());
  if (recompute) return absl::OkStatus();
  // Streamed weights are freed when the forward ends.
  for (const schedule::Dep& d : op.deps) {
    if (d.lag == 0 && it.schedule->ops[d.op].tensor == schedule::TensorKind::kWeights)
      it.streamed[d.op].Reset();
  }
  // A layer the schedule recomputes drops its saved tensors once the next
  // layer has read its output (the last layer at once).
  const std::vector<bool>& recomputes = it.schedule->recomputes[op.replica];
  if (l > 0 && recomputes[l - 1]) r.saved[l - 1][j].Reset();
  if (l == L - 1) {
    if (recomputes[l]) saved.Reset();
    TANDEM_RETURN_IF_ERROR(r.side.ToHost(it.losses.data() + r.mb_start[j], out.data(), n * 4));
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::Backward(Iteration& it, Replica& r, int o) {
  const Op& op = it.schedule->ops[o];
  const int l = op.layer, j = op.micro_batch, L = model_.num_layers();
  Layer& layer = *layers_[l];
  const tandem::Layer& impl = *layer.layer;
  const int64_t n = r.mb_size[j];
  const bool on_accel = r.side.dev != nullptr;
  Allocator* alloc = r.side.alloc;
  if (on_accel && layer.has_params && layer.grads.empty()) {
    TANDEM_ASSIGN_OR_RETURN(
        layer.grads, Buffer::Allocate(alloc, layer.state_bytes(), MemoryCategory::kGradients));
    // A working copy's first backward writes its bf16 gradient whole.
    if (!layer.working_copy)
      TANDEM_RETURN_IF_ERROR(r.side.Fill(layer.grads.f32(), 0.0f, layer.param_elements));
  }
  if (l == L - 1) {
    // d(mean loss)/d(per-sample loss) = 1 / (whole batch): a data-parallel
    // rank's share carries 1 / (global batch), so the ranks' sum is the mean.
    const int64_t whole = it.options.global_batch > 0 ? it.options.global_batch : it.batch;
    TANDEM_ASSIGN_OR_RETURN(r.grad[l][j],
                            Buffer::Allocate(alloc, n * 4, MemoryCategory::kActivations));
    const float scale = it.options.loss_scale > 0 ? it.options.loss_scale : 1.0f;
    TANDEM_RETURN_IF_ERROR(r.side.Fill(r.grad[l][j].f32(), scale / static_cast<float>(whole), n));
  }
  Buffer dx;
  if (l > 0) {
    TANDEM_ASSIGN_OR_RETURN(dx, Buffer::Allocate(alloc, impl.input_shape().elements() * n * 4,
                                                 MemoryCategory::kActivations));
  }
  TANDEM_ASSIGN_OR_RETURN(
      Buffer ws, Buffer::Allocate(alloc, impl.WorkspaceBytes(n), MemoryCategory::kWorkspace));
  LayerContext ctx = ContextOf(it, r, l, j);
  Buffer widened, grad32;
  TANDEM_ASSIGN_OR_RETURN(ctx.params, ComputeWeights(r.side, layer, WeightsOf(it, r, o), widened));
  ctx.grads = on_accel ? layer.grads.f32() : r.host_grads + layer.param_offset;
  const bool round_gradient = on_accel && layer.working_copy;
  if (round_gradient) {
    // The layer accumulates in fp32: the bf16 gradient of the micro-batches
    // so far is widened into it, and the sum rounded back.
    TANDEM_ASSIGN_OR_RETURN(
        grad32, Buffer::Allocate(alloc, layer.param_elements * 4, MemoryCategory::kWorkspace));
    if (ctx.accumulate_grads)
      device_ops::FromBf16(ctx, layer.grads.bf16(), grad32.f32(), layer.param_elements);
    ctx.grads = grad32.f32();
  }
  ctx.workspace = ws.data();
  const Shape& sample = model_.data().sample_shape;
  const Tensor x = l == 0 ? Tensor(r.x[j].data(), it.input->input_dtype, sample.WithBatch(n))
                          : Tensor::F32(r.out[l - 1][j].f32(), impl.input_shape().WithBatch(n));
  const Tensor y = Tensor::F32(r.out[l][j].f32(), impl.output_shape().WithBatch(n));
  const Tensor dy = Tensor::F32(r.grad[l][j].f32(), impl.output_shape().WithBatch(n));
  const Tensor dxt = l == 0 ? Tensor() : Tensor::F32(dx.f32(), impl.input_shape().WithBatch(n));
  impl.Backward(ctx, x, y, r.saved[l][j].data(), dy, dxt);
  if (round_gradient)
    device_ops::ToBf16(ctx, grad32.f32(), layer.grads.bf16(), layer.param_elements);
  TANDEM_RETURN_IF_ERROR(r.side.Finish());
  // This layer's activations and incoming gradient are done with, and the
  // weights a streaming copy brought for it (and its recompute).
  r.out[l][j].Reset();
  r.saved[l][j].Reset();
  r.grad[l][j].Reset();
  if (l > 0) r.grad[l - 1][j] = std::move(dx);
  if (l == 0) {
    r.x[j].Reset();
    r.targets[j].Reset();
  }
  for (const schedule::Dep& d : op.deps) {
    if (d.lag == 0 && it.schedule->ops[d.op].tensor == schedule::TensorKind::kWeights)
      it.streamed[d.op].Reset();
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::MoveActivations(Replica& r, int l, int j, bool to_host) {
  // An offloaded layer's backward reads its input and saved tensors; its
  // output is the next layer's input and goes (or stays) with that layer.
  for (auto [device, host] : {std::make_pair(&r.Input(l, j), &r.host_in[l][j]),
                              std::make_pair(&r.saved[l][j], &r.host_saved[l][j])}) {
    Buffer* src = to_host ? device : host;
    Buffer* dst = to_host ? host : device;
    if (src->empty()) continue;
    TANDEM_ASSIGN_OR_RETURN(*dst, Buffer::Allocate(to_host ? options_.host_allocator : r.side.alloc,
                                                   src->bytes(), MemoryCategory::kActivations));
    TANDEM_RETURN_IF_ERROR(to_host ? r.side.ToHost(dst->data(), src->data(), src->bytes())
                                   : r.side.FromHost(dst->data(), src->data(), src->bytes()));
    src->Reset();
  }
  return absl::OkStatus();
}

absl::Status PlanExecutor::Copy(Iteration& it, int o) {
  const Op& op = it.schedule->ops[o];
  const int l = op.layer;
  Layer& layer = *layers_[l];
  const int64_t bytes = layer.param_elements * 4;
  const void* host_weights = HostWeights(layer);
  float* host_grads = host_grads_.f32() + layer.param_offset;
  const bool down =
      it.schedule->resources[op.resource].kind == tandem::v1::TIMELINE_RESOURCE_COPY_D2H;
  switch (op.phase) {
    case tandem::v1::TIMELINE_PHASE_PARAMETER_H2D: {
      const int64_t copied = layer.state_bytes();
      if (!layer.streamed) return accel_->CopyToDevice(layer.params.data(), host_weights, copied);
      TANDEM_ASSIGN_OR_RETURN(it.streamed[o], Buffer::Allocate(device_alloc_.get(), copied,
                                                               MemoryCategory::kParameters));
      return accel_->CopyToDevice(it.streamed[o].data(), host_weights, copied);
    }
    case tandem::v1::TIMELINE_PHASE_GRADIENT_D2H: {
      void* to = layer.working_copy ? static_cast<void*>(host_grads16_.bf16() + layer.param_offset)
                                    : host_grads;
      TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(to, layer.grads.data(), layer.state_bytes()));
      layer.grads.Reset();
      return absl::OkStatus();
    }
    case tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H:
    case tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D:
      return MoveActivations(it.accel, l, op.micro_batch, down);
    case tandem::v1::TIMELINE_PHASE_STATE_H2D:
    case tandem::v1::TIMELINE_PHASE_STATE_D2H:
      return MoveState(layer, down);
    case tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC:
      // hetero_dp: the accelerator's gradient down to be summed, the sum back.
      return down ? accel_->CopyToHost(host_grads, layer.grads.data(), bytes)
                  : accel_->CopyToDevice(layer.grads.data(), host_grads, bytes);
    default:
      return absl::InternalError(
          absl::StrCat("no copy for phase ", tandem::v1::TimelinePhase_Name(op.phase)));
  }
}

absl::Status PlanExecutor::MoveState(Layer& layer, bool to_host) {
  // The moments, then a working copy's fp32 master weights: the host's
  // copies at the layer's offset in the flat buffers.
  const int64_t n = layer.param_elements;
  std::vector<std::pair<Buffer*, float*>> tensors;
  if (!to_host) layer.moments.resize(host_moments_.size());
  for (size_t s = 0; s < host_moments_.size(); ++s) {
    tensors.push_back({&layer.moments[s], host_moments_[s].f32() + layer.moment_offset});
  }
  // (Streamed state is the accelerator's update: never partitioned, so the
  // rank keeps the whole layer's masters.)
  if (layer.working_copy) tensors.push_back({&layer.master, MasterOf(layer)});
  for (auto [device, host] : tensors) {
    if (to_host) {
      TANDEM_RETURN_IF_ERROR(accel_->CopyToHost(host, device->data(), n * 4));
      device->Reset();
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(
        *device, Buffer::Allocate(device_alloc_.get(), n * 4, MemoryCategory::kOptimizerState));
    TANDEM_RETURN_IF_ERROR(accel_->CopyToDevice(device->data(), host, n * 4));
  }
  if (to_host) layer.moments.clear();
  return absl::OkStatus();
}

absl::Status PlanExecutor::HostUpdate(const Iteration& it, int l) {
  const Layer& layer = *layers_[l];
  if (it.grad_scale == 0) return absl::OkStatus();  // an overflow: the step is skipped
  StepConstants s = it.step;
  s.adam.grad_scale = s.sgd.grad_scale = it.grad_scale;
  // The weights whose state the host keeps: the layer's, or under
  // partitioned host state its part in this rank's piece of the bucket.
  const int64_t at = layer.moment_first, n = layer.moment_elements;
  std::vector<float*> states;
  for (Buffer& m : host_moments_) states.push_back(m.f32() + layer.moment_offset);
  float* params = MasterOf(layer);
  float* grads = host_grads_.f32() + at;
  if (!layer.working_copy) {
    // cpu_only's backward, the accelerator's gradient copy and hetero_dp's
    // average all leave the gradient to step with in the host gradients.
    Optimizer::UpdateSlice(s, params, grads, states.data(), n);
    return absl::OkStatus();
  }
  uint16_t* copy = host_copy_.bf16() + at;
  if (options_.collective != nullptr) {
    // The ranks summed the gradient widened to fp32 (AllReduceBucket,
    // ReduceScatterBucket); a partitioned layer's rounded share goes to the
    // other ranks with its bucket's gather (GatherBucket).
    Optimizer::UpdateSlice(s, params, grads, states.data(), n);
    cpu::ToBf16(params, copy, n);
    return absl::OkStatus();
  }
  // The bf16 gradient that came down; the working copy the next H2D takes up.
  Optimizer::UpdateSliceBf16(s, params, host_grads16_.bf16() + at, states.data(), copy, grads, n);
  return absl::OkStatus();
}

absl::Status PlanExecutor::AcceleratorUpdate(const Iteration& it, int l) {
  Layer& layer = *layers_[l];
  if (it.grad_scale == 0) {  // an overflow: the step is skipped
    layer.grads.Reset();
    return absl::OkStatus();
  }
  StepConstants s = it.step;
  s.adam.grad_scale = s.sgd.grad_scale = it.grad_scale;
  std::vector<float*> states;
  for (Buffer& m : layer.moments) states.push_back(m.f32());
  // Streamed state of a working copy: the fp32 master steps, and the working
  // copy is rounded from it.
  const int64_t n = layer.param_elements;
  Buffer widened;
  TANDEM_ASSIGN_OR_RETURN(const float* grads, Fp32Gradient(layer, widened));
  float* weights = layer.working_copy ? layer.master.f32() : layer.params.f32();
  TANDEM_RETURN_IF_ERROR(accel_->UpdateSlice(s, weights, grads, states.data(), n));
  if (layer.working_copy) {
    device_ops::ToBf16(accel_->ComputeContext(), weights, layer.params.bf16(), n);
  }
  TANDEM_RETURN_IF_ERROR(accel_->FinishCompute());
  layer.grads.Reset();
  return absl::OkStatus();
}

absl::Status PlanExecutor::AverageGradients(int l) {
  // Each replica's gradient already carries 1/batch: their sum is the mean.
  const Layer& layer = *layers_[l];
  float* a = host_grads_.f32() + layer.param_offset;
  const float* h = host_replica_grads_.f32() + layer.param_offset;
  for (int64_t i = 0; i < layer.param_elements; ++i) a[i] += h[i];
  return absl::OkStatus();
}

absl::Status PlanExecutor::AllReduceBucket(const Iteration& it, int o) {
  const Op& op = it.schedule->ops[o];
  GradientCollective* collective = options_.collective;
  if (collective == nullptr) {
    return absl::FailedPreconditionError("an all-reduce in a step program without ranks");
  }
  const int low = op.layer, high = op.layer + op.bucket_layers;
  if (op.replica == schedule::kHostReplica) {
    // Host gradients lie in layer order in one buffer: the bucket is one
    // range, summed in fp32 (a working copy's bf16 gradient widened first).
    for (int l = low; l < high; ++l) WidenHostGradient(*layers_[l]);
    const int64_t begin = layers_[low]->param_offset;
    const int64_t end = layers_[high - 1]->param_offset + layers_[high - 1]->param_elements;
    return collective->AllReduceHost(host_grads_.f32() + begin, end - begin);
  }
  std::vector<GradientCollective::Range> ranges;
  for (int l = high - 1; l >= low; --l) {
    Layer& layer = *layers_[l];
    if (layer.has_params) ranges.push_back({layer.grads.f32(), layer.param_elements});
  }
  return collective->AllReduceDevice(accel_, ranges);
}

absl::Status PlanExecutor::ReduceScatterBucket(int low) {
  const HostBucket& b = host_buckets_.at(low);
  for (int l = low; l < low + b.layers; ++l) WidenHostGradient(*layers_[l]);
  return options_.collective->ReduceScatterHost(host_grads_.f32() + b.begin, b.pieces);
}

absl::Status PlanExecutor::GatherBucket(int low) {
  const HostBucket& b = host_buckets_.at(low);
  // Mixed precision: the bf16 working copies, each rank's share rounded by
  // its updates, as ZeRO-Offload gathers its fp16 weights; the fp32 masters
  // stay in pieces.
  if (partitioned_masters_) {
    return options_.collective->AllGatherHost(host_copy_.bf16() + b.begin, b.pieces);
  }
  return options_.collective->AllGatherHost(host_params_.f32() + b.begin, b.pieces);
}

void PlanExecutor::WidenHostGradient(const Layer& layer) {
  if (!layer.working_copy) return;
  cpu::FromBf16(host_grads16_.bf16() + layer.param_offset, host_grads_.f32() + layer.param_offset,
                layer.param_elements);
}

absl::Status PlanExecutor::ClipNorm(Iteration& it) {
  // Partitioned host state: the squares of this rank's pieces, summed over
  // the ranks below; every other gradient is whole on every rank.
  double sum = 0, pieces = 0;
  for (auto& layer : layers_) {
    if (!layer->has_params) continue;
    // hetero_dp's sums, and every gradient that came down, are on the host.
    if (!hetero_ && layer->accel_update) {
      Buffer widened;
      TANDEM_ASSIGN_OR_RETURN(const float* grads, Fp32Gradient(*layer, widened));
      TANDEM_ASSIGN_OR_RETURN(const double s, accel_->SumOfSquares(grads, layer->param_elements));
      sum += s;
    } else {
      // Ranks' buckets were widened and summed already.
      if (options_.collective == nullptr) WidenHostGradient(*layer);
      (layer->partitioned ? pieces : sum) +=
          optim::SumOfSquares(host_grads_.f32() + layer->moment_first, layer->moment_elements);
    }
  }
  if (partitioned_state_) {
    TANDEM_RETURN_IF_ERROR(options_.collective->SumOverRanks(&pieces, 1));
    sum += pieces;
  }
  // 0 when the loss-scaled gradients overflowed: every update is skipped.
  it.grad_scale = Optimizer::GradientScale(sum, it.options.loss_scale,
                                           options_.optimizer.max_grad_norm(), &it.grad_norm);
  if (it.grad_scale == 0 && it.options.loss_scale <= 0) {
    // Not an overflow that a smaller scale would avoid: the gradients diverged.
    return absl::FailedPreconditionError(
        absl::StrCat("the gradients' global norm is ", it.grad_norm,
                     ": training diverged; lower optimizer.learning_rate"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
