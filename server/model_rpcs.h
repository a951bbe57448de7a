// The work behind the PlanModel and ProfileModel RPCs, as tandemd hands it to
// the service (ServiceOptions::plan and ::profile): plans for this node, or for
// a machine a HardwareSpec describes; profiles measured on this node's devices
// and cached under a directory. Profiles must run one at a time (concurrent
// ones would measure each other): the service's profile lane has one thread
// (ServiceOptions::profile_lane), the only limit. The devices are opened for each profile, so that
// between profiles the GPU holds no profiler context or memory and no CUPTI tracing is left
// running. The handlers are thread-safe.
#ifndef TANDEM_SERVER_MODEL_RPCS_H_
#define TANDEM_SERVER_MODEL_RPCS_H_

#include <string>

#include "node/placement.h"
#include "server/tandem_service.h"

namespace tandem::server {

// Each plan holds planner::PlanningMemoryBytes from `jobs`' budget while it
// solves; RESOURCE_EXHAUSTED when that does not fit now. `jobs` must outlive
// the handler.
PlanHandler MakePlanHandler(node::NodeOffer node, PathResolver resolve, JobManager* jobs);

// `threads`: CPU threads for the host's measurements (0 = all cores). Each
// profile holds host memory from `jobs`' budget while it measures (the
// model's estimate plus kProfileOverhead and a quarter), and its CPU
// allocators are limited to that; RESOURCE_EXHAUSTED when it does not fit now.
// `jobs` must outlive the handler.
ProfileHandler MakeProfileHandler(std::string cache_dir, PathResolver resolve, int threads,
                                  JobManager* jobs);

// What a profile reserves beyond its model's estimate: the profiler's own
// buffers (cache eviction, peak measurements, per-layer inputs).
constexpr int64_t kProfileOverhead = int64_t{64} << 20;

}  // namespace tandem::server

#endif  // TANDEM_SERVER_MODEL_RPCS_H_
