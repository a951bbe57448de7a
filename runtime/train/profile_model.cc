#include "runtime/train/profile_model.h"

#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/build_info.h"
#include "base/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "runtime/core/clock.h"
#include "runtime/profile/chrome_trace.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/profile/profile_cache.h"
#include "runtime/train/job_model.h"

namespace tandem::profile {

tandem::v1::JobSpec ProfiledPart(const tandem::v1::JobSpec& requested) {
  tandem::v1::JobSpec spec;
  *spec.mutable_model() = requested.model();
  *spec.mutable_data() = requested.data();
  *spec.mutable_optimizer() = requested.optimizer();
  spec.mutable_training()->set_batch_size(requested.training().batch_size());
  spec.mutable_training()->set_steps(1);
  return spec;
}

namespace {

constexpr int kDefaultIterations = 10;
constexpr int kDefaultWarmup = 3;

absl::Status WithField(const std::string& prefix, const absl::Status& s) {
  if (s.code() != absl::StatusCode::kInvalidArgument) return s;
  return absl::InvalidArgumentError(absl::StrCat(prefix, s.message()));
}

// The part of the request's spec that changes a profile, resolved.
absl::StatusOr<tandem::v1::JobSpec> ProfiledSpec(const tandem::v1::JobSpec& requested,
                                                 bool has_accelerator) {
  absl::StatusOr<tandem::v1::JobSpec> resolved =
      ResolveJobSpec(ProfiledPart(requested), has_accelerator);
  if (!resolved.ok()) return WithField("spec.", resolved.status());
  return resolved;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

std::map<std::string, std::string> Versions(const std::vector<ProfiledDevice*>& devices) {
  std::map<std::string, std::string> versions = {{"tandem", VersionString()}};
  for (ProfiledDevice* d : devices) {
    for (const auto& [k, v] : d->Versions()) versions[k] = v;
  }
  return versions;
}

std::string CacheKey(const Model& model, int64_t batch, const tandem::v1::OptimizerSpec& optimizer,
                     const std::vector<ProfiledDevice*>& devices,
                     const std::map<std::string, std::string>& versions, int iterations, int warmup,
                     const LinkOptions& links) {
  std::vector<std::string> device_names;
  for (ProfiledDevice* d : devices)
    device_names.push_back(absl::StrCat(d->id(), "=", d->Describe().name()));
  const std::string canonical = absl::StrCat(
      "model=", model.fingerprint(), "|batch=", batch,
      "|sample=", model.data().sample_shape.ToString(), DTypeName(model.data().input_dtype),
      "|optimizer=", tandem::v1::OptimizerKind_Name(optimizer.kind()),
      ",moments=", Optimizer::Stateless(optimizer)->state_count(),
      "|devices=", absl::StrJoin(device_names, ","),
      "|versions=", absl::StrJoin(versions, ",", absl::PairFormatter("=")),
      "|iterations=", iterations, "|warmup=", warmup,
      "|links=", absl::StrJoin(links.sizes_bytes, ","), "x", links.repeats);
  return HexKey(canonical);
}

std::vector<std::string> LayerNames(const Model& model) {
  std::vector<std::string> names;
  for (int l = 0; l < model.num_layers(); ++l) names.push_back(model.layer(l).name());
  return names;
}

}  // namespace

absl::Status ResolveProfileRequest(const tandem::v1::ProfileModelRequest& request, int* iterations,
                                   int* warmup) {
  *iterations = request.iterations() == 0 ? kDefaultIterations : request.iterations();
  *warmup = request.warmup_iterations() == 0 ? kDefaultWarmup : request.warmup_iterations();
  if (*iterations < 1 || *iterations > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("iterations: must be in [1, 1000], got ", request.iterations()));
  }
  if (*warmup < 0 || *warmup > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_iterations: must be in [0, 100], got ", request.warmup_iterations()));
  }
  return absl::OkStatus();
}

namespace {

// The devices a request asks for, in its order, from the node's; all of them
// when it names none.
absl::StatusOr<std::vector<ProfiledDevice*>> SelectDevices(
    const tandem::v1::ProfileModelRequest& request, const std::vector<ProfiledDevice*>& node) {
  if (request.device_ids().empty()) return node;
  std::vector<std::string> known;
  for (ProfiledDevice* d : node) known.push_back(d->id());
  std::vector<ProfiledDevice*> devices;
  for (int i = 0; i < request.device_ids_size(); ++i) {
    ProfiledDevice* found = nullptr;
    for (ProfiledDevice* d : node) {
      if (d->id() == request.device_ids(i)) found = d;
    }
    if (found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("device_ids[", i, "]: unknown device '",
                                                     request.device_ids(i), "'; this node has ",
                                                     absl::StrJoin(known, ", ")));
    }
    if (std::find(devices.begin(), devices.end(), found) == devices.end()) devices.push_back(found);
  }
  return devices;
}

// The cached profile for `key` (and its trace when asked for), unless the
// request asks to refresh.
std::optional<ProfileResult> FromCache(const tandem::v1::ProfileModelRequest& request,
                                       const ProfileCache& cache, const std::string& key) {
  if (request.refresh()) return std::nullopt;
  std::optional<tandem::v1::Profile> cached = cache.Load(key);
  std::optional<std::string> trace;
  if (cached && request.include_trace()) trace = cache.LoadTrace(key);
  if (!cached || (request.include_trace() && !trace)) return std::nullopt;
  ProfileResult result;
  result.profile = std::move(*cached);
  result.cached = true;
  if (trace) result.chrome_trace_json = std::move(*trace);
  return result;
}

// Every layer on every device, then each device's host links. Returns the
// iteration the trace shows: an accelerator's when there is one (it carries
// the host's work too), else the host's.
absl::StatusOr<IterationRecord> MeasureDevices(const Model& model,
                                               const tandem::v1::OptimizerSpec& optimizer,
                                               int64_t batch, const LayerProfilerOptions& options,
                                               const std::vector<ProfiledDevice*>& devices,
                                               const ProfilerEnvironment& env,
                                               tandem::v1::Profile* profile) {
  IterationRecord traced;
  bool traced_accelerator = false;
  for (ProfiledDevice* device : devices) {
    IterationRecord iteration;
    TANDEM_RETURN_IF_ERROR(
        MeasureOnDevice(model, optimizer, batch, options, *device, profile, &iteration));
    if (traced.timeline.spans_size() == 0 || (device->has_host_link() && !traced_accelerator)) {
      traced = std::move(iteration);
      traced_accelerator = device->has_host_link();
    }
    if (device->has_host_link()) {
      if (env.on_progress) env.on_progress(absl::StrCat(device->id(), ": host links"));
      TANDEM_ASSIGN_OR_RETURN(std::vector<tandem::v1::LinkProfile> links,
                              MeasureHostLinks(*device, env.links));
      for (auto& link : links) *profile->add_links() = std::move(link);
    }
  }
  return traced;
}

// One iteration's timeline as Chrome trace JSON, named by the model.
std::string TraceOf(const Model& model, int64_t batch, const IterationRecord& traced,
                    const std::vector<ProfiledDevice*>& devices) {
  ChromeTraceOptions trace_options;
  trace_options.layer_names = LayerNames(model);
  trace_options.title =
      absl::StrCat("model ", model.fingerprint().substr(0, 12), ", batch ", batch);
  for (ProfiledDevice* d : devices) {
    if (d->has_host_link()) {
      trace_options.accelerator_id = d->id();
      break;
    }
  }
  return TimelineToChromeTrace(traced.timeline, trace_options);
}

}  // namespace

absl::StatusOr<ProfileResult> ProfileModel(const tandem::v1::ProfileModelRequest& request,
                                           const ProfilerEnvironment& env) {
  const double start = WallSeconds();
  int iterations = 0, warmup = 0;
  TANDEM_RETURN_IF_ERROR(ResolveProfileRequest(request, &iterations, &warmup));
  ScopedThreads threads(env.threads);

  std::unique_ptr<CpuProfiledDevice> own_cpu;
  std::vector<ProfiledDevice*> node = env.devices;
  if (node.empty()) {
    own_cpu = CpuProfiledDevice::Create(env.cpu);
    node.push_back(own_cpu.get());
  }
  TANDEM_ASSIGN_OR_RETURN(const std::vector<ProfiledDevice*> devices, SelectDevices(request, node));
  bool has_accelerator = false;
  for (ProfiledDevice* d : node) has_accelerator |= d->has_host_link();

  TANDEM_ASSIGN_OR_RETURN(const tandem::v1::JobSpec resolved,
                          ProfiledSpec(request.spec(), has_accelerator));
  absl::StatusOr<JobModel> job = BuildJobModel(resolved, env.resolve_path);
  if (!job.ok()) return WithField("spec.", job.status());
  const Model& model = *job->model;
  const int64_t batch = resolved.training().batch_size();
  const std::map<std::string, std::string> versions = Versions(devices);
  const std::string key = CacheKey(model, batch, resolved.optimizer(), devices, versions,
                                   iterations, warmup, env.links);
  const ProfileCache cache(env.cache_dir);
  if (std::optional<ProfileResult> cached = FromCache(request, cache, key)) return *cached;

  tandem::v1::Profile profile = AnalyticProfile(model, resolved.optimizer(), batch);
  LayerProfilerOptions options;
  options.iterations = iterations;
  options.warmup = warmup;
  options.seed = resolved.training().seed() != 0 ? resolved.training().seed() : 1;
  options.on_progress = env.on_progress;
  options.run_iteration = env.run_iteration;
  options.stop = env.stop;
  TANDEM_ASSIGN_OR_RETURN(
      const IterationRecord traced,
      MeasureDevices(model, resolved.optimizer(), batch, options, devices, env, &profile));

  tandem::v1::ProfileProvenance* p = profile.mutable_provenance();
  *p->mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  p->set_hostname(Hostname());
  for (const auto& [k, v] : versions) (*p->mutable_versions())[k] = v;
  p->set_cache_key(key);
  p->set_warmup_iterations(warmup);
  p->set_iterations(iterations);
  p->set_profiling_seconds(WallSeconds() - start);
  p->set_source("measured");

  std::string trace = TraceOf(model, batch, traced, devices);
  // The measurement stands even when it cannot be cached.
  const absl::Status stored = cache.Store(key, profile, trace);
  if (!stored.ok() && env.on_progress) {
    env.on_progress(absl::StrCat("warning: profile not cached: ", stored.message()));
  }
  ProfileResult result;
  result.profile = std::move(profile);
  if (request.include_trace()) result.chrome_trace_json = std::move(trace);
  return result;
}

absl::StatusOr<tandem::v1::Profile> AnalyticProfileForJob(const tandem::v1::JobSpec& resolved,
                                                          const PathResolver& resolve) {
  TANDEM_ASSIGN_OR_RETURN(JobModel job, BuildJobModel(resolved, resolve));
  return AnalyticProfile(*job.model, resolved.optimizer(), resolved.training().batch_size());
}

}  // namespace tandem::profile
