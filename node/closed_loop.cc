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
#include "base/atomic_file.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "google/protobuf/util/time_util.h"
#include "planner/cost_model.h"
#include "planner/simulator.h"
#include "runtime/profile/job_telemetry.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/profile/profile_cache.h"
#include "runtime/profile/timing_stats.h"
#include "spec/job_spec.h"

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
  std::map<TimelineResource, double> measured;
  for (const Timeline& t : timelines) {
    for (const auto& [resource, busy] : BusyByResource(t)) {
      measured[resource] += busy / static_cast<double>(timelines.size());
    }
  }
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
      a.host_update_threads() != b.host_update_threads() || a.layers_size() != b.layers_size()) {
    return false;
  }
  for (int l = 0; l < a.layers_size(); ++l) {
    const auto &x = a.layers(l), &y = b.layers(l);
    if (x.compute() != y.compute() || x.parameter_home() != y.parameter_home() ||
        x.update() != y.update() || x.activation_policy() != y.activation_policy()) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<Profile> MeasuredLayerProfile(const Model& model, const JobSpec& resolved,
                                             const NodeOffer& node, const Plan& plan,
                                             const std::vector<Timeline>& timelines,
                                             std::string* summary) {
  const int64_t batch = resolved.training().batch_size();
  const int micro = plan.micro_batch_size() > 0 ? plan.micro_batch_size() : static_cast<int>(batch);
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
  const int layers = model.num_layers();
  const int devices = accelerated ? 2 : 1;
  const int update_threads = plan.host_update_threads() > 0 ? plan.host_update_threads()
                                                            : std::max(1, hw.host().threads());

  // The spans, by layer, device and phase; copies by direction.
  std::vector<std::vector<double>> spans(static_cast<size_t>(layers) * 2 * kPhases);
  std::vector<std::vector<double>> recompute(static_cast<size_t>(layers) * 2);
  auto slot = [&](int layer, int device, int phase) -> std::vector<double>& {
    return spans[(static_cast<size_t>(layer) * 2 + device) * kPhases + phase];
  };
  std::vector<std::pair<double, double>> h2d, d2h;
  for (const Timeline& t : timelines) {
    for (const auto& s : t.spans()) {
      const double seconds = s.end_seconds() - s.start_seconds();
      if (s.resource() == tandem::v1::TIMELINE_RESOURCE_COPY_H2D && s.bytes() > 0) {
        h2d.emplace_back(static_cast<double>(s.bytes()), seconds);
        continue;
      }
      if (s.resource() == tandem::v1::TIMELINE_RESOURCE_COPY_D2H && s.bytes() > 0) {
        d2h.emplace_back(static_cast<double>(s.bytes()), seconds);
        continue;
      }
      if (s.layer() < 0 || s.layer() >= layers) continue;
      int device = -1;
      switch (s.resource()) {
        case tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE:
          device = kAccelerator;
          break;
        case tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE:
        case tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE:
          device = kHost;
          break;
        default:
          continue;
      }
      switch (s.phase()) {
        case tandem::v1::TIMELINE_PHASE_FORWARD:
          slot(s.layer(), device, kForward).push_back(seconds);
          break;
        case tandem::v1::TIMELINE_PHASE_BACKWARD:
          slot(s.layer(), device, kBackward).push_back(seconds);
          break;
        case tandem::v1::TIMELINE_PHASE_UPDATE:
          slot(s.layer(), device, kUpdate).push_back(seconds);
          break;
        case tandem::v1::TIMELINE_PHASE_RECOMPUTE:
          recompute[static_cast<size_t>(s.layer()) * 2 + device].push_back(seconds);
          break;
        default:
          break;
      }
    }
  }

  // The roofline of every (layer, device, phase), and per device and phase
  // what the measured ones took over their roofline.
  auto roofline = [&](int layer, int device, int phase) {
    const tandem::v1::Placement where =
        device == kHost ? tandem::v1::PLACEMENT_HOST : tandem::v1::PLACEMENT_ACCELERATOR;
    switch (phase) {
      case kForward:
        return roof.ForwardSeconds(layer, where, micro);
      case kBackward:
        return roof.BackwardSeconds(layer, where, micro);
      default:
        return roof.UpdateSeconds(layer, where, update_threads);
    }
  };
  auto measured_median = [&](int layer, int device, int phase) -> std::optional<double> {
    const std::vector<double>& v = slot(layer, device, phase);
    if (!v.empty()) return profile::Median(v);
    // A recomputed layer's forward runs again before its backward.
    const std::vector<double>& r = recompute[static_cast<size_t>(layer) * 2 + device];
    if (phase == kForward && !r.empty()) return profile::Median(r);
    return std::nullopt;
  };
  double measured_sum[2][kPhases] = {}, roof_sum[2][kPhases] = {};
  int measured_count[2] = {0, 0}, phase_count[2] = {0, 0};
  for (int l = 0; l < layers; ++l) {
    for (int d = 0; d < devices; ++d) {
      for (int p = 0; p < kPhases; ++p) {
        if (std::optional<double> m = measured_median(l, d, p)) {
          measured_sum[d][p] += *m;
          roof_sum[d][p] += roofline(l, d, p);
        }
      }
    }
  }
  auto factor = [&](int d, int p) {
    return measured_sum[d][p] > 0 && roof_sum[d][p] > 0 ? measured_sum[d][p] / roof_sum[d][p] : 1.0;
  };
  bool any = false;
  for (int d = 0; d < devices; ++d) {
    any |= measured_sum[d][kForward] > 0 || measured_sum[d][kBackward] > 0;
  }
  if (!any) {
    return absl::FailedPreconditionError(
        "no forward or backward span was measured: nothing to build a layer profile from");
  }

  // The devices: the host (its threads the plan's update threads, so that the
  // measured update times are the ones the planner uses), the accelerator.
  profile.clear_devices();
  const std::string device_ids[2] = {"cpu", AcceleratorId(resolved, node)};
  tandem::v1::DeviceProfile* host = profile.add_devices();
  host->set_id(device_ids[kHost]);
  host->set_kind(tandem::v1::DEVICE_KIND_CPU);
  host->set_name(hw.host().name());
  host->set_threads(update_threads);
  host->set_memory_bytes(hw.host().memory_bytes());
  host->set_memory_bandwidth_bytes_per_second(hw.host().memory_bandwidth_bytes_per_second());
  host->set_gemm_flops_per_second(hw.host().peak_matmul_flops_per_second());
  if (accelerated) {
    const tandem::v1::ProcessorSpec& a = hw.accelerators(0);
    tandem::v1::DeviceProfile* accel = profile.add_devices();
    accel->set_id(device_ids[kAccelerator]);
    accel->set_kind(a.kind());
    accel->set_name(a.name());
    accel->set_threads(a.threads());
    accel->set_memory_bytes(capacity);
    accel->set_memory_bandwidth_bytes_per_second(a.memory_bandwidth_bytes_per_second());
    accel->set_gemm_flops_per_second(a.peak_matmul_flops_per_second());
  }
  for (int l = 0; l < layers; ++l) {
    tandem::v1::LayerProfile* layer = profile.mutable_layers(l);
    layer->clear_devices();
    for (int d = 0; d < devices; ++d) {
      tandem::v1::LayerDeviceProfile* ld = layer->add_devices();
      ld->set_device_id(device_ids[d]);
      for (int p = 0; p < kPhases; ++p) {
        tandem::v1::PhaseProfile* phase = PhaseOf(*ld, p);
        std::optional<double> m = measured_median(l, d, p);
        const bool has_update = p != kUpdate || roof.UpdateBytes(l) > 0;
        if (has_update) ++phase_count[d];
        if (m) {
          ++measured_count[d];
          phase->mutable_timing()->set_samples(static_cast<int>(slot(l, d, p).size()));
          phase->mutable_timing()->set_median_seconds(*m);
          continue;
        }
        const double f = factor(d, p);
        phase->mutable_timing()->set_samples(1);
        phase->mutable_timing()->set_median_seconds(has_update ? roofline(l, d, p) * f : 0.0);
        tandem::v1::Counter* c = phase->add_counters();
        c->set_name("roofline_scaled_by");
        c->set_value(f);
        c->set_unit("ratio");
      }
    }
  }

  // The links: fitted to the copies, else NodeHardware's figure.
  std::string links;
  if (accelerated) {
    for (auto [direction, copies, spec] :
         {std::tuple{tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, &h2d, &hw.host_to_accelerator()},
          std::tuple{tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, &d2h, &hw.accelerator_to_host()}}) {
      const LinkFit fit = FitLink(*copies);
      tandem::v1::LinkProfile* link = profile.add_links();
      const bool to_device = direction == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE;
      link->set_from_device_id(device_ids[to_device ? kHost : kAccelerator]);
      link->set_to_device_id(device_ids[to_device ? kAccelerator : kHost]);
      link->set_direction(direction);
      link->set_pinned(true);
      const bool measured = fit.bytes_per_second > 0;
      link->set_bandwidth_bytes_per_second(measured ? fit.bytes_per_second
                                                    : spec->bandwidth_bytes_per_second());
      link->set_latency_seconds(measured ? fit.latency_seconds : spec->latency_seconds());
      absl::StrAppend(&links, links.empty() ? "" : ", ", to_device ? "H2D " : "D2H ",
                      absl::StrFormat("%.2f GB/s", link->bandwidth_bytes_per_second() / 1e9),
                      measured ? absl::StrCat(" (", fit.copies, " copies)") : " (not measured)");
    }
  }
  auto& provenance = *profile.mutable_provenance();
  provenance.set_source("measured");
  *provenance.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  provenance.set_iterations(static_cast<int>(timelines.size()));
  if (node.profile) (*provenance.mutable_versions())["node"] = node.profile->fingerprint();
  if (summary != nullptr) {
    *summary = absl::StrFormat(
        "measured from %d steps: host %d of %d layer phases, accelerator %d of %d (the rest the "
        "roofline scaled by what the measured ones took over theirs: host x%.2f/x%.2f/x%.2f, "
        "accelerator x%.2f/x%.2f/x%.2f forward/backward/update)%s%s",
        static_cast<int>(timelines.size()), measured_count[kHost], phase_count[kHost],
        measured_count[kAccelerator], phase_count[kAccelerator], factor(kHost, kForward),
        factor(kHost, kBackward), factor(kHost, kUpdate), factor(kAccelerator, kForward),
        factor(kAccelerator, kBackward), factor(kAccelerator, kUpdate),
        links.empty() ? "" : "; links ", links);
  }
  return profile;
}

// ---- LayerProfileCache ----

std::string LayerProfileCache::Key(const Model& model, const JobSpec& resolved,
                                   const NodeOffer& node) {
  if (!node.profile) return "";
  return profile::HexKey(absl::StrCat(
      "layer-profile-v1|model=", model.fingerprint(), "|batch=", resolved.training().batch_size(),
      "|optimizer=", resolved.optimizer().kind(), "|precision=fp32",
      "|accelerator=", resolved.placement().accelerator(),
      "|link=", resolved.resources().emulated_link_bytes_per_second(), "|throttle=",
      node.emulated_link_throttle_bytes_per_second, "|node=", node.profile->fingerprint()));
}

std::string LayerProfileCache::PathOf(const std::string& key) const {
  return absl::StrCat(dir_, "/", key, ".layers.pb");
}

std::optional<Profile> LayerProfileCache::Load(const Model& model, const JobSpec& resolved,
                                               const NodeOffer& node) const {
  const std::string key = Key(model, resolved, node);
  if (dir_.empty() || key.empty()) return std::nullopt;
  const std::string path = PathOf(key);
  std::optional<std::string> bytes = ReadWholeFile(path);
  if (!bytes) return std::nullopt;  // none yet
  Profile profile;
  std::string problem;
  if (!profile.ParseFromString(*bytes)) {
    problem = "it does not parse";
  } else if (profile.provenance().cache_key() != key) {
    problem = absl::StrCat("it was stored under key '", profile.provenance().cache_key(),
                           "' (another model or node)");
  } else if (profile.layers_size() != model.num_layers()) {
    problem =
        absl::StrCat("it has ", profile.layers_size(), " layers, the model ", model.num_layers());
  } else if (profile.provenance().versions().count("node") == 0 ||
             profile.provenance().versions().at("node") != node.profile->fingerprint()) {
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
  if (dir_.empty() || key.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
  profile.mutable_provenance()->set_cache_key(key);
  return WriteFileAtomically(PathOf(key), profile.SerializeAsString());
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

void AddDispatch(const std::map<TimelineResource, double>& dispatch, Profile& profile) {
  for (auto& layer : *profile.mutable_layers()) {
    for (auto& device : *layer.mutable_devices()) {
      const TimelineResource r = device.device_id() == "cpu"
                                     ? tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE
                                     : tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
      auto it = dispatch.find(r);
      if (it == dispatch.end()) continue;
      for (auto* phase : {device.mutable_forward(), device.mutable_backward()}) {
        phase->mutable_timing()->set_median_seconds(phase->timing().median_seconds() + it->second);
      }
      // Host updates run on the update pool, not the compute stream.
      if (r == tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE &&
          device.update().timing().median_seconds() > 0) {
        device.mutable_update()->mutable_timing()->set_median_seconds(
            device.update().timing().median_seconds() + it->second);
      }
    }
  }
}

// ---- PlanLoop ----

absl::StatusOr<Plan> PlanLoop::Resimulate(const Plan& plan, const Profile& measured) const {
  TANDEM_ASSIGN_OR_RETURN(const planner::CostModel cost,
                          planner::CostModel::FromMeasuredProfile(measured));
  TANDEM_ASSIGN_OR_RETURN(const planner::SimulationResult sim,
                          planner::PlanSimulator(cost).Simulate(plan));
  Plan timed = plan;
  *timed.mutable_prediction() = sim.prediction;
  *timed.mutable_timeline() = sim.timeline;
  for (int l = 0; l < timed.layers_size() && l < static_cast<int>(sim.layers.size()); ++l) {
    timed.mutable_layers(l)->set_reuse_distance_seconds(sim.layers[l].reuse_distance_seconds);
    timed.mutable_layers(l)->set_slack_seconds(sim.layers[l].slack_seconds);
  }
  timed.mutable_solver()->set_method("re-simulated with measured figures");
  return timed;
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
}

PlanLoop::Outcome PlanLoop::AfterStep(double step_seconds, const Timeline& timeline) {
  if (done_) return {};
  if (++steps_ <= options_.warmup_steps) return {};
  window_seconds_.push_back(step_seconds);
  if (timeline.spans_size() > 0) window_timelines_.push_back(timeline);
  if (static_cast<int>(window_seconds_.size()) < options_.window_steps) return {};
  const PlanCheck check =
      CheckPlan(plan_, window_seconds_, window_timelines_, options_.threshold, dispatch_);
  Outcome out = Decide(check);
  out.check = check;
  window_seconds_.clear();
  window_timelines_.clear();
  return out;
}

PlanLoop::Outcome PlanLoop::Decide(const PlanCheck& check) {
  Outcome out;
  const std::string versus = absl::StrCat(
      Ms(check.measured_step_seconds), " measured, ", Ms(check.predicted_step_seconds),
      " predicted (", Percent(check.measured_step_seconds, check.predicted_step_seconds), ")");
  if (previous_ && check.measured_step_seconds > previous_measured_ * (1 + kSlowerMargin)) {
    Decision d;
    d.plan = *previous_;
    d.placement_changed = true;
    d.reason = tandem::v1::REPLAN_REASON_SLOWER;
    d.because = absl::StrCat("it measured ", Ms(check.measured_step_seconds),
                             " per step, the plan before it ", Ms(previous_measured_));
    d.check = check;
    d.cost_source = "the plan it had replaced, timed with the figures measured under it";
    out.log = absl::StrCat("plan check: the new plan is slower (", d.because,
                           "): switching back, and re-planning no more in this run");
    out.decision = std::move(d);
    return out;
  }
  if (check.off == tandem::v1::REPLAN_REASON_UNSPECIFIED) {
    done_ = true;
    out.log =
        absl::StrCat("plan check: step ", versus, ", within the ",
                     absl::StrFormat("%.0f%%", std::abs(options_.threshold) * 100), " threshold");
    return out;
  }
  auto stop = [&](const std::string& why) {
    done_ = true;
    out.log = absl::StrCat("plan check: ", check.because, "; ", why);
    return out;
  };
  if (options_.threshold < 0) return stop("not re-planning (placement.replan_threshold < 0)");
  if (forced_) return stop("not re-planning a forced plan (placement.plan)");
  if (recalibrated_) {
    return stop(
        "still off after re-calibrating from measured spans (time the simulator does not "
        "model); not re-planning again in this run");
  }
  if (replans_ >= options_.max_replans) {
    return stop(absl::StrCat("not re-planning: ", replans_, " re-plans already in this run"));
  }
  const auto began = std::chrono::steady_clock::now();
  std::string summary;
  absl::StatusOr<Profile> measured =
      MeasuredLayerProfile(model_, resolved_, node_, plan_, window_timelines_, &summary);
  if (!measured.ok()) return stop(absl::StrCat("cannot re-plan: ", measured.status().message()));
  // The plan running now, timed with the measured figures: what a new plan
  // must beat (both predictions carry the same simulator's errors).
  absl::StatusOr<Plan> current = Resimulate(plan_, *measured);
  if (!current.ok()) return stop(absl::StrCat("cannot re-plan: ", current.status().message()));
  // What the executor's compute streams sat idle beyond what the simulator
  // has them wait (waking a worker, handing a span over): per call, measured,
  // and charged to every call from now on.
  const std::map<TimelineResource, double> dispatch =
      DispatchSeconds(window_timelines_, current->timeline());
  if (!dispatch.empty()) {
    AddDispatch(dispatch, *measured);
    current = Resimulate(plan_, *measured);
    if (!current.ok()) return stop(absl::StrCat("cannot re-plan: ", current.status().message()));
    for (const auto& [resource, seconds] : dispatch) {
      absl::StrAppend(&summary, absl::StrFormat("; %s dispatch %.0f us per call",
                                                profile::ResourceLabel(resource), seconds * 1e6));
    }
  }
  absl::StatusOr<Plan> next = PlanJob(model_, resolved_, node_, &*measured);
  if (!next.ok()) return stop(absl::StrCat("cannot re-plan: ", next.status().message()));
  Decision d;
  const double now = current->prediction().iteration_seconds();
  const double then = next->prediction().iteration_seconds();
  d.placement_changed = !SamePlacement(*next, plan_) && then < now * (1 - kMinGain);
  d.plan = d.placement_changed ? *std::move(next) : *std::move(current);
  if (!d.placement_changed && !SamePlacement(*next, plan_)) {
    absl::StrAppend(&summary,
                    absl::StrFormat("; the best other placement, %s, gains too little", Ms(then)));
  }
  d.reason = check.off;
  d.because = check.because;
  d.check = check;
  d.cost_source = summary;
  d.dispatch_seconds = dispatch;
  d.replaced_timed = *current;
  d.measured_profile = *std::move(measured);
  out.log = absl::StrCat(
      "plan check: ", check.because, "; ",
      d.placement_changed
          ? absl::StrCat("re-planned from measured figures: a new placement, ", Ms(then),
                         " predicted against ", Ms(now), " for the running one")
          : absl::StrCat("re-calibrated from measured figures: the same placement, ", Ms(now),
                         " predicted"),
      " (", summary, "; re-planning took ",
      absl::StrFormat(
          "%.3f s",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count()),
      ")");
  out.decision = std::move(d);
  return out;
}

void PlanLoop::Adopt(const Decision& decision) {
  ++replans_;
  if (decision.reason == tandem::v1::REPLAN_REASON_SLOWER) {
    plan_ = decision.plan;
    dispatch_.clear();
    previous_.reset();
    done_ = true;
    return;
  }
  dispatch_ = decision.dispatch_seconds;
  if (decision.placement_changed) {
    previous_ = decision.replaced_timed ? *decision.replaced_timed : plan_;
    previous_measured_ = decision.check.measured_step_seconds;
    recalibrated_ = false;
    steps_ = 0;  // the new runner warms up again
  } else {
    previous_.reset();
    recalibrated_ = true;
    steps_ = options_.warmup_steps;
  }
  plan_ = decision.plan;
}

void PlanLoop::SwitchFailed() { done_ = true; }

absl::StatusOr<tandem::v1::Schedule> PlanLoop::ProgramOf(const Plan& plan) const {
  return StepProgram(model_, resolved_, plan);
}

absl::StatusOr<RunnerFactory> PlanLoop::FactoryFor(const Plan& plan) const {
  TANDEM_ASSIGN_OR_RETURN(tandem::v1::Schedule program, ProgramOf(plan));
  return MakeRunnerFactory(node_, plan, std::move(program));
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
    PlanLoop::Outcome out = state->loop->AfterStep(seconds, runner.last_timeline());
    if (out.check && state->hooks.checked) state->hooks.checked(*out.check);
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
    absl::StatusOr<RunnerFactory> factory = state->loop->FactoryFor(state->pending->plan);
    if (!factory.ok()) {
      state->Log(
          absl::StrCat("plan check: cannot switch to the new plan: ", factory.status().message()));
      state->loop->SwitchFailed();
      state->pending.reset();
      return nullptr;
    }
    return *std::move(factory);
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
