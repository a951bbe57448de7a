#include "runtime/profile/layer_profiler.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/core/random.h"
#include "runtime/profile/synthetic_inputs.h"
#include "runtime/profile/timing_stats.h"

namespace tandem::profile {
namespace {

using tandem::v1::LayerDeviceProfile;
using tandem::v1::LayerMemory;
using tandem::v1::LayerProfile;

constexpr unsigned char kCanary = 0xA5;

// Bytes of canary after the declared end of the output, saved and workspace
// regions. A layer gets its regions from the caller and never allocates, so no
// allocator sees what it uses; the scan does, and without room past the
// declaration a layer that writes more than it declares would corrupt its
// neighbour instead of being measured. Writes beyond the guard are still
// reported as reaching its end.
constexpr int64_t kGuardBytes = 4096;

int StateCount(const tandem::v1::OptimizerSpec& optimizer) {
  return Optimizer::Stateless(optimizer)->state_count();
}

// Bytes up to and including the last one that no longer holds the canary,
// rounded up to whole floats (a written float may share its last bytes with
// the pattern) but not past `declared` when the write ended inside it (byte
// data such as a pooling argmax may end off a float boundary).
int64_t WrittenHighWater(const std::vector<unsigned char>& bytes, int64_t declared) {
  for (int64_t i = static_cast<int64_t>(bytes.size()) - 1; i >= 0; --i) {
    if (bytes[i] != kCanary) {
      const int64_t rounded = std::min<int64_t>(bytes.size(), (i / 4 + 1) * 4);
      return i < declared ? std::min(rounded, declared) : rounded;
    }
  }
  return 0;
}

// A region the layer writes: its declared size, and the buffer of declared +
// kGuardBytes behind it.
struct Region {
  Buffer buffer;
  int64_t declared = 0;
};

// The layer's memory on the device (measured) and the neighbours' tensors it
// reads and writes (harness).
struct LayerBuffers {
  Buffer params, buffers, grads;
  Region output, saved, workspace;
  std::vector<Buffer> states;
  Buffer input, output_grad, input_grad, targets;
};

class LayerRun {
 public:
  LayerRun(const Model& model, int l, int64_t batch, const tandem::v1::OptimizerSpec& optimizer,
           const LayerProfilerOptions& options, ProfiledDevice& device)
      : model_(model),
        l_(l),
        layer_(model.layer(l)),
        batch_(batch),
        optimizer_spec_(optimizer),
        options_(options),
        device_(device) {}

  absl::Status Run(LayerDeviceProfile* out) {
    out->set_device_id(device_.id());
    measured_ = device_.NewAllocator();
    harness_ = device_.NewAllocator();
    TANDEM_RETURN_IF_ERROR(Allocate());
    TANDEM_RETURN_IF_ERROR(Initialize());

    TANDEM_RETURN_IF_ERROR(FillCanary(b_.output));
    TANDEM_RETURN_IF_ERROR(FillCanary(b_.saved));
    TANDEM_RETURN_IF_ERROR(FillCanary(b_.workspace));
    std::vector<double> wall;
    TANDEM_RETURN_IF_ERROR(Repeat(Phase::kForward, &wall, /*cold=*/false, [&] { Forward(); }));
    *out->mutable_forward()->mutable_timing() = SummarizeTimings(wall);
    TANDEM_ASSIGN_OR_RETURN(const int64_t output_written, Scan(b_.output));
    TANDEM_ASSIGN_OR_RETURN(const int64_t saved_written, Scan(b_.saved));
    TANDEM_ASSIGN_OR_RETURN(const int64_t workspace_forward, Scan(b_.workspace));
    AddScan(b_.saved, saved_written, "saved_bytes_written", out->mutable_forward());
    AddScan(b_.workspace, workspace_forward, "workspace_bytes_written", out->mutable_forward());

    TANDEM_RETURN_IF_ERROR(FillCanary(b_.workspace));
    TANDEM_RETURN_IF_ERROR(Repeat(Phase::kBackward, &wall, /*cold=*/false, [&] { Backward(); }));
    *out->mutable_backward()->mutable_timing() = SummarizeTimings(wall);
    TANDEM_ASSIGN_OR_RETURN(const int64_t workspace_backward, Scan(b_.workspace));
    AddScan(b_.workspace, workspace_backward, "workspace_bytes_written", out->mutable_backward());

    if (layer_.ParamCount() > 0) {
      std::unique_ptr<Optimizer> optimizer = Optimizer::Stateless(optimizer_spec_);
      std::vector<float*> states;
      for (const Buffer& s : b_.states) states.push_back(s.f32());
      absl::Status update_status;
      TANDEM_RETURN_IF_ERROR(Repeat(Phase::kUpdate, &wall, /*cold=*/true, [&] {
        const StepConstants& c = optimizer->BeginStep(1e-3f, 1.0f);
        absl::Status s = device_.UpdateSlice(c, b_.params.f32(), b_.grads.f32(), states.data(),
                                             model_.param_slice(l_));
        if (!s.ok() && update_status.ok()) update_status = s;
      }));
      TANDEM_RETURN_IF_ERROR(update_status);
      *out->mutable_update()->mutable_timing() = SummarizeTimings(wall);
    }

    // The state is what the model lays out for the layer: the allocator's
    // accounting of its padded slices. What the layer keeps for backward and
    // the scratch it uses are what its calls wrote: the output and saved bytes
    // forward left behind (the caller keeps both until backward), and the most
    // workspace either phase touched. These differ from the layer's
    // declarations (OutputBytes, SavedBytes, WorkspaceBytes) when it writes
    // less or more than it declares.
    const MemoryStats stats = measured_->stats();
    LayerMemory* m = out->mutable_measured_memory();
    m->set_parameter_bytes(stats.peak_bytes[static_cast<int>(MemoryCategory::kParameters)]);
    m->set_gradient_bytes(stats.peak_bytes[static_cast<int>(MemoryCategory::kGradients)]);
    m->set_optimizer_state_bytes(
        stats.peak_bytes[static_cast<int>(MemoryCategory::kOptimizerState)]);
    m->set_output_bytes(output_written);
    m->set_activation_bytes(output_written + saved_written);
    m->set_workspace_bytes(std::max(workspace_forward, workspace_backward));
    return device_.CollectLayer(l_, out);
  }

 private:
  absl::Status Allocate() {
    const int64_t B = batch_;
    const int64_t slice_bytes = model_.param_slice(l_) * 4;
    auto take = [](Allocator* a, int64_t bytes, MemoryCategory c, Buffer* out) -> absl::Status {
      TANDEM_ASSIGN_OR_RETURN(*out, Buffer::Allocate(a, bytes, c));
      return absl::OkStatus();
    };
    auto region = [](Allocator* a, int64_t declared, MemoryCategory c,
                     Region* out) -> absl::Status {
      out->declared = declared;
      TANDEM_ASSIGN_OR_RETURN(out->buffer, Buffer::Allocate(a, declared + kGuardBytes, c));
      return absl::OkStatus();
    };
    Allocator* m = measured_.get();
    TANDEM_RETURN_IF_ERROR(take(m, slice_bytes, MemoryCategory::kParameters, &b_.params));
    TANDEM_RETURN_IF_ERROR(
        take(m, model_.buffer_slice(l_) * 4, MemoryCategory::kParameters, &b_.buffers));
    TANDEM_RETURN_IF_ERROR(take(m, slice_bytes, MemoryCategory::kGradients, &b_.grads));
    if (layer_.ParamCount() > 0) {
      for (int i = 0; i < StateCount(optimizer_spec_); ++i) {
        b_.states.emplace_back();
        TANDEM_RETURN_IF_ERROR(
            take(m, slice_bytes, MemoryCategory::kOptimizerState, &b_.states.back()));
      }
    }
    TANDEM_RETURN_IF_ERROR(
        region(m, layer_.OutputBytes(B), MemoryCategory::kActivations, &b_.output));
    TANDEM_RETURN_IF_ERROR(
        region(m, layer_.SavedBytes(B), MemoryCategory::kActivations, &b_.saved));
    TANDEM_RETURN_IF_ERROR(
        region(m, layer_.WorkspaceBytes(B), MemoryCategory::kWorkspace, &b_.workspace));

    Allocator* h = harness_.get();
    const int64_t input_bytes =
        B * layer_.input_shape().elements() * DTypeBytes(layer_.input_dtype());
    TANDEM_RETURN_IF_ERROR(take(h, input_bytes, MemoryCategory::kActivations, &b_.input));
    TANDEM_RETURN_IF_ERROR(
        take(h, layer_.OutputBytes(B), MemoryCategory::kActivations, &b_.output_grad));
    // The first layer's input needs no gradient (as in training).
    if (l_ > 0) {
      TANDEM_RETURN_IF_ERROR(take(h, input_bytes, MemoryCategory::kActivations, &b_.input_grad));
    }
    const int64_t targets = B * model_.data().targets_per_sample;
    TANDEM_RETURN_IF_ERROR(take(h, targets * 4, MemoryCategory::kActivations, &b_.targets));
    return absl::OkStatus();
  }

  absl::Status Upload(const Buffer& to, const void* from) {
    return device_.CopyToDevice(to.data(), from, to.bytes());
  }

  absl::Status Initialize() {
    const uint64_t seed = options_.seed;
    const uint64_t stream = MixStream(0x9f0f, static_cast<uint64_t>(l_));
    std::vector<float> params(model_.param_slice(l_), 0.0f);
    std::vector<float> buffers(model_.buffer_slice(l_), 0.0f);
    layer_.Initialize(params.data(), buffers.empty() ? nullptr : buffers.data(), seed, stream);
    TANDEM_RETURN_IF_ERROR(Upload(b_.params, params.data()));
    TANDEM_RETURN_IF_ERROR(Upload(b_.buffers, buffers.data()));
    std::vector<float> zeros(model_.param_slice(l_), 0.0f);
    TANDEM_RETURN_IF_ERROR(Upload(b_.grads, zeros.data()));
    for (const Buffer& s : b_.states) TANDEM_RETURN_IF_ERROR(Upload(s, zeros.data()));

    const int64_t in = b_.input.bytes() / 4;
    std::vector<float> host(std::max<int64_t>(in, b_.output_grad.bytes() / 4));
    FillRandom(layer_.input_dtype(), model_.data().num_classes, host.data(), in, seed,
               MixStream(stream, 1));
    TANDEM_RETURN_IF_ERROR(Upload(b_.input, host.data()));
    const int64_t out = b_.output_grad.bytes() / 4;
    if (l_ == model_.num_layers() - 1) {
      // The loss's incoming gradient: d(mean loss)/d(per-sample loss).
      std::fill(host.begin(), host.begin() + out, 1.0f / static_cast<float>(batch_));
    } else {
      FillUniform(host.data(), out, -1e-2f, 1e-2f, seed, MixStream(stream, 2));
    }
    TANDEM_RETURN_IF_ERROR(Upload(b_.output_grad, host.data()));
    std::vector<int32_t> targets(b_.targets.bytes() / 4);
    FillRandom(DType::kI32, model_.data().num_classes, targets.data(),
               static_cast<int64_t>(targets.size()), seed, MixStream(stream, 3));
    return Upload(b_.targets, targets.data());
  }

  absl::Status FillCanary(const Region& region) {
    std::vector<unsigned char> canary(region.buffer.bytes(), kCanary);
    return Upload(region.buffer, canary.data());
  }

  // The bytes of `region` written since its canary was filled.
  absl::StatusOr<int64_t> Scan(const Region& region) {
    std::vector<unsigned char> bytes(region.buffer.bytes());
    TANDEM_RETURN_IF_ERROR(
        device_.CopyToHost(bytes.data(), region.buffer.data(), region.buffer.bytes()));
    return WrittenHighWater(bytes, region.declared);
  }

  // A layer that declares no region and writes none gets no counter, so the
  // report shows "-" rather than a scan of nothing.
  static void AddScan(const Region& region, int64_t written, const char* name,
                      tandem::v1::PhaseProfile* phase) {
    if (region.declared == 0 && written == 0) return;
    tandem::v1::Counter* c = phase->add_counters();
    c->set_name(name);
    c->set_value(static_cast<double>(written));
    c->set_unit("bytes");
    c->set_source(tandem::v1::COUNTER_SOURCE_MEMORY_SCAN);
  }

  LayerContext Context(int repetition) {
    LayerContext ctx;
    ctx.params = b_.params.f32();
    ctx.grads = b_.grads.f32();
    ctx.buffers = b_.buffers.empty() ? nullptr : b_.buffers.f32();
    ctx.training = true;
    ctx.seed = options_.seed;
    ctx.rng_stream =
        MixStream(0xd209, static_cast<uint64_t>(repetition), static_cast<uint64_t>(l_));
    ctx.workspace = b_.workspace.buffer.data();
    ctx.targets = static_cast<const int32_t*>(b_.targets.data());
    device_.PrepareContext(&ctx);
    return ctx;
  }

  Tensor Input() const {
    return Tensor(b_.input.data(), layer_.input_dtype(), layer_.input_shape().WithBatch(batch_));
  }
  Tensor Output() const {
    return Tensor::F32(b_.output.buffer.f32(), layer_.output_shape().WithBatch(batch_));
  }

  void Forward() {
    layer_.Forward(Context(repetition_), Input(), Output(), b_.saved.buffer.data());
  }

  void Backward() {
    const Tensor dx = b_.input_grad.empty() ? Tensor()
                                            : Tensor::F32(b_.input_grad.f32(),
                                                          layer_.input_shape().WithBatch(batch_));
    layer_.Backward(Context(repetition_), Input(), Output(), b_.saved.buffer.data(),
                    Tensor::F32(b_.output_grad.f32(), layer_.output_shape().WithBatch(batch_)), dx);
  }

  // Calls `call` warm-up + N times; `cold` evicts the device's caches before
  // each call.
  template <typename F>
  absl::Status Repeat(Phase phase, std::vector<double>* wall, bool cold, F call) {
    wall->clear();
    const int total = options_.warmup + options_.iterations;
    for (int r = 0; r < total; ++r) {
      if (options_.stop && options_.stop()) {
        return absl::CancelledError("stopped between calls: the caller has gone");
      }
      const bool timed = r >= options_.warmup;
      repetition_ = r;
      if (cold) device_.EvictCaches();
      device_.BeginPhase(l_, phase, r, timed);
      const double start = WallSeconds();
      call();
      // EndPhase marks the end of the work issued (a CUDA event must be
      // recorded before the wait); its own host time is not the phase's.
      const double issued = WallSeconds();
      device_.EndPhase(l_, phase, r, timed);
      const double end_phase_seconds = WallSeconds() - issued;
      TANDEM_RETURN_IF_ERROR(device_.Synchronize());
      const double seconds = WallSeconds() - start - end_phase_seconds;
      if (timed) wall->push_back(seconds);
    }
    return absl::OkStatus();
  }

  const Model& model_;
  const int l_;
  const Layer& layer_;
  const int64_t batch_;
  const tandem::v1::OptimizerSpec& optimizer_spec_;
  const LayerProfilerOptions& options_;
  ProfiledDevice& device_;
  std::unique_ptr<Allocator> measured_, harness_;
  LayerBuffers b_;
  int repetition_ = 0;
};

}  // namespace

tandem::v1::Profile AnalyticProfile(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                                    int64_t batch) {
  return AnalyticProfile(model, optimizer, batch, model.compute_dtype());
}

int64_t FixedWorkspaceBytes(const Layer& layer, int64_t batch) {
  const int64_t at_batch = layer.WorkspaceBytes(batch);
  if (batch <= 1) return at_batch;
  // A layer's workspace is a batch-independent part plus parts that grow
  // with the batch: its intercept, from one and two samples.
  const int64_t intercept = 2 * layer.WorkspaceBytes(1) - layer.WorkspaceBytes(2);
  return std::clamp<int64_t>(intercept, 0, at_batch);
}

tandem::v1::Profile AnalyticProfile(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                                    int64_t batch, DType state_type) {
  tandem::v1::Profile profile;
  const int states = StateCount(optimizer);
  profile.set_model_fingerprint(model.fingerprint());
  profile.set_batch_size(static_cast<int32_t>(batch));
  for (int64_t d : model.data().sample_shape.dims()) profile.add_sample_shape(d);
  profile.set_optimizer_state_per_parameter(states);
  // A bf16 model's state is counted as the executor holds it on an
  // accelerator (StateBytesOf): bf16 working copies and gradients, fp32 master
  // weights with the state; its tensors between layers stay fp32.
  if (state_type == DType::kBF16) profile.set_precision(tandem::v1::PRECISION_BF16);
  profile.mutable_provenance()->set_source("analytic");
  for (int l = 0; l < model.num_layers(); ++l) {
    const Layer& layer = model.layer(l);
    LayerProfile* p = profile.add_layers();
    p->set_index(l);
    p->set_name(layer.name());
    p->set_kind(layer.kind());
    p->set_parameter_count(layer.ParamCount());
    const LayerCost cost = layer.Cost(batch);
    p->set_forward_flops(cost.forward_flops);
    p->set_backward_flops(cost.backward_flops);
    p->set_forward_memory_bytes(cost.forward_bytes);
    p->set_backward_memory_bytes(cost.backward_bytes);
    LayerMemory* m = p->mutable_analytic_memory();
    const LayerStateBytes state = StateBytesOf(layer.ParamCount(), states, state_type);
    m->set_parameter_bytes(state.parameters);
    m->set_gradient_bytes(state.gradients);
    m->set_optimizer_state_bytes(state.optimizer_state);
    m->set_activation_bytes(layer.OutputBytes(batch) + layer.SavedBytes(batch));
    // What a call needs whatever its batch (16-bit copies of the weights)
    // goes with the staging, which the planner does not scale with the
    // samples of a call; the rest scales.
    const int64_t fixed = FixedWorkspaceBytes(layer, batch);
    m->set_workspace_bytes(layer.WorkspaceBytes(batch) - fixed);
    m->set_staging_bytes(state.staging + fixed);
    m->set_output_bytes(layer.OutputBytes(batch));
    const Shape input = layer.input_shape().WithBatch(batch);
    const Shape output = layer.output_shape().WithBatch(batch);
    for (int64_t d : input.dims()) p->add_input_shape(d);
    for (int64_t d : output.dims()) p->add_output_shape(d);
  }
  return profile;
}

absl::Status MeasureOnDevice(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                             int64_t batch, const LayerProfilerOptions& options,
                             ProfiledDevice& device, tandem::v1::Profile* profile,
                             IterationRecord* iteration) {
  if (profile->layers_size() != model.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("profile has ", profile->layers_size(),
                                                   " layers, the model ", model.num_layers()));
  }
  if (options.iterations < 1 || options.warmup < 0) {
    return absl::InvalidArgumentError("iterations must be >= 1 and warmup >= 0");
  }
  const auto stopped = [&](const std::string& before) {
    return options.stop && options.stop()
               ? absl::CancelledError(absl::StrCat(device.id(), ": stopped before ", before,
                                                   ": the caller has gone"))
               : absl::OkStatus();
  };
  for (int l = 0; l < model.num_layers(); ++l) {
    TANDEM_RETURN_IF_ERROR(stopped(absl::StrCat("layer ", l)));
    if (options.on_progress) {
      options.on_progress(absl::StrCat(device.id(), ": layer ", l + 1, " of ", model.num_layers(),
                                       " (", model.layer(l).name(), ")"));
    }
    LayerRun run(model, l, batch, optimizer, options, device);
    const absl::Status s = run.Run(profile->mutable_layers(l)->add_devices());
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(device.id(), ": layer ", l, " (",
                                                 model.layer(l).name(), "): ", s.message()));
    }
  }
  tandem::v1::DeviceProfile d = device.Describe();
  TANDEM_RETURN_IF_ERROR(stopped("the peak rates"));
  if (options.on_progress) options.on_progress(absl::StrCat(device.id(), ": peak rates"));
  TANDEM_RETURN_IF_ERROR(device.MeasurePeaks(&d));
  if (options.run_iteration) {
    TANDEM_RETURN_IF_ERROR(stopped("the iteration"));
    if (options.on_progress) options.on_progress(absl::StrCat(device.id(), ": one iteration"));
    TANDEM_ASSIGN_OR_RETURN(IterationRecord record,
                            options.run_iteration(device, model, optimizer, batch, options.seed));
    d.set_iteration_peak_bytes(record.peak_bytes);
    if (iteration != nullptr) *iteration = std::move(record);
  }
  device.FinishProfile(&d);
  *profile->add_devices() = std::move(d);
  return absl::OkStatus();
}

}  // namespace tandem::profile
