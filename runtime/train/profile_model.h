// The ProfileModel entry point: what the tandem.v1.Tandem/ProfileModel RPC and
// `tandem profile FILE` both call. It lives here, above both the profiler
// (runtime/profile) and the executor (runtime/exec), because it builds the
// job's model (job_model.h) and has the executor run one whole iteration on
// each device through the profiler's IterationRunner seam; it keeps the
// profiler's namespace. Validates the request, builds the model from
// the spec's model, data (headers only), batch size and optimizer, and returns
// the cached profile for the same key (profile_cache.h) unless asked to
// refresh; otherwise measures every layer on every requested device
// (layer_profiler.h), the devices' peak rates, one whole iteration (its peak
// memory and timeline), and the host links of devices that have one, then
// caches the result.
//
// Errors: INVALID_ARGUMENT naming the field ("iterations: must be in [1, 1000],
// got 0", "spec.training.batch_size: ...", "device_ids[1]: unknown device
// 'cuda:3'; this node has cpu"), NOT_FOUND for unreadable data files (their
// headers give the sample shape), RESOURCE_EXHAUSTED when a device cannot hold
// a layer. Not thread-safe with itself: concurrent calls would measure each
// other (the daemon serialises them).
#ifndef TANDEM_RUNTIME_TRAIN_PROFILE_MODEL_H_
#define TANDEM_RUNTIME_TRAIN_PROFILE_MODEL_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/dataset.h"
#include "runtime/exec/profiled_iteration.h"
#include "runtime/profile/cpu_device.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/profile/link_bandwidth.h"
#include "runtime/profile/profiled_device.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::profile {

struct ProfilerEnvironment {
  // Where profiles are cached; empty = no cache.
  std::string cache_dir;
  // Maps dataset paths of the spec (the daemon confines them to --data_root).
  PathResolver resolve_path;
  // The node's devices, not owned; the profile lists them in this order. Empty
  // = the host alone, as a CpuProfiledDevice made for the call.
  std::vector<ProfiledDevice*> devices;
  // OpenMP threads of the calling thread for CPU work; 0 = as it is. A CPU
  // device passed in `devices` opened its counters on the team it was created
  // under: create it under the same thread count.
  int threads = 0;
  // A line per step, for progress displays.
  std::function<void(const std::string&)> on_progress;
  // How links and (for the device made here) CPU peaks are measured.
  LinkOptions links;
  CpuDeviceOptions cpu;
  // Runs each device's whole iteration: the executor's, unless a test fakes it.
  IterationRunner run_iteration = RunProfiledIteration;
  // True once the caller has gone: the measurement ends with CANCELLED at the
  // next call it times (LayerProfilerOptions::stop). Null = never.
  std::function<bool()> stop;
};

struct ProfileResult {
  tandem::v1::Profile profile;
  // The profile came from the cache, unmeasured.
  bool cached = false;
  // One measured iteration as Chrome trace JSON, when request.include_trace.
  std::string chrome_trace_json;
};

absl::StatusOr<ProfileResult> ProfileModel(const tandem::v1::ProfileModelRequest& request,
                                           const ProfilerEnvironment& env);

// The part of a request's spec a profile depends on (model, data, optimizer,
// training.batch_size), as a one-step job: the rest of the spec is ignored,
// as ProfileModelRequest says, so it is neither checked nor reserved for.
tandem::v1::JobSpec ProfiledPart(const tandem::v1::JobSpec& requested);

// The iterations and warm-up a request asks for, defaults applied, or
// INVALID_ARGUMENT naming the field.
absl::Status ResolveProfileRequest(const tandem::v1::ProfileModelRequest& request, int* iterations,
                                   int* warmup);

// The analytic profile (layer_profiler.h) of a resolved JobSpec (model, data,
// training.batch_size, optimizer), reading only dataset headers.
absl::StatusOr<tandem::v1::Profile> AnalyticProfileForJob(const tandem::v1::JobSpec& resolved,
                                                          const PathResolver& resolve = nullptr);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_TRAIN_PROFILE_MODEL_H_
