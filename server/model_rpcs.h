// The work behind the PlanModel and ProfileModel RPCs and GetNode's refresh, as
// tandemd hands it to the service (ServiceOptions::plan, ::profile and
// ::refresh_node): plans for this node (from a layer profile a job measured
// here when there is one), or for a machine a HardwareSpec describes; profiles
// measured on this node's devices and cached under a directory; the node
// profile measured again. Profiles must run one at a time (concurrent
// ones would measure each other): the service's profile lane has one thread
// (ServiceOptions::profile_lane), the only limit. The devices are opened for each profile, so that
// between profiles the GPU holds no profiler context or memory and no CUPTI tracing is left
// running. The handlers are thread-safe.
#ifndef TANDEM_SERVER_MODEL_RPCS_H_
#define TANDEM_SERVER_MODEL_RPCS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "node/placement.h"
#include "runtime/profile/cpu_device.h"
#include "server/tandem_service.h"

namespace tandem::server {

// Plans for this node as `jobs` sees it now (JobManager::node), from the
// layer profile a job of the same model measured here when the request names
// no cost source and one is cached. Each plan holds
// planner::PlanningMemoryBytes from `jobs`' budget while it solves;
// RESOURCE_EXHAUSTED when that does not fit now. `jobs` must outlive the
// handler.
PlanHandler MakePlanHandler(PathResolver resolve, JobManager* jobs);

// `threads`: CPU threads for the host's measurements (0 = all cores). Each
// profile holds host memory from `jobs`' budget while it measures (the
// model's estimate plus kProfileOverhead and a quarter), and its CPU
// allocators are limited to that; RESOURCE_EXHAUSTED when it does not fit now.
// `jobs` must outlive the handler.
ProfileHandler MakeProfileHandler(std::string cache_dir, PathResolver resolve, int threads,
                                  JobManager* jobs);

// How tandemd measures its node profile (runtime/profile/node_profile.h).
struct NodeOfferSettings {
  // <state_dir>/node_profile.pb caches the profile per hardware fingerprint.
  std::string state_dir;
  // CPU threads for the host's measurements (0 = all cores).
  int threads = 0;
  // --accelerator_memory_budget (0 = the default).
  int64_t accelerator_budget_bytes = 0;
  std::vector<cuda::CudaDeviceInfo> cuda_devices;
  // --emulated_link_throttle (NodeOffer::emulated_link_throttle_bytes_per_second).
  double emulated_link_throttle_bytes_per_second = 0;
  // --emulated_accelerators (NodeOffer::emulated_accelerators).
  int emulated_accelerators = 1;
  // --emulated_peer_link (NodeOffer::emulated_peer_link).
  bool emulated_peer_link = true;
};

// The node as the planner sees it, from its node profile: read from the cache
// when that holds this hardware's and `refresh` is false, else measured now
// (about half a second on a 2-core host, a few seconds with a GPU) and
// stored. Log lines (a cache file ignored, how long it took) go to stderr.
// `measured_as` names the occasion in NodeOffer::profile_source ("measured at
// start-up").
absl::StatusOr<node::NodeOffer> MeasureNodeOffer(const NodeOfferSettings& settings, bool refresh,
                                                 absl::string_view measured_as);

// `offer` with the emulated accelerators' flags of `settings` (how many,
// their link throttle, their peer link), whichever way it was measured.
void ApplyEmulatedSettings(const NodeOfferSettings& settings, node::NodeOffer* offer);

// What measuring the node holds of the host budget: the memcpy buffers and
// the Adam run's state (NodeProfileOptions' defaults), with room to spare.
constexpr int64_t kNodeProfileHostBytes = int64_t{320} << 20;

// GetNode's refresh_profile: measures the node profile again, stores it in the
// cache and plans jobs submitted later with it (JobManager::ReplaceNode). No
// job starts meanwhile (JobManager::ReserveNodeForMeasuring);
// FAILED_PRECONDITION while a job runs (its work would be measured too); the
// old profile stays when measuring fails. The service runs it on the profile
// lane, so it never overlaps a ProfileModel. `jobs` must outlive the handler.
NodeRefresher MakeNodeRefresher(NodeOfferSettings settings, JobManager* jobs);

// What a profile reserves beyond its model's estimate: the profiler's own
// buffers, the largest at a time: the cache-eviction sweep (up to
// profile::kMaxEvictionBytes, held while the layers are measured; the peak
// measurements' 192 MiB of triad arrays come and go before it), and 64 MiB
// of per-layer inputs and the rest.
constexpr int64_t kProfileOverhead = profile::kMaxEvictionBytes + (int64_t{64} << 20);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_MODEL_RPCS_H_
