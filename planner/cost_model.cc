#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "planner/precision.h"

namespace tandem::planner {
namespace {

using tandem::v1::DeviceKind;
using tandem::v1::HardwareSpec;
using tandem::v1::LayerProfile;
using tandem::v1::LinkDirection;
using tandem::v1::Placement;
using tandem::v1::Precision;
using tandem::v1::ProcessorSpec;
using tandem::v1::Profile;

// Fixed cost of one layer call when a source does not give one, in seconds. A
// CUDA kernel launch costs ~2-5 us of host time and a layer is a few kernels
// (NVIDIA, "CUDA C++ Best Practices Guide", kernel launch overhead); a oneDNN
// primitive call on a warm cache costs ~1 us.
constexpr double kDefaultAcceleratorCallSeconds = 5e-6;
constexpr double kDefaultHostCallSeconds = 1e-6;

bool IsAccelerator(DeviceKind kind) {
  return kind == tandem::v1::DEVICE_KIND_CUDA || kind == tandem::v1::DEVICE_KIND_EMULATED;
}

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// The profile-level checks both sources share.
absl::Status ValidateLayers(const Profile& profile) {
  if (profile.batch_size() <= 0) return Invalid("profile.batch_size", "must be > 0");
  if (profile.layers().empty()) return Invalid("profile.layers", "must not be empty");
  for (int i = 0; i < profile.layers_size(); ++i) {
    const LayerProfile& layer = profile.layers(i);
    const std::string f = absl::StrCat("profile.layers[", i, "]");
    if (layer.index() != i) {
      return Invalid(absl::StrCat(f, ".index"),
                     absl::StrCat("must be ", i, ", got ", layer.index()));
    }
    const std::pair<const char*, double> numbers[] = {
        {"forward_flops", layer.forward_flops()},
        {"backward_flops", layer.backward_flops()},
        {"forward_memory_bytes", layer.forward_memory_bytes()},
        {"backward_memory_bytes", layer.backward_memory_bytes()},
    };
    for (const auto& [name, value] : numbers) {
      if (!(value >= 0) || !std::isfinite(value)) {
        return Invalid(absl::StrCat(f, ".", name), "must be a finite number >= 0");
      }
    }
    const tandem::v1::LayerMemory& m = layer.analytic_memory();
    const std::pair<const char*, int64_t> bytes[] = {
        {"parameter_bytes", m.parameter_bytes()},
        {"gradient_bytes", m.gradient_bytes()},
        {"optimizer_state_bytes", m.optimizer_state_bytes()},
        {"activation_bytes", m.activation_bytes()},
        {"workspace_bytes", m.workspace_bytes()},
        {"output_bytes", m.output_bytes()},
        {"staging_bytes", m.staging_bytes()},
    };
    for (const auto& [name, value] : bytes) {
      // At most 2^50 (a PiB) a layer: the planner's byte sums stay in int64.
      if (value < 0 || value > (int64_t{1} << 50)) {
        return Invalid(absl::StrCat(f, ".analytic_memory.", name), "must be in [0, 2^50]");
      }
    }
    if (layer.parameter_count() < 0) {
      return Invalid(absl::StrCat(f, ".parameter_count"), "must be >= 0");
    }
  }
  return absl::OkStatus();
}

double EfficiencyOf(const ProcessorSpec& spec, absl::string_view key) {
  auto it = spec.efficiency().find(std::string(key));
  if (it != spec.efficiency().end()) return it->second;
  return DefaultEfficiency(spec.kind(), key);
}

absl::Status ValidateProcessor(const ProcessorSpec& spec, absl::string_view field) {
  const std::pair<const char*, double> rates[] = {
      {"peak_matmul_flops_per_second", spec.peak_matmul_flops_per_second()},
      {"peak_vector_flops_per_second", spec.peak_vector_flops_per_second()},
      {"memory_bandwidth_bytes_per_second", spec.memory_bandwidth_bytes_per_second()},
  };
  for (const auto& [name, value] : rates) {
    if (!(value > 0) || !std::isfinite(value)) {
      return Invalid(absl::StrCat(field, ".", name), "must be > 0");
    }
  }
  const std::pair<const char*, double> optional_rates[] = {
      {"peak_bf16_matmul_flops_per_second", spec.peak_bf16_matmul_flops_per_second()},
      {"peak_fp16_matmul_flops_per_second", spec.peak_fp16_matmul_flops_per_second()},
  };
  for (const auto& [name, value] : optional_rates) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return Invalid(absl::StrCat(field, ".", name), "must be >= 0 (0 = none)");
    }
  }
  if (spec.memory_bytes() < 0) return Invalid(absl::StrCat(field, ".memory_bytes"), "must be >= 0");
  if (spec.threads() < 0) return Invalid(absl::StrCat(field, ".threads"), "must be >= 0");
  if (!(spec.launch_overhead_seconds() >= 0) || !std::isfinite(spec.launch_overhead_seconds())) {
    return Invalid(absl::StrCat(field, ".launch_overhead_seconds"), "must be a finite number >= 0");
  }
  for (const auto& [key, value] : spec.efficiency()) {
    if (!(value > 0 && value <= 1)) {
      return Invalid(absl::StrCat(field, ".efficiency[\"", key, "\"]"), "must be in (0, 1]");
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLink(const tandem::v1::LinkSpec& link, absl::string_view field) {
  if (!(link.bandwidth_bytes_per_second() > 0) ||
      !std::isfinite(link.bandwidth_bytes_per_second())) {
    return Invalid(absl::StrCat(field, ".bandwidth_bytes_per_second"),
                   "must be a finite number > 0");
  }
  if (!(link.latency_seconds() >= 0) || !std::isfinite(link.latency_seconds())) {
    return Invalid(absl::StrCat(field, ".latency_seconds"), "must be a finite number >= 0");
  }
  return absl::OkStatus();
}

// Adam-like state: ~2 FLOPs for the weight update plus ~5 per fp32 state
// element (scale, fused multiply-add, square root or division); a mixed
// precision's fp32 master weights are not state elements, and writing the
// 16-bit working copy is one more.
double UpdateFlops(const LayerProfile& layer, Precision precision) {
  const tandem::v1::LayerMemory& m = layer.analytic_memory();
  const double params = static_cast<double>(ParameterCount(layer, precision));
  if (!(params > 0)) return 0.0;
  const double master = IsMixed(precision) ? 4.0 * params : 0.0;
  const double state_per_param =
      std::max(0.0, (m.optimizer_state_bytes() - master) / (4.0 * params));
  return params * (2.0 + 5.0 * state_per_param + (IsMixed(precision) ? 1.0 : 0.0));
}

// fp32: read and write weights and state, read the gradient. Mixed: read and
// write master weights and state (both in optimizer_state_bytes), read the
// 16-bit gradient, write the 16-bit working copy.
int64_t UpdateBytesOf(int64_t parameter_bytes, int64_t gradient_bytes,
                      int64_t optimizer_state_bytes, Precision precision) {
  const int64_t weights = IsMixed(precision) ? parameter_bytes : 2 * parameter_bytes;
  return weights + gradient_bytes + 2 * optimizer_state_bytes;
}

int64_t UpdateBytesOf(const tandem::v1::LayerMemory& m, Precision precision) {
  return UpdateBytesOf(m.parameter_bytes(), m.gradient_bytes(), m.optimizer_state_bytes(),
                       precision);
}

// The devices a measured profile was taken on: the first CPU, the first
// accelerator, and how many accelerators are of its kind.
struct MeasuredDevices {
  const tandem::v1::DeviceProfile* host = nullptr;
  const tandem::v1::DeviceProfile* accelerator = nullptr;
  int accelerator_count = 0;
};

MeasuredDevices FindMeasuredDevices(const Profile& profile) {
  MeasuredDevices found;
  for (const tandem::v1::DeviceProfile& d : profile.devices()) {
    if (d.kind() == tandem::v1::DEVICE_KIND_CPU && found.host == nullptr) found.host = &d;
    if (IsAccelerator(d.kind())) {
      if (found.accelerator == nullptr) found.accelerator = &d;
      if (d.kind() == found.accelerator->kind()) ++found.accelerator_count;
    }
  }
  return found;
}

// One layer's calls on one device, at the profiled batch, overhead included.
struct DeviceTimes {
  double forward_seconds = 0;
  double backward_seconds = 0;
  double update_seconds = 0;
};

// A measured phase's time per call: its median, or its mean when the
// profile says so (ProfileProvenance.planning_statistic).
// A profile marked MEAN whose phase has no mean (written by hand) takes the
// median rather than zero.
double CallSeconds(const tandem::v1::TimingStats& timing, bool mean) {
  return mean && timing.mean_seconds() > 0 ? timing.mean_seconds() : timing.median_seconds();
}

// Layer `index`'s measured times on `device` (medians, or means when `mean`).
// An update not measured streams UpdateBytes at the device's measured
// bandwidth times the optimizer efficiency, plus the call overhead.
absl::StatusOr<DeviceTimes> MeasuredTimes(const LayerProfile& layer, int index,
                                          const tandem::v1::DeviceProfile& device,
                                          double call_overhead_seconds, bool mean,
                                          Precision precision) {
  const tandem::v1::LayerDeviceProfile* measured = nullptr;
  for (const tandem::v1::LayerDeviceProfile& ld : layer.devices()) {
    if (ld.device_id() == device.id()) measured = &ld;
  }
  const std::string field =
      absl::StrCat("profile.layers[", index, "].devices[\"", device.id(), "\"]");
  if (measured == nullptr || measured->forward().timing().samples() <= 0 ||
      measured->backward().timing().samples() <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": no forward/backward timing for this device"));
  }
  DeviceTimes t;
  auto usable = [](double seconds) { return seconds >= 0 && std::isfinite(seconds); };
  t.forward_seconds = CallSeconds(measured->forward().timing(), mean);
  t.backward_seconds = CallSeconds(measured->backward().timing(), mean);
  if (!usable(t.forward_seconds) || !usable(t.backward_seconds)) {
    return Invalid(field, "forward and backward timings must be finite numbers >= 0");
  }
  if (measured->update().timing().samples() > 0) {
    t.update_seconds = CallSeconds(measured->update().timing(), mean);
    if (!usable(t.update_seconds)) {
      return Invalid(field, "the update timing must be a finite number >= 0");
    }
    return t;
  }
  const double bandwidth =
      device.memory_bandwidth_bytes_per_second() * DefaultEfficiency(device.kind(), "optimizer");
  const int64_t update_bytes = UpdateBytesOf(layer.analytic_memory(), precision);
  if (!(bandwidth > 0) && update_bytes > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        field, ": no update timing and no memory_bandwidth_bytes_per_second to estimate it"));
  }
  t.update_seconds = update_bytes > 0 ? update_bytes / bandwidth : 0.0;
  t.update_seconds += call_overhead_seconds;
  return t;
}

absl::Status ValidateHardwareHost(const ProcessorSpec& host) {
  if (absl::Status s = ValidateProcessor(host, "hardware.host"); !s.ok()) return s;
  if (host.kind() != tandem::v1::DEVICE_KIND_CPU &&
      host.kind() != tandem::v1::DEVICE_KIND_UNSPECIFIED) {
    return Invalid("hardware.host.kind", "must be DEVICE_KIND_CPU");
  }
  return absl::OkStatus();
}

// The first accelerator (the one planned for) and its links to the host.
absl::Status ValidateHardwareAccelerator(const HardwareSpec& hardware) {
  const ProcessorSpec& accelerator = hardware.accelerators(0);
  if (absl::Status s = ValidateProcessor(accelerator, "hardware.accelerators[0]"); !s.ok()) {
    return s;
  }
  if (!IsAccelerator(accelerator.kind())) {
    return Invalid("hardware.accelerators[0].kind",
                   "must be DEVICE_KIND_CUDA or DEVICE_KIND_EMULATED");
  }
  if (absl::Status s = ValidateLink(hardware.host_to_accelerator(), "hardware.host_to_accelerator");
      !s.ok()) {
    return s;
  }
  return ValidateLink(hardware.accelerator_to_host(), "hardware.accelerator_to_host");
}

// A roofline of one layer on processor `p`: the longer of its FLOPs at the
// op class's peak and its bytes at the memory bandwidth, both times the op
// class's efficiency; the update likewise at the optimizer's efficiency.
DeviceTimes RooflineTimes(const LayerProfile& layer, OpClass op_class, const ProcessorSpec& p,
                          double call_overhead_seconds, Precision precision) {
  const bool matrix =
      op_class == OpClass::kMatmul || op_class == OpClass::kConv || op_class == OpClass::kAttention;
  const double eff = EfficiencyOf(p, OpClassKey(op_class));
  const double flops_per_second =
      (matrix ? MatmulPeak(p, precision) : p.peak_vector_flops_per_second()) * eff;
  const double bytes_per_second = p.memory_bandwidth_bytes_per_second() * eff;
  auto roofline = [&](double flops, double bytes) {
    return std::max(flops / flops_per_second, bytes / bytes_per_second);
  };
  DeviceTimes t;
  t.forward_seconds =
      call_overhead_seconds + roofline(layer.forward_flops(), layer.forward_memory_bytes());
  t.backward_seconds =
      call_overhead_seconds + roofline(layer.backward_flops(), layer.backward_memory_bytes());
  const tandem::v1::LayerMemory& m = layer.analytic_memory();
  const double opt_eff = EfficiencyOf(p, "optimizer");
  const int64_t update_bytes = UpdateBytesOf(m, precision);
  const double update_core =
      std::max(UpdateFlops(layer, precision) / (p.peak_vector_flops_per_second() * opt_eff),
               update_bytes / (p.memory_bandwidth_bytes_per_second() * opt_eff));
  t.update_seconds = update_bytes > 0 ? call_overhead_seconds + update_core : 0.0;
  return t;
}

}  // namespace

const tandem::v1::LinkProfile* BestLink(const tandem::v1::Profile& profile,
                                        tandem::v1::LinkDirection direction) {
  const tandem::v1::LinkProfile* best = nullptr;
  for (const tandem::v1::LinkProfile& l : profile.links()) {
    // A link with no finite rate or latency is unusable (as unmeasured).
    if (l.direction() != direction || !(l.bandwidth_bytes_per_second() > 0) ||
        !std::isfinite(l.bandwidth_bytes_per_second()) || !std::isfinite(l.latency_seconds())) {
      continue;
    }
    if (best == nullptr || (l.pinned() && !best->pinned())) best = &l;
  }
  return best;
}

absl::StatusOr<OpClass> OpClassOfKind(absl::string_view kind) {
  static const std::pair<absl::string_view, OpClass> kKinds[] = {
      {"linear", OpClass::kMatmul},
      {"conv2d", OpClass::kConv},
      {"max_pool2d", OpClass::kPool},
      {"avg_pool2d", OpClass::kPool},
      {"batch_norm2d", OpClass::kNorm},
      {"relu", OpClass::kElementwise},
      {"gelu", OpClass::kElementwise},
      {"dropout", OpClass::kElementwise},
      {"flatten", OpClass::kElementwise},
      {"layer_norm", OpClass::kNorm},
      {"embedding", OpClass::kEmbedding},
      {"attention", OpClass::kAttention},
      // A block's FLOPs are dominated by its four dense GEMMs (24*B*T*d^2 of
      // 24*B*T*d^2 + 4*B*T^2*d at GPT-2 shapes), so it is a matmul.
      {"transformer_block", OpClass::kMatmul},
      // Two 3x3 convolutions and elementwise work around them.
      {"residual_block", OpClass::kConv},
      {"global_avg_pool", OpClass::kPool},
      {"cross_entropy", OpClass::kLoss},
  };
  for (const auto& [name, op_class] : kKinds) {
    if (name == kind) return op_class;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown layer kind \"", kind, "\""));
}

absl::string_view OpClassKey(OpClass op_class) {
  switch (op_class) {
    case OpClass::kMatmul:
      return "matmul";
    case OpClass::kConv:
      return "conv";
    case OpClass::kElementwise:
      return "elementwise";
    case OpClass::kNorm:
      return "norm";
    case OpClass::kAttention:
      return "attention";
    case OpClass::kEmbedding:
      return "embedding";
    case OpClass::kPool:
      return "pool";
    case OpClass::kLoss:
      return "loss";
  }
  return "elementwise";
}

double DefaultEfficiency(DeviceKind kind, absl::string_view key) {
  // GPU. cuBLAS TF32 GEMMs at transformer shapes sustain ~60-75% of dense
  // tensor-core peak; cuDNN implicit-GEMM convolutions less; unfused attention
  // (softmax between two batched GEMMs) is held back by its T^2 memory traffic;
  // streaming kernels (elementwise, a fused Adam step) reach ~80-90% of HBM
  // bandwidth, as STREAM-like device copies do.
  static const std::pair<absl::string_view, double> kAccelerator[] = {
      {"matmul", 0.70},      {"conv", 0.55}, {"attention", 0.50},
      {"elementwise", 0.80}, {"norm", 0.70}, {"embedding", 0.50},
      {"pool", 0.70},        {"loss", 0.60}, {"optimizer", 0.80},
  };
  // CPU. oneDNN sgemm at large shapes reaches ~70-85% of the AVX-512 FMA peak;
  // STREAM triad on two-socket servers reaches ~60-80% of the theoretical DRAM
  // bandwidth; ZeRO-Offload's vectorised CPU-Adam (Ren et al., ATC'21) is
  // bandwidth bound at about half of it across two NUMA nodes.
  static const std::pair<absl::string_view, double> kHost[] = {
      {"matmul", 0.70},      {"conv", 0.50}, {"attention", 0.45},
      {"elementwise", 0.60}, {"norm", 0.50}, {"embedding", 0.40},
      {"pool", 0.50},        {"loss", 0.50}, {"optimizer", 0.55},
  };
  // The emulated accelerator is host memory and host threads.
  const bool gpu = kind == tandem::v1::DEVICE_KIND_CUDA;
  for (const auto& [name, value] : gpu ? kAccelerator : kHost) {
    if (name == key) return value;
  }
  return 0.5;
}

int CostModel::DeviceIndex(Placement device) {
  return device == tandem::v1::PLACEMENT_ACCELERATOR ? kAccelerator : kHost;
}

double CostModel::Scaled(double profiled_seconds, int device, int samples) const {
  const double overhead = std::min(call_overhead_seconds_[device], profiled_seconds);
  return overhead + (profiled_seconds - overhead) * samples / profiled_batch_size_;
}

double CostModel::ProfiledSeconds(double seconds, Placement device, int samples) const {
  const int d = DeviceIndex(device);
  const double overhead = std::min(call_overhead_seconds_[d], seconds);
  return overhead + (seconds - overhead) * profiled_batch_size_ / std::max(1, samples);
}

int64_t CostModel::ScaledBytes(int64_t bytes, int samples) const {
  return bytes * samples / profiled_batch_size_;
}

double CostModel::ForwardSeconds(int layer, Placement device, int samples) const {
  const int d = DeviceIndex(device);
  return Scaled(layers_[layer].forward_seconds[d], d, samples);
}

double CostModel::BackwardSeconds(int layer, Placement device, int samples) const {
  const int d = DeviceIndex(device);
  return Scaled(layers_[layer].backward_seconds[d], d, samples);
}

double CostModel::UpdateSeconds(int layer, Placement device, int host_threads) const {
  const int d = DeviceIndex(device);
  const double t = layers_[layer].update_seconds[d];
  if (d == kAccelerator) return t;
  const double overhead = std::min(call_overhead_seconds_[kHost], t);
  const int threads = std::max(1, std::min(host_threads, host_threads_));
  return overhead + (t - overhead) * host_threads_ / threads;
}

double CostModel::GradientAverageSeconds(int layer, int host_threads) const {
  const int threads = std::max(1, std::min(host_threads, host_threads_));
  const double bytes_per_second = host_stream_bytes_per_second_ * threads / host_threads_;
  return call_overhead_seconds_[kHost] + 3.0 * layers_[layer].gradient_bytes / bytes_per_second;
}

double CostModel::CopySeconds(LinkDirection direction, int64_t bytes) const {
  const Link& link = direction == tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST ? d2h_ : h2d_;
  if (bytes <= 0 || link.bytes_per_second <= 0) return 0.0;
  return link.latency_seconds + bytes / link.bytes_per_second;
}

double CostModel::PeerCopySeconds(int64_t bytes) const {
  if (bytes <= 0) return 0.0;
  if (!has_peer_link_) {
    return CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, bytes) +
           CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, bytes);
  }
  return peer_.latency_seconds + bytes / peer_.bytes_per_second;
}

int64_t CostModel::ActivationBytes(int layer, int samples) const {
  return ScaledBytes(layers_[layer].activation_bytes, samples);
}

int64_t CostModel::WorkspaceBytes(int layer, int samples) const {
  return ScaledBytes(layers_[layer].workspace_bytes, samples) + layers_[layer].staging_bytes;
}

int64_t CostModel::OutputBytes(int layer, int samples) const {
  return ScaledBytes(layers_[layer].output_bytes, samples);
}

int64_t CostModel::UpdateBytes(int layer) const {
  const LayerCosts& c = layers_[layer];
  return UpdateBytesOf(c.parameter_bytes, c.gradient_bytes, c.optimizer_state_bytes, precision_);
}

int64_t CostModel::ModelStateBytes() const {
  int64_t total = 0;
  for (const LayerCosts& c : layers_) {
    total += c.parameter_bytes + c.gradient_bytes + c.optimizer_state_bytes;
  }
  return total;
}

ChainLayerCosts ChainLayerCostsOf(const CostModel& cost, int layer, int samples, int host_threads,
                                  bool recompute) {
  constexpr tandem::v1::Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
  ChainLayerCosts x;
  x.param = cost.ParameterBytes(layer);
  x.grad = cost.GradientBytes(layer);
  x.opt = cost.OptimizerStateBytes(layer);
  x.update_bytes = cost.UpdateBytes(layer);
  x.has_params = x.param > 0 || x.grad > 0;
  x.upd_host = cost.UpdateSeconds(layer, tandem::v1::PLACEMENT_HOST, host_threads);
  x.fwd = cost.ForwardSeconds(layer, kAcc, samples);
  x.bwd = cost.BackwardSeconds(layer, kAcc, samples);
  x.upd_acc = cost.UpdateSeconds(layer, kAcc, host_threads);
  x.grad_d2h = cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, x.grad);
  x.act = cost.ActivationBytes(layer, samples);
  x.ws = cost.WorkspaceBytes(layer, samples);
  x.ckpt = layer == 0 ? 0 : std::min(x.act, cost.OutputBytes(layer - 1, samples));
  x.recompute = recompute;
  return x;
}

void ChainTimeline::Span(tandem::v1::TimelineResource resource, tandem::v1::TimelinePhase phase,
                         int layer, int micro_batch, double start, double end,
                         int64_t bytes) const {
  if (timeline == nullptr) return;
  tandem::v1::TimelineSpan* out = timeline->add_spans();
  out->set_resource(resource);
  out->set_lane(0);
  out->set_layer(layer);
  out->set_phase(phase);
  out->set_start_seconds(start - t0);
  out->set_end_seconds(end - t0);
  out->set_bytes(bytes);
  out->set_micro_batch(micro_batch);
}

CostModel::LayerCosts CostModel::AnalyticLayer(const LayerProfile& layer) {
  LayerCosts c;
  c.name = layer.name();
  c.kind = layer.kind();
  const tandem::v1::LayerMemory& m = layer.analytic_memory();
  c.parameter_bytes = m.parameter_bytes();
  c.gradient_bytes = m.gradient_bytes();
  c.optimizer_state_bytes = m.optimizer_state_bytes();
  c.activation_bytes = m.activation_bytes();
  c.workspace_bytes = m.workspace_bytes();
  c.staging_bytes = m.staging_bytes();
  c.output_bytes = m.output_bytes();
  return c;
}

void CostModel::SetMeasuredProcessors(const tandem::v1::DeviceProfile& host,
                                      const tandem::v1::DeviceProfile* accelerator) {
  host_threads_ = std::max(1, host.threads());
  host_memory_bytes_ = host.memory_bytes();
  call_overhead_seconds_[kHost] = kDefaultHostCallSeconds;
  call_overhead_seconds_[kAccelerator] = kDefaultAcceleratorCallSeconds;
  host_stream_bytes_per_second_ = host.memory_bandwidth_bytes_per_second() *
                                  DefaultEfficiency(tandem::v1::DEVICE_KIND_CPU, "elementwise");
  if (!(host_stream_bytes_per_second_ > 0)) {
    // Without a STREAM figure, assume one DDR channel's worth: slow but finite.
    host_stream_bytes_per_second_ = 10e9;
  }
  if (accelerator != nullptr) {
    has_accelerator_ = true;
    accelerator_kind_ = accelerator->kind();
    accelerator_memory_bytes_ = accelerator->memory_bytes();
    SetThreadSpeedup(accelerator->threads(), accelerator->gemm_flops_per_second(),
                     accelerator->single_thread_gemm_flops_per_second());
  }
}

void CostModel::SetThreadSpeedup(int threads, double rate, double single_thread_rate) {
  accelerator_threads_ = std::max(0, threads);
  accelerator_thread_speedup_ = ThreadSpeedup(threads, rate, single_thread_rate);
}

double ThreadSpeedup(int threads, double rate, double single_thread_rate) {
  return threads > 0 && rate > 0 && single_thread_rate > 0
             ? std::clamp(rate / single_thread_rate, 1.0, static_cast<double>(threads))
             : 0;
}

double ThreadsRate(int k, int n, double speedup) {
  n = std::max(1, n);
  if (!(speedup > 0)) speedup = n;
  // s(k) = 1 + (k - 1) (S - 1) / (n - 1): one thread's rate at k = 1, the
  // source's at k = n, and on the same line beyond.
  return n > 1 ? 1 + (k - 1) * (speedup - 1) / (n - 1) : 1.0 * k;
}

double ThreadsRate(const tandem::v1::ProcessorSpec& spec, int k) {
  return ThreadsRate(k, spec.threads(),
                     ThreadSpeedup(spec.threads(), spec.peak_matmul_flops_per_second(),
                                   spec.single_thread_matmul_flops_per_second()));
}

double CostModel::ThreadShareSlowdown(int threads, int share) const {
  share = std::max(1, share);
  if (share >= threads) return 1.0;
  return ThreadsRate(threads, accelerator_threads_, accelerator_thread_speedup_) /
         ThreadsRate(share, accelerator_threads_, accelerator_thread_speedup_);
}

absl::Status CostModel::SetMeasuredLinks(const Profile& profile) {
  const tandem::v1::LinkProfile* h2d = BestLink(profile, tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE);
  const tandem::v1::LinkProfile* d2h = BestLink(profile, tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST);
  if (h2d == nullptr || d2h == nullptr) {
    return absl::FailedPreconditionError(
        "profile.links: an accelerator was profiled but the host-to-device and "
        "device-to-host links were not measured");
  }
  h2d_ = {h2d->bandwidth_bytes_per_second(), std::max(0.0, h2d->latency_seconds())};
  d2h_ = {d2h->bandwidth_bytes_per_second(), std::max(0.0, d2h->latency_seconds())};
  if (const tandem::v1::LinkProfile* peer =
          BestLink(profile, tandem::v1::LINK_DIRECTION_DEVICE_TO_DEVICE)) {
    has_peer_link_ = true;
    peer_ = {peer->bandwidth_bytes_per_second(), std::max(0.0, peer->latency_seconds())};
  }
  return absl::OkStatus();
}

absl::Status CostModel::AddMeasuredLayer(const LayerProfile& layer, int index,
                                         const tandem::v1::DeviceProfile* const devices[2],
                                         bool mean) {
  LayerCosts c = AnalyticLayer(layer);
  for (int d = 0; d < 2; ++d) {
    if (devices[d] == nullptr) continue;
    absl::StatusOr<DeviceTimes> t =
        MeasuredTimes(layer, index, *devices[d], call_overhead_seconds_[d], mean, precision_);
    if (!t.ok()) return t.status();
    c.forward_seconds[d] = t->forward_seconds;
    c.backward_seconds[d] = t->backward_seconds;
    c.update_seconds[d] = t->update_seconds;
  }
  layers_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<CostModel> CostModel::FromMeasuredProfile(const Profile& profile) {
  if (absl::Status s = ValidateLayers(profile); !s.ok()) return s;
  const MeasuredDevices devices = FindMeasuredDevices(profile);
  if (devices.host == nullptr) {
    return absl::FailedPreconditionError("profile.devices: no device of kind DEVICE_KIND_CPU");
  }
  CostModel model;
  model.source_ = "measured";
  model.profiled_batch_size_ = profile.batch_size();
  model.precision_ = profile.precision();
  model.accelerator_count_ = devices.accelerator_count;
  model.SetMeasuredProcessors(*devices.host, devices.accelerator);
  if (model.has_accelerator_) {
    if (absl::Status s = model.SetMeasuredLinks(profile); !s.ok()) return s;
  }
  const tandem::v1::DeviceProfile* by_index[2] = {devices.host, devices.accelerator};
  const bool mean = profile.provenance().planning_statistic() == tandem::v1::TIMING_STATISTIC_MEAN;
  for (int i = 0; i < profile.layers_size(); ++i) {
    if (absl::Status s = model.AddMeasuredLayer(profile.layers(i), i, by_index, mean); !s.ok()) {
      return s;
    }
  }
  return model;
}

void CostModel::SetHardwareHost(const ProcessorSpec& host) {
  host_threads_ = std::max(1, host.threads());
  host_memory_bytes_ = host.memory_bytes();
  call_overhead_seconds_[kHost] =
      host.launch_overhead_seconds() > 0 ? host.launch_overhead_seconds() : kDefaultHostCallSeconds;
  host_stream_bytes_per_second_ =
      host.memory_bandwidth_bytes_per_second() * EfficiencyOf(host, "elementwise");
}

void CostModel::SetHardwareAccelerator(const HardwareSpec& hardware) {
  const ProcessorSpec& accelerator = hardware.accelerators(0);
  has_accelerator_ = true;
  accelerator_kind_ = accelerator.kind();
  accelerator_count_ = hardware.accelerators_size();
  accelerator_memory_bytes_ = accelerator.memory_bytes();
  SetThreadSpeedup(accelerator.threads(), accelerator.peak_matmul_flops_per_second(),
                   accelerator.single_thread_matmul_flops_per_second());
  call_overhead_seconds_[kAccelerator] = accelerator.launch_overhead_seconds() > 0
                                             ? accelerator.launch_overhead_seconds()
                                             : kDefaultAcceleratorCallSeconds;
  h2d_ = {hardware.host_to_accelerator().bandwidth_bytes_per_second(),
          hardware.host_to_accelerator().latency_seconds()};
  d2h_ = {hardware.accelerator_to_host().bandwidth_bytes_per_second(),
          hardware.accelerator_to_host().latency_seconds()};
  if (hardware.accelerator_to_accelerator().bandwidth_bytes_per_second() > 0) {
    has_peer_link_ = true;
    peer_ = {hardware.accelerator_to_accelerator().bandwidth_bytes_per_second(),
             std::max(0.0, hardware.accelerator_to_accelerator().latency_seconds())};
  }
}

absl::Status CostModel::AddRooflineLayer(const LayerProfile& layer, int index,
                                         const ProcessorSpec* const processors[2]) {
  absl::StatusOr<OpClass> op_class = OpClassOfKind(layer.kind());
  if (!op_class.ok()) {
    return Invalid(absl::StrCat("profile.layers[", index, "].kind"), op_class.status().message());
  }
  LayerCosts c = AnalyticLayer(layer);
  for (int d = 0; d < 2; ++d) {
    if (processors[d] == nullptr) continue;
    const DeviceTimes t =
        RooflineTimes(layer, *op_class, *processors[d], call_overhead_seconds_[d], precision_);
    c.forward_seconds[d] = t.forward_seconds;
    c.backward_seconds[d] = t.backward_seconds;
    c.update_seconds[d] = t.update_seconds;
  }
  layers_.push_back(std::move(c));
  return absl::OkStatus();
}

absl::StatusOr<CostModel> CostModel::FromHardwareSpec(const Profile& profile,
                                                      const HardwareSpec& hardware) {
  if (absl::Status s = ValidateLayers(profile); !s.ok()) return s;
  if (absl::Status s = ValidateHardwareHost(hardware.host()); !s.ok()) return s;
  CostModel model;
  model.source_ = absl::StrCat("hardware_spec:", hardware.name());
  model.profiled_batch_size_ = profile.batch_size();
  model.precision_ = profile.precision();
  model.SetHardwareHost(hardware.host());
  const ProcessorSpec* accelerator = nullptr;
  if (hardware.accelerators_size() > 0) {
    if (absl::Status s = ValidateHardwareAccelerator(hardware); !s.ok()) return s;
    accelerator = &hardware.accelerators(0);
    model.SetHardwareAccelerator(hardware);
  }
  const ProcessorSpec* processors[2] = {&hardware.host(), accelerator};
  for (int i = 0; i < profile.layers_size(); ++i) {
    if (absl::Status s = model.AddRooflineLayer(profile.layers(i), i, processors); !s.ok()) {
      return s;
    }
  }
  return model;
}

}  // namespace tandem::planner
