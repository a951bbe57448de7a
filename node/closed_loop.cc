#include "node/closed_loop.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/atomic_file.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "google/protobuf/util/time_util.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/simulator.h"
#include "runtime/profile/job_telemetry.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/profile/profile_cache.h"
#include "runtime/profile/timing_stats.h"
#include "spec/job_spec.h"
#include "spec/precision.h"

namespace tandem::node {
namespace {

using tandem::v1::JobSpec;
using tandem::v1::Plan;
using tandem::v1::Profile;
using tandem::v1::ReplanReason;
using tandem::v1::Timeline;
using tandem::v1::TimelineResource;

constexpr int kHost = 0;
constexpr int kAccelerator = 1;
constexpr int kForward = 0;
constexpr int kBackward = 1;
constexpr int kUpdate = 2;
constexpr int kPhases = 3;

// A switch that measures this much slower than the plan it replaced goes back.
constexpr double kSlowerMargin = 0.05;
// A new placement is switched to when its predicted step is at least this
// much shorter than the running plan's, both timed with the measured figures.
constexpr double kMinGain = 0.05;
// A plan's measured step time over its life: the median of its first this
// many steps after the warm-up (enough for a median; the copy stays cheap).
constexpr size_t kPlanStepsKept = 256;

double EffectiveThreshold(double threshold) {
  return threshold == 0 ? kDefaultReplanThreshold : threshold;
}

std::string Ms(double seconds) { return absl::StrFormat("%.1f ms", seconds * 1e3); }

std::string Percent(double measured, double predicted) {
  return absl::StrFormat("%+.1f%%", (measured / std::max(predicted, 1e-12) - 1) * 100);
}

std::map<TimelineResource, double> BusyByResource(const Timeline& timeline) {
  std::map<TimelineResource, double> busy;
  for (const auto& span : timeline.spans()) {
    busy[span.resource()] += span.end_seconds() - span.start_seconds();
  }
  return busy;
}

// Least squares of seconds = latency + bytes / bandwidth over the copies; a
// fit that is not physical (every copy one size, a negative slope) takes
// bandwidth = total bytes / total seconds with no latency.
struct LinkFit {
  double bytes_per_second = 0;
  double latency_seconds = 0;
  int copies = 0;
};
LinkFit FitLink(const std::vector<std::pair<double, double>>& copies) {
  LinkFit fit;
  fit.copies = static_cast<int>(copies.size());
  if (copies.empty()) return fit;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : copies) {
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double n = static_cast<double>(copies.size());
  const double det = n * sxx - sx * sx;
  if (det > 0) {
    const double slope = (n * sxy - sx * sy) / det;
    const double intercept = (sy - slope * sx) / n;
    if (slope > 0 && intercept >= 0) {
      fit.bytes_per_second = 1 / slope;
      fit.latency_seconds = intercept;
      return fit;
    }
  }
  if (sy > 0) fit.bytes_per_second = sx / sy;
  return fit;
}

tandem::v1::PhaseProfile* PhaseOf(tandem::v1::LayerDeviceProfile& d, int phase) {
  return phase == kForward ? d.mutable_forward()
                           : (phase == kBackward ? d.mutable_backward() : d.mutable_update());
}

// Idle time between consecutive spans of `resource` in one step, and how
// many spans it ran.
std::pair<double, int> IdleBetweenSpans(const Timeline& t, TimelineResource resource) {
  std::vector<std::pair<double, double>> spans;
  for (const auto& s : t.spans()) {
    if (s.resource() == resource) spans.emplace_back(s.start_seconds(), s.end_seconds());
  }
  std::sort(spans.begin(), spans.end());
  double idle = 0, busy_until = spans.empty() ? 0 : spans[0].second;
  for (size_t i = 1; i < spans.size(); ++i) {
    idle += std::max(0.0, spans[i].first - busy_until);
    busy_until = std::max(busy_until, spans[i].second);
  }
  return {idle, static_cast<int>(spans.size())};
}

std::string AcceleratorId(const JobSpec& resolved, const NodeOffer& node) {
  if (resolved.placement().accelerator() == tandem::v1::ACCELERATOR_KIND_CUDA &&
      !node.cuda_devices.empty()) {
    return absl::StrCat("cuda:", node.cuda_devices[0].ordinal);
  }
  return "emulated:0";
}

}  // namespace

PlanCheck CheckPlan(const Plan& plan, const std::vector<double>& step_seconds,
                    const std::vector<Timeline>& timelines, double threshold,
                    const std::map<TimelineResource, double>& dispatch_seconds) {
  PlanCheck check;
  check.predicted_step_seconds = plan.prediction().iteration_seconds();
  check.measured_step_seconds = profile::Median(step_seconds);
  std::map<TimelineResource, double> predicted = BusyByResource(plan.timeline());
  // The dispatch folded into each predicted call is idle time on the
  // measured resource, not busy time.
  for (const auto& span : plan.timeline().spans()) {
    auto it = dispatch_seconds.find(span.resource());
    if (it != dispatch_seconds.end()) predicted[span.resource()] -= it->second;
  }
  // Per resource, the median over the window's steps (a step where it did
  // nothing counts 0), as the step time is the window's median: one step
  // that stalled does not make a resource look busier than the steps are
  // long.
  std::map<TimelineResource, std::vector<double>> per_step;
  for (size_t i = 0; i < timelines.size(); ++i) {
    for (const auto& [resource, busy] : BusyByResource(timelines[i])) {
      std::vector<double>& v = per_step[resource];
      v.resize(timelines.size(), 0.0);
      v[i] = busy;
    }
  }
  std::map<TimelineResource, double> measured;
  for (const auto& [resource, busy] : per_step) measured[resource] = profile::Median(busy);
  std::map<TimelineResource, PlanCheck::Resource> all;
  for (const auto& [resource, busy] : predicted) all[resource].predicted_seconds = busy;
  for (const auto& [resource, busy] : measured) all[resource].measured_seconds = busy;
  for (auto& [resource, r] : all) {
    r.resource = resource;
    check.resources.push_back(r);
  }
  const double limit = std::abs(EffectiveThreshold(threshold));
  const double p = check.predicted_step_seconds;
  if (!(p > 0)) return check;
  const double m = check.measured_step_seconds;
  if (std::abs(m - p) > limit * p) {
    check.off = tandem::v1::REPLAN_REASON_STEP_TIME;
    check.because =
        absl::StrCat("step time ", Ms(m), " measured, ", Ms(p), " predicted (", Percent(m, p), ")");
    return check;
  }
  if (timelines.empty()) return check;
  for (const PlanCheck::Resource& r : check.resources) {
    if (std::abs(r.measured_seconds - r.predicted_seconds) > limit * p) {
      check.off = tandem::v1::REPLAN_REASON_RESOURCE_BUSY;
      check.because = absl::StrCat(profile::ResourceLabel(r.resource), " busy ",
                                   Ms(r.measured_seconds), " per step measured, ",
                                   Ms(r.predicted_seconds), " predicted (step ", Ms(p), ")");
      return check;
    }
  }
  return check;
}

bool SamePlacement(const Plan& a, const Plan& b) {
  if (a.strategy() != b.strategy() || a.micro_batch_size() != b.micro_batch_size() ||
      a.delayed_parameter_update() != b.delayed_parameter_update() ||
      a.accelerator_batch_share() != b.accelerator_batch_share() ||
      a.host_update_threads() != b.host_update_threads() || a.layers_size() != b.layers_size() ||
      std::max(1, a.state_prefetch_layers()) != std::max(1, b.state_prefetch_layers()) ||
      a.state_update_lag() != b.state_update_lag()) {
    return false;
  }
  for (int l = 0; l < a.layers_size(); ++l) {
    const auto &x = a.layers(l), &y = b.layers(l);
    if (x.compute() != y.compute() || x.parameter_home() != y.parameter_home() ||
        x.update() != y.update() || x.activation_policy() != y.activation_policy() ||
        x.stream_optimizer_state() != y.stream_optimizer_state()) {
      return false;
    }
  }
  if (a.pipeline_size() != b.pipeline_size()) return false;
  if (a.pipeline_size() > 0 &&
      (a.micro_batches() != b.micro_batches() || a.pipeline_schedule() != b.pipeline_schedule())) {
    return false;
  }
  for (int k = 0; k < a.pipeline_size(); ++k) {
    const auto &x = a.pipeline(k), &y = b.pipeline(k);
    if (x.device_index() != y.device_index() || x.first_layer() != y.first_layer() ||
        x.last_layer() != y.last_layer() || x.recompute() != y.recompute() ||
        x.offload_optimizer() != y.offload_optimizer() ||
        x.host_updated_layers() != y.host_updated_layers() ||
        x.stream_weights() != y.stream_weights() ||
        x.offload_activations() != y.offload_activations() ||
        x.wait_for_activation_copies() != y.wait_for_activation_copies()) {
      return false;
    }
  }
  return true;
}

namespace {

// A window's spans by layer, device (kHost, kAccelerator) and phase, and its
// copies by direction as (bytes, seconds).
class SpanSamples {
 public:
  SpanSamples(int layers, const std::vector<Timeline>& timelines)
      : layers_(layers),
        spans_(static_cast<size_t>(layers) * 2 * kPhases),
        recompute_(static_cast<size_t>(layers) * 2) {
    for (size_t step = 0; step < timelines.size(); ++step) {
      for (const auto& s : timelines[step].spans()) Add(s, static_cast<int>(step));
    }
  }
  // The spans' statistics; a recomputed layer's forward when it has no other.
  // Their mean is the median over the window's steps of each step's mean:
  // what recurs in every step (a stall per call, a slow micro-batch) counts,
  // as the step's sum of calls does, and a step that stalled once does not,
  // as the window's median step time (CheckPlan) leaves it out. (One
  // window's mean over all the calls predicted a cnn 52% slower than the
  // same median steps measured, 58.8 against 38.4 ms.)
  std::optional<tandem::v1::TimingStats> Stats(int layer, int device, int phase) const {
    const Samples* v = &Slot(layer, device, phase);
    if (v->seconds.empty() && phase == kForward) {
      v = &recompute_[static_cast<size_t>(layer) * 2 + device];
    }
    if (v->seconds.empty()) return std::nullopt;
    tandem::v1::TimingStats stats = profile::SummarizeTimings(v->seconds);
    std::map<int, std::pair<double, int>> by_step;
    for (size_t i = 0; i < v->seconds.size(); ++i) {
      auto& [sum, calls] = by_step[v->steps[i]];
      sum += v->seconds[i];
      ++calls;
    }
    std::vector<double> means;
    for (const auto& [step, sum_calls] : by_step) {
      means.push_back(sum_calls.first / sum_calls.second);
    }
    stats.set_mean_seconds(profile::Median(means));
    return stats;
  }
  const std::vector<std::pair<double, double>>& copies(bool to_device) const {
    return to_device ? h2d_ : d2h_;
  }

 private:
  struct Samples {
    std::vector<double> seconds;
    std::vector<int> steps;  // the timeline each came from
    void push_back(double x, int step) {
      seconds.push_back(x);
      steps.push_back(step);
    }
  };
  void Add(const tandem::v1::TimelineSpan& s, int step) {
    const double seconds = s.end_seconds() - s.start_seconds();
    if (s.bytes() > 0 && (s.resource() == tandem::v1::TIMELINE_RESOURCE_COPY_H2D ||
                          s.resource() == tandem::v1::TIMELINE_RESOURCE_COPY_D2H)) {
      (s.resource() == tandem::v1::TIMELINE_RESOURCE_COPY_H2D ? h2d_ : d2h_)
          .emplace_back(static_cast<double>(s.bytes()), seconds);
      return;
    }
    const int device = DeviceOf(s.resource());
    if (s.layer() < 0 || s.layer() >= layers_ || device < 0) return;
    switch (s.phase()) {
      case tandem::v1::TIMELINE_PHASE_FORWARD:
        return Slot(s.layer(), device, kForward).push_back(seconds, step);
      case tandem::v1::TIMELINE_PHASE_BACKWARD:
        return Slot(s.layer(), device, kBackward).push_back(seconds, step);
      case tandem::v1::TIMELINE_PHASE_UPDATE:
        return Slot(s.layer(), device, kUpdate).push_back(seconds, step);
      case tandem::v1::TIMELINE_PHASE_RECOMPUTE:
        return recompute_[static_cast<size_t>(s.layer()) * 2 + device].push_back(seconds, step);
      default:
        return;
    }
  }
  static int DeviceOf(TimelineResource resource) {
    switch (resource) {
      case tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE:
        return kAccelerator;
      case tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE:
      case tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE:
        return kHost;
      default:
        return -1;
    }
  }
  Samples& Slot(int layer, int device, int phase) {
    return spans_[(static_cast<size_t>(layer) * 2 + device) * kPhases + phase];
  }
  const Samples& Slot(int layer, int device, int phase) const {
    return spans_[(static_cast<size_t>(layer) * 2 + device) * kPhases + phase];
  }

  int layers_;
  std::vector<Samples> spans_;
  std::vector<Samples> recompute_;
  std::vector<std::pair<double, double>> h2d_, d2h_;
};

// Each layer phase's roofline on this node at the profile's micro-batch, and
// per device and phase what the measured phases took over their roofline (1
// where none was measured). A device's spans ran on `measured_samples[d]`
// samples each: the micro-batch, but hetero_dp's host replica runs its whole
// share at once.
class ScaledRoofline {
 public:
  ScaledRoofline(const planner::CostModel& roof, int micro, const int measured_samples[2],
                 int update_threads, const SpanSamples& samples, int layers, int devices)
      : roof_(roof),
        micro_(micro),
        measured_samples_{measured_samples[0], measured_samples[1]},
        update_threads_(update_threads) {
    double measured[2][kPhases] = {}, predicted[2][kPhases] = {};
    for (int l = 0; l < layers; ++l) {
      for (int d = 0; d < devices; ++d) {
        for (int p = 0; p < kPhases; ++p) {
          if (std::optional<tandem::v1::TimingStats> m = samples.Stats(l, d, p)) {
            measured[d][p] += m->mean_seconds();
            predicted[d][p] += Seconds(l, d, p, measured_samples_[d]);
          }
        }
      }
    }
    for (int d = 0; d < 2; ++d) {
      any_compute_ |= measured[d][kForward] > 0 || measured[d][kBackward] > 0;
      for (int p = 0; p < kPhases; ++p) {
        factor_[d][p] =
            measured[d][p] > 0 && predicted[d][p] > 0 ? measured[d][p] / predicted[d][p] : 1.0;
      }
    }
  }
  // At the profile's micro-batch, or at `samples`.
  double Seconds(int layer, int device, int phase, int samples = 0) const {
    const int n = samples > 0 ? samples : micro_;
    switch (phase) {
      case kForward:
        return roof_.ForwardSeconds(layer, Where(device), n);
      case kBackward:
        return roof_.BackwardSeconds(layer, Where(device), n);
      default:
        return roof_.UpdateSeconds(layer, Where(device), update_threads_);
    }
  }
  // A measured span of `phase` on `device` as it would take at the profile's
  // micro-batch (the planner scales it to each replica's share again).
  double AtProfileBatch(double seconds, int device, int phase) const {
    if (phase == kUpdate || measured_samples_[device] == micro_) return seconds;
    return roof_.ProfiledSeconds(seconds, Where(device), measured_samples_[device]);
  }
  double factor(int device, int phase) const { return factor_[device][phase]; }
  bool any_compute() const { return any_compute_; }
  bool HasPhase(int layer, int phase) const {
    return phase != kUpdate || roof_.UpdateBytes(layer) > 0;
  }

 private:
  static tandem::v1::Placement Where(int device) {
    return device == kHost ? tandem::v1::PLACEMENT_HOST : tandem::v1::PLACEMENT_ACCELERATOR;
  }
  const planner::CostModel& roof_;
  int micro_, measured_samples_[2], update_threads_;
  double factor_[2][kPhases] = {};
  bool any_compute_ = false;
};

// The host (its threads the plan's update threads, so that the measured
// update times are the ones the planner uses) and the accelerator.
void AddDevices(const tandem::v1::HardwareSpec& hw, const std::string ids[2], int update_threads,
                int64_t capacity, Profile& profile) {
  profile.clear_devices();
  tandem::v1::DeviceProfile* host = profile.add_devices();
  host->set_id(ids[kHost]);
  host->set_kind(tandem::v1::DEVICE_KIND_CPU);
  host->set_name(hw.host().name());
  host->set_threads(update_threads);
  host->set_memory_bytes(hw.host().memory_bytes());
  host->set_memory_bandwidth_bytes_per_second(hw.host().memory_bandwidth_bytes_per_second());
  host->set_gemm_flops_per_second(hw.host().peak_matmul_flops_per_second());
  host->set_single_thread_gemm_flops_per_second(hw.host().single_thread_matmul_flops_per_second());
  if (hw.accelerators_size() == 0) return;
  const tandem::v1::ProcessorSpec& a = hw.accelerators(0);
  tandem::v1::DeviceProfile* accel = profile.add_devices();
  accel->set_id(ids[kAccelerator]);
  accel->set_kind(a.kind());
  accel->set_name(a.name());
  accel->set_threads(a.threads());
  accel->set_memory_bytes(capacity);
  accel->set_memory_bandwidth_bytes_per_second(a.memory_bandwidth_bytes_per_second());
  accel->set_gemm_flops_per_second(a.peak_matmul_flops_per_second());
  accel->set_single_thread_gemm_flops_per_second(a.single_thread_matmul_flops_per_second());
}

// Every layer's phases on every device: measured, else the scaled roofline
// (marked). Counts measured and existing phases per device.
// `t`'s times (measured on the device's own batch) as at the profile's.
void ToProfileBatch(const ScaledRoofline& roofline, int device, int phase,
                    tandem::v1::TimingStats& t) {
  auto at = [&](double s) { return roofline.AtProfileBatch(s, device, phase); };
  const double spread = t.mean_seconds() > 0 ? at(t.mean_seconds()) / t.mean_seconds() : 1.0;
  t.set_median_seconds(at(t.median_seconds()));
  t.set_p10_seconds(at(t.p10_seconds()));
  t.set_p90_seconds(at(t.p90_seconds()));
  t.set_min_seconds(at(t.min_seconds()));
  t.set_max_seconds(at(t.max_seconds()));
  t.set_mean_seconds(at(t.mean_seconds()));
  t.set_stddev_seconds(t.stddev_seconds() * spread);
}

void AddLayerTimings(const SpanSamples& samples, const ScaledRoofline& roofline,
                     const std::string ids[2], int devices, int measured[2], int phases[2],
                     Profile& profile) {
  for (int l = 0; l < profile.layers_size(); ++l) {
    tandem::v1::LayerProfile* layer = profile.mutable_layers(l);
    layer->clear_devices();
    for (int d = 0; d < devices; ++d) {
      tandem::v1::LayerDeviceProfile* ld = layer->add_devices();
      ld->set_device_id(ids[d]);
      for (int p = 0; p < kPhases; ++p) {
        tandem::v1::TimingStats* timing = PhaseOf(*ld, p)->mutable_timing();
        const bool exists = roofline.HasPhase(l, p);
        phases[d] += exists;
        if (std::optional<tandem::v1::TimingStats> m = samples.Stats(l, d, p)) {
          ++measured[d];
          *timing = *std::move(m);
          ToProfileBatch(roofline, d, p, *timing);
          continue;
        }
        const double f = roofline.factor(d, p);
        timing->set_samples(1);
        timing->set_median_seconds(exists ? roofline.Seconds(l, d, p) * f : 0.0);
        timing->set_mean_seconds(timing->median_seconds());
        tandem::v1::Counter* c = PhaseOf(*ld, p)->add_counters();
        c->set_name("roofline_scaled_by");
        c->set_value(f);
        c->set_unit("ratio");
      }
    }
  }
}

// The host links, fitted to the copies, else NodeHardware's figure; their
// description for the summary.
std::string AddLinks(const SpanSamples& samples, const tandem::v1::HardwareSpec& hw,
                     const std::string ids[2], Profile& profile) {
  std::string links;
  for (const bool to_device : {true, false}) {
    const tandem::v1::LinkSpec& spec =
        to_device ? hw.host_to_accelerator() : hw.accelerator_to_host();
    const LinkFit fit = FitLink(samples.copies(to_device));
    const bool measured = fit.bytes_per_second > 0;
    tandem::v1::LinkProfile* link = profile.add_links();
    link->set_from_device_id(ids[to_device ? kHost : kAccelerator]);
    link->set_to_device_id(ids[to_device ? kAccelerator : kHost]);
    link->set_direction(to_device ? tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE
                                  : tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST);
    link->set_pinned(true);
    link->set_bandwidth_bytes_per_second(measured ? fit.bytes_per_second
                                                  : spec.bandwidth_bytes_per_second());
    link->set_latency_seconds(measured ? fit.latency_seconds : spec.latency_seconds());
    absl::StrAppend(&links, links.empty() ? "" : ", ", to_device ? "H2D " : "D2H ",
                    absl::StrFormat("%.2f GB/s", link->bandwidth_bytes_per_second() / 1e9),
                    measured ? absl::StrCat(" (", fit.copies, " copies)") : " (not measured)");
  }
  return links;
}

}  // namespace

absl::StatusOr<Profile> MeasuredLayerProfile(const Model& model, const JobSpec& resolved,
                                             const NodeOffer& node, const Plan& plan,
                                             const std::vector<Timeline>& timelines,
                                             std::string* summary) {
  const int micro = plan.micro_batch_size() > 0
                        ? plan.micro_batch_size()
                        : static_cast<int>(resolved.training().batch_size());
  Profile profile = profile::AnalyticProfile(model, resolved.optimizer(), micro);
  const bool accelerated = resolved.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE;
  int64_t capacity = 0;
  if (accelerated) {
    TANDEM_ASSIGN_OR_RETURN(capacity, AcceleratorCapacity(resolved, node));
  }
  TANDEM_ASSIGN_OR_RETURN(const tandem::v1::HardwareSpec hw,
                          NodeHardware(resolved, node, capacity));
  TANDEM_ASSIGN_OR_RETURN(const planner::CostModel roof,
                          planner::CostModel::FromHardwareSpec(profile, hw));
  const int devices = accelerated ? 2 : 1;
  const int update_threads = plan.host_update_threads() > 0 ? plan.host_update_threads()
                                                            : std::max(1, hw.host().threads());
  const SpanSamples samples(model.num_layers(), timelines);
  // hetero_dp's host replica runs its share of the batch in one pass.
  const int host_share = plan.strategy() == tandem::v1::STRATEGY_HETERO_DP && plan.batch_size() > 0
                             ? static_cast<int>(plan.batch_size() - plan.accelerator_batch_share())
                             : micro;
  const int measured_samples[2] = {std::max(1, host_share), micro};
  const ScaledRoofline roofline(roof, micro, measured_samples, update_threads, samples,
                                model.num_layers(), devices);
  if (!roofline.any_compute()) {
    return absl::FailedPreconditionError(
        "no forward or backward span was measured: nothing to build a layer profile from");
  }
  const std::string ids[2] = {"cpu", AcceleratorId(resolved, node)};
  AddDevices(hw, ids, update_threads, capacity, profile);
  int measured[2] = {0, 0}, phases[2] = {0, 0};
  AddLayerTimings(samples, roofline, ids, devices, measured, phases, profile);
  const std::string links = accelerated ? AddLinks(samples, hw, ids, profile) : "";
  auto& provenance = *profile.mutable_provenance();
  provenance.set_source("measured");
  // A step takes the sum of its calls: the mean, stalls included, is what
  // the planner should add up.
  provenance.set_planning_statistic(tandem::v1::TIMING_STATISTIC_MEAN);
  *provenance.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  provenance.set_iterations(static_cast<int>(timelines.size()));
  if (node.profile) (*provenance.mutable_versions())["node"] = node.profile->fingerprint();
  auto f = [&](int d, int p) { return roofline.factor(d, p); };
  provenance.set_note(absl::StrFormat(
      "host %d of %d layer phases measured, accelerator %d of %d (the rest the roofline scaled "
      "by what the measured ones took over theirs: host x%.2f/x%.2f/x%.2f, accelerator "
      "x%.2f/x%.2f/x%.2f forward/backward/update)%s%s",
      measured[kHost], phases[kHost], measured[kAccelerator], phases[kAccelerator],
      f(kHost, kForward), f(kHost, kBackward), f(kHost, kUpdate), f(kAccelerator, kForward),
      f(kAccelerator, kBackward), f(kAccelerator, kUpdate), links.empty() ? "" : "; links ",
      links));
  if (summary != nullptr) {
    *summary = absl::StrCat("measured from ", timelines.size(), " steps: ", provenance.note());
  }
  return profile;
}

// ---- LayerProfileCache ----

std::string LayerProfileCache::Key(const Model& model, const JobSpec& resolved,
                                   const NodeOffer& node) {
  if (!node.profile) return "";
  // v2: 16-bit layers save their products' inputs for backward (other
  // activation bytes and times than v1's). v3: the threads and ranks; a
  // distributed job's profile is one rank's, for its share of the batch.
  const int ranks = std::max(1, resolved.distributed().replicas());
  return profile::HexKey(absl::StrCat(
      "layer-profile-v3|model=", model.fingerprint(), "|batch=", RankBatch(resolved, ranks),
      "|ranks=", ranks, "|threads=", resolved.training().threads(), "|optimizer=",
      resolved.optimizer().kind(), "|precision=", PrecisionName(resolved.precision()),
      "|accelerator=", resolved.placement().accelerator(),
      "|link=", resolved.resources().emulated_link_bytes_per_second(), "|throttle=",
      node.emulated_link_throttle_bytes_per_second, "|node=", node.profile->fingerprint()));
}

std::string LayerProfileCache::PathOf(const std::string& key) const {
  return files_.ProfilePath(key);
}

std::optional<Profile> LayerProfileCache::Load(const Model& model, const JobSpec& resolved,
                                               const NodeOffer& node) const {
  const std::string key = Key(model, resolved, node);
  if (!files_.enabled() || key.empty()) return std::nullopt;
  const std::string path = PathOf(key);
  std::optional<Profile> profile = files_.Load(key);
  std::string problem;
  if (!profile) {
    if (!std::filesystem::exists(path)) return std::nullopt;  // none yet
    problem = "it does not parse, or was stored for another model or node";
  } else if (profile->layers_size() != model.num_layers()) {
    problem =
        absl::StrCat("it has ", profile->layers_size(), " layers, the model ", model.num_layers());
  } else if (profile->provenance().versions().count("node") == 0 ||
             profile->provenance().versions().at("node") != node.profile->fingerprint()) {
    problem = "it was measured on other hardware";
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "tandemd: ignoring the cached layer profile %s: %s\n", path.c_str(),
                 problem.c_str());
    return std::nullopt;
  }
  return profile;
}

absl::Status LayerProfileCache::Store(const Model& model, const JobSpec& resolved,
                                      const NodeOffer& node, Profile profile) const {
  const std::string key = Key(model, resolved, node);
  if (!files_.enabled() || key.empty()) return absl::OkStatus();
  profile.mutable_provenance()->set_cache_key(key);
  return files_.Store(key, profile, /*chrome_trace_json=*/"");
}

std::string CollectiveProfileCache::Key(const JobSpec& resolved, const NodeOffer& node) {
  const tandem::v1::DistributedSpec& d = resolved.distributed();
  if (!node.profile || d.replicas() <= 1) return "";
  return profile::HexKey(absl::StrCat(
      "collectives-v1|ranks=", d.replicas(), "|nodes=", absl::StrJoin(d.nodes(), ","),
      "|backend=", d.backend(), "|accelerator=", resolved.placement().accelerator(),
      "|threads=", resolved.training().threads(),
      "|link=", resolved.resources().emulated_link_bytes_per_second(), "|throttle=",
      node.emulated_link_throttle_bytes_per_second, "|node=", node.profile->fingerprint()));
}

namespace {

// <dir>/<key><suffix>: a proto whose cache_key() is `key`, or nothing (no
// file, one that does not parse, or one stored under another key).
template <typename Proto>
std::optional<Proto> LoadKeyed(const std::string& dir, const std::string& key,
                               absl::string_view suffix) {
  if (dir.empty() || key.empty()) return std::nullopt;
  std::optional<std::string> bytes = ReadWholeFile(absl::StrCat(dir, "/", key, suffix));
  Proto proto;
  if (!bytes || !proto.ParseFromString(*bytes) || proto.cache_key() != key) return std::nullopt;
  return proto;
}

// Writes `proto` (its cache_key set to `key`) to <dir>/<key><suffix>,
// atomically, creating `dir`.
template <typename Proto>
absl::Status StoreKeyed(const std::string& dir, const std::string& key, absl::string_view suffix,
                        Proto proto) {
  if (dir.empty() || key.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", ec.message()));
  proto.set_cache_key(key);
  return WriteFileAtomically(absl::StrCat(dir, "/", key, suffix), proto.SerializeAsString());
}

constexpr absl::string_view kCollectivesSuffix = ".collectives.pb";
constexpr absl::string_view kCorrectionsSuffix = ".corrections.pb";

bool IsCollectiveFit(const tandem::v1::CollectiveFit& f) {
  return (f.phase() == tandem::v1::TIMELINE_PHASE_ALL_REDUCE ||
          f.phase() == tandem::v1::TIMELINE_PHASE_REDUCE_SCATTER ||
          f.phase() == tandem::v1::TIMELINE_PHASE_ALL_GATHER) &&
         f.bytes_per_second() > 0 && f.latency_seconds() >= 0;
}

}  // namespace

std::optional<tandem::v1::CollectiveProfile> CollectiveProfileCache::Load(
    const JobSpec& resolved, const NodeOffer& node) const {
  std::optional<tandem::v1::CollectiveProfile> profile =
      LoadKeyed<tandem::v1::CollectiveProfile>(dir_, Key(resolved, node), kCollectivesSuffix);
  if (!profile || profile->fits_size() == 0) return std::nullopt;
  for (const tandem::v1::CollectiveFit& f : profile->fits()) {
    if (!IsCollectiveFit(f)) return std::nullopt;
  }
  return profile;
}

absl::Status CollectiveProfileCache::Store(const JobSpec& resolved, const NodeOffer& node,
                                           tandem::v1::CollectiveProfile profile) const {
  profile.set_ranks(resolved.distributed().replicas());
  return StoreKeyed(dir_, Key(resolved, node), kCollectivesSuffix, std::move(profile));
}

std::string PipelineCorrectionCache::Key(const Model& model, const JobSpec& resolved,
                                         const NodeOffer& node, const Profile* base) {
  const tandem::v1::PipelineSpec& pipe = resolved.placement().pipeline();
  if (!node.profile || pipe.stages() < 2) return "";
  const std::string from = base == nullptr
                               ? "analytic"
                               : absl::StrCat(base->provenance().cache_key(), "@",
                                              base->provenance().create_time().seconds(), ".",
                                              base->provenance().create_time().nanos());
  return profile::HexKey(absl::StrCat(
      "pipeline-corrections-v1|model=", model.fingerprint(),
      "|batch=", resolved.training().batch_size(), "|threads=", resolved.training().threads(),
      "|stages=", pipe.stages(), "|schedule=", pipe.schedule(), "|micro_batches=",
      pipe.micro_batches(), "|micro_batch=", resolved.placement().micro_batch_size(),
      "|continuous=", pipe.continuous(), "|vertical_sync=", pipe.vertical_sync(),
      "|strategy=", resolved.placement().strategy(), "|optimizer=", resolved.optimizer().kind(),
      "|precision=", PrecisionName(resolved.precision()),
      "|accelerator=", resolved.placement().accelerator(),
      "|capacity=", resolved.resources().accelerator_memory_bytes(),
      "|link=", resolved.resources().emulated_link_bytes_per_second(),
      "|throttle=", node.emulated_link_throttle_bytes_per_second, "|peer=", node.emulated_peer_link,
      "|node=", node.profile->fingerprint(), "|from=", from));
}

std::optional<tandem::v1::PipelineCorrectionProfile> PipelineCorrectionCache::Load(
    const Model& model, const JobSpec& resolved, const NodeOffer& node, const Profile* base) const {
  std::optional<tandem::v1::PipelineCorrectionProfile> profile =
      LoadKeyed<tandem::v1::PipelineCorrectionProfile>(dir_, Key(model, resolved, node, base),
                                                       kCorrectionsSuffix);
  if (!profile || profile->compute_scale_size() != model.num_layers() ||
      profile->update_scale_size() != model.num_layers()) {
    return std::nullopt;
  }
  return profile;
}

absl::Status PipelineCorrectionCache::Store(const Model& model, const JobSpec& resolved,
                                            const NodeOffer& node, const Profile* base,
                                            tandem::v1::PipelineCorrectionProfile profile) const {
  return StoreKeyed(dir_, Key(model, resolved, node, base), kCorrectionsSuffix, std::move(profile));
}

void PipelineCorrectionCache::Forget(const Model& model, const JobSpec& resolved,
                                     const NodeOffer& node, const Profile* base) const {
  const std::string key = Key(model, resolved, node, base);
  if (dir_.empty() || key.empty()) return;
  std::error_code ec;
  std::filesystem::remove(absl::StrCat(dir_, "/", key, kCorrectionsSuffix), ec);
}

tandem::v1::PipelineCorrectionProfile CorrectionProfileOf(const PipelineCorrections& c) {
  tandem::v1::PipelineCorrectionProfile p;
  p.mutable_compute_scale()->Add(c.compute_scale.begin(), c.compute_scale.end());
  p.mutable_update_scale()->Add(c.update_scale.begin(), c.update_scale.end());
  return p;
}

PipelineCorrections CorrectionsOf(const tandem::v1::PipelineCorrectionProfile& profile) {
  PipelineCorrections c;
  c.compute_scale.assign(profile.compute_scale().begin(), profile.compute_scale().end());
  c.update_scale.assign(profile.update_scale().begin(), profile.update_scale().end());
  c.note = absl::StrCat("corrected by what job ", profile.job_id(),
                        "'s stages measured: ", profile.measured());
  return c;
}

std::map<TimelineResource, double> DispatchSeconds(const std::vector<Timeline>& measured,
                                                   const Timeline& simulated) {
  std::map<TimelineResource, double> dispatch;
  if (measured.empty()) return dispatch;
  for (TimelineResource r : {tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                             tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE}) {
    double idle = 0, spans = 0;
    for (const Timeline& t : measured) {
      const auto [i, n] = IdleBetweenSpans(t, r);
      idle += i / static_cast<double>(measured.size());
      spans += n / static_cast<double>(measured.size());
    }
    const double simulated_idle = IdleBetweenSpans(simulated, r).first;
    if (spans >= 1 && idle > simulated_idle) dispatch[r] = (idle - simulated_idle) / spans;
  }
  return dispatch;
}

std::map<TimelineResource, double> DispatchOf(const tandem::v1::PlanPrediction& prediction) {
  std::map<TimelineResource, double> dispatch;
  if (prediction.accelerator_dispatch_seconds() > 0) {
    dispatch[tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE] =
        prediction.accelerator_dispatch_seconds();
  }
  if (prediction.host_dispatch_seconds() > 0) {
    dispatch[tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE] = prediction.host_dispatch_seconds();
  }
  return dispatch;
}

void SetDispatch(const std::map<TimelineResource, double>& dispatch,
                 tandem::v1::PlanPrediction* prediction) {
  auto of = [&](TimelineResource r) {
    const auto it = dispatch.find(r);
    return it == dispatch.end() ? 0.0 : it->second;
  };
  prediction->set_accelerator_dispatch_seconds(
      of(tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE));
  prediction->set_host_dispatch_seconds(of(tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE));
}

void AddDispatch(const std::map<TimelineResource, double>& dispatch, Profile& profile) {
  // Said in the profile, so that a plan solved from it says what its
  // prediction charges per call (PlanJob), and its check does not count it
  // as busy time.
  tandem::v1::PlanPrediction charged;
  SetDispatch(dispatch, &charged);
  profile.mutable_provenance()->set_accelerator_dispatch_seconds(
      charged.accelerator_dispatch_seconds());
  profile.mutable_provenance()->set_host_dispatch_seconds(charged.host_dispatch_seconds());
  for (auto& layer : *profile.mutable_layers()) {
    for (auto& device : *layer.mutable_devices()) {
      const TimelineResource r = device.device_id() == "cpu"
                                     ? tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE
                                     : tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
      auto it = dispatch.find(r);
      if (it == dispatch.end()) continue;
      auto charge = [&](tandem::v1::PhaseProfile* phase) {
        tandem::v1::TimingStats* t = phase->mutable_timing();
        t->set_median_seconds(t->median_seconds() + it->second);
        t->set_mean_seconds(t->mean_seconds() + it->second);
      };
      charge(device.mutable_forward());
      charge(device.mutable_backward());
      // Host updates run on the update pool, not the compute stream.
      if (r == tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE &&
          device.update().timing().median_seconds() > 0) {
        charge(device.mutable_update());
      }
    }
  }
}

// ---- PlanLoop ----

absl::StatusOr<Plan> PlanLoop::Resimulate(const Plan& plan, const Profile& measured,
                                          const planner::SimulationOptions& options) const {
  TANDEM_ASSIGN_OR_RETURN(planner::CostModel cost,
                          planner::CostModel::FromMeasuredProfile(measured));
  cost.set_clips_gradients(planner::ClipsGradients(resolved_));
  TANDEM_ASSIGN_OR_RETURN(const planner::SimulationResult sim,
                          planner::PlanSimulator(cost).Simulate(plan, options));
  return TimedBy(plan, sim, "re-simulated with measured figures");
}

PlanLoop::PlanLoop(const Model& model, JobSpec resolved, NodeOffer node, Plan plan,
                   PlanLoopOptions options)
    : model_(model),
      resolved_(std::move(resolved)),
      node_(std::move(node)),
      plan_(std::move(plan)),
      options_(options),
      forced_(resolved_.placement().has_plan()) {
  if (options_.threshold == 0) options_.threshold = resolved_.placement().replan_threshold();
  if (options_.threshold == 0) options_.threshold = kDefaultReplanThreshold;
  done_ = plan_.layers_size() == 0;  // the CPU engine: nothing predicted
  // A plan solved from a closed-loop profile charged its dispatch already.
  dispatch_ = DispatchOf(plan_.prediction());
}

double PlanLoop::plan_measured_seconds() const {
  return plan_seconds_.empty() ? 0 : profile::Median(plan_seconds_);
}

PlanLoop::Outcome PlanLoop::AfterStep(double step_seconds, const Timeline& timeline,
                                      const std::vector<tandem::v1::PipelineStageStats>& stages) {
  if (++steps_ <= options_.warmup_steps) return {};
  if (plan_seconds_.size() < kPlanStepsKept) plan_seconds_.push_back(step_seconds);
  if (done_) return {};
  window_seconds_.push_back(step_seconds);
  if (timeline.spans_size() > 0) window_timelines_.push_back(timeline);
  if (!stages.empty()) window_stages_.push_back(stages);
  if (static_cast<int>(window_seconds_.size()) < options_.window_steps) return {};
  const PlanCheck check =
      CheckPlan(plan_, window_seconds_, window_timelines_, options_.threshold, dispatch_);
  // A distributed job's collectives, fitted once: for its re-time
  // (RetimeRank) and for the next job's prediction.
  if (distributed()) window_collectives_ = FitCollectives(window_timelines_);
  Outcome out = Decide(check);
  out.check = check;
  if (distributed() && window_collectives_.ok()) out.collectives = *window_collectives_;
  window_seconds_.clear();
  window_timelines_.clear();
  window_stages_.clear();
  return out;
}

PlanLoop::Outcome PlanLoop::Decide(const PlanCheck& check) {
  Outcome out;
  if (previous_ && check.measured_step_seconds > previous_measured_ * (1 + kSlowerMargin)) {
    out.decision = SwitchBack(check);
    out.log = absl::StrCat("plan check: the new plan is slower (", out.decision->because,
                           "): switching back, and re-planning no more in this run");
    return out;
  }
  if (check.off == tandem::v1::REPLAN_REASON_UNSPECIFIED) {
    done_ = true;
    out.log = absl::StrCat(
        "plan check: step ", Ms(check.measured_step_seconds), " measured, ",
        Ms(check.predicted_step_seconds), " predicted (",
        Percent(check.measured_step_seconds, check.predicted_step_seconds), "), within the ",
        absl::StrFormat("%.0f%%", std::abs(options_.threshold) * 100), " threshold");
    return out;
  }
  auto stop = [&](absl::string_view why) {
    done_ = true;
    out.log = absl::StrCat("plan check: ", check.because, "; ", why);
    return out;
  };
  if (const std::string why = WhyNotReplan(); !why.empty()) return stop(why);
  const auto began = std::chrono::steady_clock::now();
  // A distributed job's ranks run one pinned plan: it is re-timed, never
  // replaced.
  absl::StatusOr<Decision> d = distributed() ? RetimeRank(check) : Replan(check);
  if (!d.ok()) {
    return stop(distributed() ? absl::StrCat("not re-planning a distributed job (its ranks run "
                                             "one pinned rank plan), and cannot re-time it: ",
                                             d.status().message())
                              : absl::StrCat("cannot re-plan: ", d.status().message()));
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  out.log = absl::StrCat(
      "plan check: ", check.because, "; ",
      d->placement_changed
          ? absl::StrCat("re-planned from measured figures: a new placement, ",
                         Ms(d->plan.prediction().iteration_seconds()), " predicted against ",
                         Ms(d->replaced_timed->prediction().iteration_seconds()),
                         " for the running one")
          : absl::StrCat("re-calibrated from measured figures: the same placement, ",
                         Ms(d->plan.prediction().iteration_seconds()), " predicted"),
      " (", d->cost_source, absl::StrFormat("; re-planning took %.3f s)", seconds));
  out.decision = *std::move(d);
  return out;
}

PlanLoop::Decision PlanLoop::SwitchBack(const PlanCheck& check) const {
  Decision d;
  d.plan = *previous_;
  d.placement_changed = true;
  d.reason = tandem::v1::REPLAN_REASON_SLOWER;
  d.because = absl::StrCat("it measured ", Ms(check.measured_step_seconds),
                           " per step, the plan before it ", Ms(previous_measured_));
  d.check = check;
  d.cost_source = "the plan it had replaced, timed with the figures measured under it";
  return d;
}

std::string PlanLoop::WhyNotReplan() const {
  if (options_.threshold < 0) return "not re-planning (placement.replan_threshold < 0)";
  if (forced_) return "not re-planning a forced plan (placement.plan)";
  if (distributed() && recalibrated_) {
    return "still off after re-timing the rank plan from what rank 0 measured; not "
           "re-planning a distributed job (its ranks run one rank plan, pinned when the run "
           "starts, and would have to switch together)";
  }
  if (recalibrated_) {
    return "still off after re-calibrating from measured spans (time the simulator does not "
           "model); not re-planning again in this run";
  }
  if (replans_ >= options_.max_replans) {
    return absl::StrCat("not re-planning: ", replans_, " re-plans already in this run");
  }
  return "";
}

namespace {

// Measured over predicted, within [1/16, 16]; 1 when either is unknown.
double Factor(double measured, double predicted) {
  if (!(measured > 0) || !(predicted > 0)) return 1;
  return std::clamp(measured / predicted, 1.0 / 16, 16.0);
}

// Per layer of `base` (the running split as the planner times it without
// corrections), its stage's factors: measured compute (busy plus copies: a
// stage's thread runs both in turn) and update over `base`'s, the medians
// over the window's `steps`. What each stage measured is appended to `said`.
absl::StatusOr<PipelineCorrections> StageCorrections(
    const Plan& base, const std::vector<std::vector<tandem::v1::PipelineStageStats>>& steps,
    int layers, std::string* said) {
  const int K = base.pipeline_size();
  const int M = std::max(1, base.micro_batches());
  const bool pipedream = base.pipeline_schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
  PipelineCorrections out;
  out.compute_scale.assign(layers, 1.0);
  out.update_scale.assign(layers, 1.0);
  for (int k = 0; k < K; ++k) {
    std::vector<double> busy, update;
    for (const auto& step : steps) {
      if (static_cast<int>(step.size()) != K) {
        return absl::FailedPreconditionError(
            absl::StrCat("a step reported ", step.size(), " stages; the plan has ", K));
      }
      busy.push_back(step[k].busy_seconds() + step[k].copy_seconds());
      update.push_back(step[k].update_seconds());
    }
    const tandem::v1::PipelineStage& st = base.pipeline(k);
    if (st.first_layer() < 0 || st.last_layer() >= layers) {
      return absl::FailedPreconditionError(absl::StrCat("pipeline[", k, "] is outside the model"));
    }
    const double predicted_busy = M * st.compute_seconds();
    const double predicted_update = (pipedream ? M : 1) * st.update_seconds();
    const double f = Factor(profile::Median(busy), predicted_busy);
    const double g = Factor(profile::Median(update), predicted_update);
    for (int l = st.first_layer(); l <= st.last_layer(); ++l) {
      out.compute_scale[l] = f;
      out.update_scale[l] = g;
    }
    absl::StrAppend(said, k == 0 ? " " : ", ", "stage ", k, " compute ", Ms(profile::Median(busy)),
                    " per step against ", Ms(predicted_busy), " predicted, update ",
                    Ms(profile::Median(update)), " against ", Ms(predicted_update));
  }
  return out;
}

}  // namespace

absl::StatusOr<PlanLoop::Decision> PlanLoop::ReplanPipeline(const PlanCheck& check) const {
  const int K = plan_.pipeline_size();
  if (window_stages_.empty()) {
    return absl::FailedPreconditionError("the window holds no stage figures");
  }
  // The running split as the planner times it without corrections, from
  // the same cost source as every plan below: the factors are measured over
  // its figures, so that the split re-timed with them is what was measured
  // whatever an earlier correction (or a resumed run's stored plan) said.
  TANDEM_ASSIGN_OR_RETURN(const JobSpec staged, ChosenStages(resolved_, plan_));
  const Profile* from = planned_from_ ? &*planned_from_ : nullptr;
  PipelineCorrections as_running;
  as_running.stages.assign(plan_.pipeline().begin(), plan_.pipeline().end());
  TANDEM_ASSIGN_OR_RETURN(const Plan base,
                          PlanPipelineJob(model_, staged, node_, from, &as_running));
  if (base.pipeline_size() != K) {
    return absl::FailedPreconditionError(absl::StrCat("the running split timed again has ",
                                                      base.pipeline_size(), " stages, not ", K));
  }
  Decision d;
  d.cost_source = absl::StrCat("the stages' figures over ", window_stages_.size(), " steps:");
  TANDEM_ASSIGN_OR_RETURN(
      PipelineCorrections next,
      StageCorrections(base, window_stages_, model_.num_layers(), &d.cost_source));
  PipelineCorrections same = next;
  same.stages.assign(plan_.pipeline().begin(), plan_.pipeline().end());
  TANDEM_ASSIGN_OR_RETURN(Plan current, PlanPipelineJob(model_, staged, node_, from, &same));
  TANDEM_ASSIGN_OR_RETURN(Plan split, PlanPipelineJob(model_, staged, node_, from, &next));
  const double now = current.prediction().iteration_seconds();
  const double then = split.prediction().iteration_seconds();
  const bool other = split.feasible() && !SamePlacement(split, plan_);
  // Under PipeDream a layer's staleness is its stage's (K-s-1): moving a cut
  // changes how stale its gradients are, so a new split is another training.
  const bool pipedream = plan_.pipeline_schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
  d.placement_changed = other && !pipedream && then < now * (1 - kMinGain);
  if (other) {
    std::vector<std::string> cuts;
    for (const auto& st : split.pipeline()) {
      cuts.push_back(absl::StrCat(st.first_layer(), "-", st.last_layer()));
    }
    absl::StrAppend(&d.cost_source, "; the best split from them, layers ",
                    absl::StrJoin(cuts, " | "), ", is predicted ", Ms(then),
                    d.placement_changed ? ""
                    : pipedream         ? ", not taken: under PipeDream a new split would change "
                                          "its layers' staleness"
                                        : ", which gains too little");
  }
  d.plan = d.placement_changed ? std::move(split) : current;
  d.replaced_timed = std::move(current);
  d.corrections = std::move(next);
  d.reason = check.off;
  d.because = check.because;
  d.check = check;
  return d;
}

namespace {

constexpr std::pair<tandem::v1::TimelinePhase, schedule::OpKind> kCollectiveKinds[] = {
    {tandem::v1::TIMELINE_PHASE_ALL_REDUCE, schedule::OpKind::kAllReduce},
    {tandem::v1::TIMELINE_PHASE_REDUCE_SCATTER, schedule::OpKind::kReduceScatter},
    {tandem::v1::TIMELINE_PHASE_ALL_GATHER, schedule::OpKind::kAllGather}};

// A partitioned rank's host updates step its piece of each bucket (rank 0's
// spans measured those); the simulator divides every layer's host update by
// the ranks itself, so the measured figures go in for the whole layer.
void ScaleHostUpdates(double factor, Profile& profile) {
  for (auto& layer : *profile.mutable_layers()) {
    for (auto& device : *layer.mutable_devices()) {
      if (device.device_id() != "cpu") continue;
      tandem::v1::TimingStats* t = device.mutable_update()->mutable_timing();
      t->set_median_seconds(t->median_seconds() * factor);
      t->set_mean_seconds(t->mean_seconds() * factor);
    }
  }
}

}  // namespace

absl::StatusOr<tandem::v1::CollectiveProfile> FitCollectives(
    const std::vector<Timeline>& timelines) {
  tandem::v1::CollectiveProfile out;
  for (const auto& [phase, kind] : kCollectiveKinds) {
    std::vector<std::pair<double, double>> calls;
    for (const Timeline& t : timelines) {
      for (const auto& span : t.spans()) {
        if (span.resource() != tandem::v1::TIMELINE_RESOURCE_NETWORK || span.phase() != phase ||
            span.bytes() <= 0) {
          continue;
        }
        calls.emplace_back(static_cast<double>(span.bytes()),
                           span.end_seconds() - span.start_seconds());
      }
    }
    const LinkFit fit = FitLink(calls);
    if (fit.bytes_per_second <= 0) continue;
    tandem::v1::CollectiveFit* f = out.add_fits();
    f->set_phase(phase);
    f->set_bytes_per_second(fit.bytes_per_second);
    f->set_latency_seconds(fit.latency_seconds);
    f->set_calls(fit.copies);
  }
  if (out.fits_size() == 0) return absl::FailedPreconditionError("no collective was measured");
  return out;
}

std::string DescribeCollectives(const tandem::v1::CollectiveProfile& profile) {
  std::string said;
  for (const tandem::v1::CollectiveFit& f : profile.fits()) {
    const std::string& name = tandem::v1::TimelinePhase_Name(f.phase());
    absl::StrAppend(&said, said.empty() ? "" : ", ", f.calls(), " ",
                    name.size() > 15 ? name.substr(15) : absl::StrCat("phase ", f.phase()),
                    absl::StrFormat(" at %.2f GB/s + %.0f us", f.bytes_per_second() / 1e9,
                                    f.latency_seconds() * 1e6));
  }
  return said;
}

std::function<double(schedule::OpKind, int64_t)> CollectiveSeconds(
    const tandem::v1::CollectiveProfile& profile) {
  std::map<schedule::OpKind, tandem::v1::CollectiveFit> fits;
  for (const tandem::v1::CollectiveFit& f : profile.fits()) {
    for (const auto& [phase, kind] : kCollectiveKinds) {
      if (f.phase() == phase && f.bytes_per_second() > 0) fits[kind] = f;
    }
  }
  return [fits](schedule::OpKind kind, int64_t bytes) {
    auto seconds = [&](schedule::OpKind k) -> std::optional<double> {
      auto it = fits.find(k);
      if (it == fits.end()) return std::nullopt;
      return it->second.latency_seconds() +
             static_cast<double>(bytes) / it->second.bytes_per_second();
    };
    if (std::optional<double> s = seconds(kind)) return *s;
    if (kind == schedule::OpKind::kAllReduce) {
      for (schedule::OpKind phase :
           {schedule::OpKind::kReduceScatter, schedule::OpKind::kAllGather}) {
        if (std::optional<double> s = seconds(phase)) return 2 * *s;
      }
      return 0.0;
    }
    if (const std::optional<double> all = seconds(schedule::OpKind::kAllReduce)) return *all / 2;
    // The other phase of the two.
    const schedule::OpKind other = kind == schedule::OpKind::kReduceScatter
                                       ? schedule::OpKind::kAllGather
                                       : schedule::OpKind::kReduceScatter;
    return seconds(other).value_or(0.0);
  };
}

planner::SimulationOptions RankSimulation(const JobSpec& resolved,
                                          const tandem::v1::CollectiveProfile& profile) {
  planner::SimulationOptions ranks;
  ranks.collective_seconds = CollectiveSeconds(profile);
  const tandem::v1::DistributedSpec& dist = resolved.distributed();
  ranks.ranks = dist.replicas();
  if (dist.bucket_bytes() > 0) ranks.bucket_bytes = dist.bucket_bytes();
  ranks.partition_host_state = dist.sharding() == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED;
  return ranks;
}

absl::StatusOr<PlanLoop::Decision> PlanLoop::RetimeRank(const PlanCheck& check) const {
  Decision d;
  TANDEM_ASSIGN_OR_RETURN(
      Profile measured,
      MeasuredLayerProfile(model_, resolved_, node_, plan_, window_timelines_, &d.cost_source));
  TANDEM_ASSIGN_OR_RETURN(const tandem::v1::CollectiveProfile collectives, window_collectives_);
  const planner::SimulationOptions ranks = RankSimulation(resolved_, collectives);
  if (ranks.partition_host_state) ScaleHostUpdates(ranks.ranks, measured);
  TANDEM_ASSIGN_OR_RETURN(d.plan, Resimulate(plan_, measured, ranks));
  absl::StrAppend(&d.cost_source, "; as one of ", ranks.ranks, " ranks, its collectives as rank 0 ",
                  "measured them: ", DescribeCollectives(collectives));
  d.measured_profile = std::move(measured);  // a rank's, for the next such job's rank plan
  d.reason = check.off;
  d.because = check.because;
  d.check = check;
  return d;
}

absl::StatusOr<PlanLoop::Decision> PlanLoop::Replan(const PlanCheck& check) const {
  if (pipeline()) return ReplanPipeline(check);
  Decision d;
  TANDEM_ASSIGN_OR_RETURN(
      Profile measured,
      MeasuredLayerProfile(model_, resolved_, node_, plan_, window_timelines_, &d.cost_source));
  // The plan running now, timed with the measured figures: what a new plan
  // must beat (both predictions carry the same simulator's errors).
  TANDEM_ASSIGN_OR_RETURN(Plan current, Resimulate(plan_, measured));
  // What the executor's compute streams sat idle beyond what the simulator
  // has them wait (waking a worker, handing a span over): per call, measured,
  // and charged to every call from now on.
  d.dispatch_seconds = DispatchSeconds(window_timelines_, current.timeline());
  if (!d.dispatch_seconds.empty()) {
    AddDispatch(d.dispatch_seconds, measured);
    TANDEM_ASSIGN_OR_RETURN(current, Resimulate(plan_, measured));
    for (const auto& [resource, seconds] : d.dispatch_seconds) {
      absl::StrAppend(&d.cost_source,
                      absl::StrFormat("; %s dispatch %.0f us per call",
                                      profile::ResourceLabel(resource), seconds * 1e6));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(Plan next, PlanJob(model_, resolved_, node_, &measured));
  const double now = current.prediction().iteration_seconds();
  const double then = next.prediction().iteration_seconds();
  const bool other = !SamePlacement(next, plan_);
  d.placement_changed = other && then < now * (1 - kMinGain);
  const auto ran = measured_strategies_.find(next.strategy());
  if (d.placement_changed && next.strategy() != plan_.strategy() &&
      ran != measured_strategies_.end() &&
      ran->second >= check.measured_step_seconds * (1 - kMinGain)) {
    d.placement_changed = false;
    absl::StrAppend(
        &d.cost_source,
        absl::StrFormat("; the best other placement, %s, is predicted %s, but %s ran at %s per "
                        "step earlier in this job, no faster than this plan's %s",
                        tandem::v1::Strategy_Name(next.strategy()), Ms(then),
                        tandem::v1::Strategy_Name(next.strategy()), Ms(ran->second),
                        Ms(check.measured_step_seconds)));
  } else if (other && !d.placement_changed) {
    absl::StrAppend(&d.cost_source,
                    absl::StrFormat("; the best other placement, %s, gains too little", Ms(then)));
  }
  d.plan = d.placement_changed ? std::move(next) : current;
  SetDispatch(d.dispatch_seconds, d.plan.mutable_prediction());
  d.replaced_timed = std::move(current);
  d.reason = check.off;
  d.because = check.because;
  d.check = check;
  d.measured_profile = std::move(measured);
  return d;
}

void PlanLoop::Adopt(const Decision& decision) {
  ++replans_;
  // What the plan being left measured, for later re-plans (Replan).
  const double measured = decision.check.measured_step_seconds;
  if (measured > 0) {
    auto [it, inserted] = measured_strategies_.emplace(plan_.strategy(), measured);
    if (!inserted) it->second = std::min(it->second, measured);
  }
  if (decision.reason == tandem::v1::REPLAN_REASON_SLOWER) {
    plan_ = decision.plan;
    dispatch_.clear();
    previous_.reset();
    // The split they chose measured slower: none are to be kept.
    corrections_.reset();
    corrections_source_.clear();
    settled_taken_ = false;
    done_ = true;
    steps_ = 0;
    plan_seconds_.clear();
    return;
  }
  dispatch_ = decision.dispatch_seconds;
  if (decision.placement_changed) {
    previous_ = decision.replaced_timed ? *decision.replaced_timed : plan_;
    previous_measured_ = decision.check.measured_step_seconds;
    recalibrated_ = false;
  } else {
    previous_.reset();
    recalibrated_ = true;
  }
  // A new runner warms up again; so does the same one after a re-calibration,
  // whose bookkeeping (the record written, the profile stored) runs beside
  // the next steps.
  steps_ = 0;
  plan_seconds_.clear();
  plan_ = decision.plan;
  corrections_ = decision.corrections;
  corrections_source_ = decision.cost_source;
  settled_taken_ = false;
}

std::optional<PipelineCorrections> PlanLoop::TakeSettledCorrections(double* ratio,
                                                                    std::string* source) {
  const double predicted = plan_.prediction().iteration_seconds();
  if (!corrections_ || settled_taken_ || plan_measured_steps() < kSettledCorrectionSteps ||
      !(predicted > 0)) {
    return std::nullopt;
  }
  settled_taken_ = true;
  const double r = Factor(plan_measured_seconds(), predicted);
  PipelineCorrections out = *corrections_;
  out.stages.clear();
  for (double& f : out.compute_scale) f *= r;
  for (double& f : out.update_scale) f *= r;
  if (ratio != nullptr) *ratio = r;
  if (source != nullptr) *source = corrections_source_;
  return out;
}

void PlanLoop::SwitchFailed() { done_ = true; }

absl::StatusOr<tandem::v1::Schedule> PlanLoop::ProgramOf(const Plan& plan) const {
  return StepProgram(model_, resolved_, plan);
}

void AttachPlanLoop(std::shared_ptr<PlanLoop> loop, PlanLoopHooks hooks,
                    TrainerCallbacks& callbacks) {
  struct State {
    std::shared_ptr<PlanLoop> loop;
    PlanLoopHooks hooks;
    std::optional<PlanLoop::Decision> pending;
    int64_t step = 0;
    void Log(const std::string& line) const {
      if (hooks.log && !line.empty()) hooks.log(line);
    }
  };
  auto state = std::make_shared<State>();
  state->loop = std::move(loop);
  state->hooks = std::move(hooks);
  callbacks.after_step = [state, before = std::move(callbacks.after_step)](
                             int64_t step, double seconds, const StepRunner& runner) {
    if (before) before(step, seconds, runner);
    state->step = step;
    if (state->loop->done()) {
      state->loop->AfterStep(seconds, tandem::v1::Timeline());
      const int n = state->loop->plan_measured_steps();
      if (state->hooks.measured && n > 0) {
        state->hooks.measured(state->loop->plan_measured_seconds(), n);
      }
      if (state->hooks.settled_corrections) {
        double ratio = 1;
        std::string source;
        if (std::optional<PipelineCorrections> c =
                state->loop->TakeSettledCorrections(&ratio, &source)) {
          state->hooks.settled_corrections(*c, ratio, source);
        }
      }
      return;
    }
    // A timeline is a copy of a step's spans: taken only for a window's
    // steps. A pipeline's stages report their own figures.
    const bool window = state->loop->InWindow();
    const bool pipeline = state->loop->pipeline();
    PlanLoop::Outcome out = state->loop->AfterStep(
        seconds, window && !pipeline ? runner.last_timeline() : tandem::v1::Timeline(),
        window && pipeline ? runner.pipeline_stats()
                           : std::vector<tandem::v1::PipelineStageStats>());
    if (out.check && state->hooks.checked) state->hooks.checked(*out.check);
    if (out.collectives && state->hooks.collectives) state->hooks.collectives(*out.collectives);
    state->Log(out.log);
    if (!out.decision) return;
    if (out.decision->placement_changed) {
      state->pending = std::move(out.decision);  // switched at the next boundary
      return;
    }
    state->loop->Adopt(*out.decision);
    if (state->hooks.adopted) state->hooks.adopted(*out.decision, step);
  };
  callbacks.switch_runner = [state]() -> RunnerFactory {
    if (!state->pending) return nullptr;
    absl::StatusOr<tandem::v1::Schedule> program = state->loop->ProgramOf(state->pending->plan);
    if (!program.ok()) {
      state->Log(
          absl::StrCat("plan check: cannot switch to the new plan: ", program.status().message()));
      state->loop->SwitchFailed();
      state->pending.reset();
      return nullptr;
    }
    state->pending->program = *std::move(program);
    return MakeRunnerFactory(state->loop->node(), state->pending->plan, state->pending->program);
  };
  callbacks.on_switch = [state](const absl::Status& made) {
    if (!state->pending) return;
    if (made.ok()) {
      state->loop->Adopt(*state->pending);
      if (state->hooks.adopted) state->hooks.adopted(*state->pending, state->step);
    } else {
      state->Log(absl::StrCat("plan check: the new plan's runner could not be made (",
                              made.message(), "); going on under the plan it had"));
      state->loop->SwitchFailed();
    }
    state->pending.reset();
  };
}

}  // namespace tandem::node
