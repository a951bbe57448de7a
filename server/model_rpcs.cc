#include "server/model_rpcs.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "runtime/profile/node_devices.h"
#include "runtime/train/profile_model.h"

namespace tandem::server {

PlanHandler MakePlanHandler(node::NodeOffer node, PathResolver resolve, JobManager* jobs) {
  return [node = std::move(node), resolve = std::move(resolve), jobs](
             const tandem::v1::PlanModelRequest& request, tandem::v1::PlanModelResponse* response,
             const StopCheck& stop) {
    // The planner asks `stop` before every simulation once the caller has
    // gone; the plan's working memory is held from the host budget.
    const node::MemoryReserver reserve = [jobs](int64_t bytes) {
      return jobs->HoldHostMemory(bytes, "the plan");
    };
    absl::StatusOr<tandem::v1::PlanModelResponse> answer =
        node::PlanModel(request, node, resolve, stop, reserve);
    if (!answer.ok()) return ToGrpc(answer.status());
    *response = *std::move(answer);
    return grpc::Status::OK;
  };
}

ProfileHandler MakeProfileHandler(std::string cache_dir, PathResolver resolve, int threads,
                                  JobManager* jobs) {
  return [cache_dir = std::move(cache_dir), resolve = std::move(resolve), threads, jobs](
             const tandem::v1::ProfileModelRequest& request,
             tandem::v1::ProfileModelResponse* response, const StopCheck& stop) {
    // The model's memory as a job would need it (its data is not loaded: the
    // profile reads headers only), held from the node's budget while it runs.
    absl::StatusOr<JobManager::Resolved> resolved = jobs->Resolve(request.spec(), /*plan=*/false);
    if (!resolved.ok()) return ToGrpc(resolved.status());
    const MemoryEstimate& estimate = resolved->estimate;
    const int64_t model_bytes = estimate.host_bytes - estimate.data_bytes;
    const int64_t hold_bytes = model_bytes + model_bytes / 4 + kProfileOverhead;
    absl::StatusOr<std::shared_ptr<void>> hold = jobs->HoldHostMemory(hold_bytes, "the profile");
    if (!hold.ok()) return ToGrpc(hold.status());
    profile::ProfilerEnvironment env;
    env.cache_dir = cache_dir;
    env.resolve_path = resolve;
    env.threads = threads;
    env.stop = stop;
    env.cpu.allocator_budget_bytes = hold_bytes;
    const profile::NodeProfiledDevices node =
        profile::OpenNodeProfiledDevices(env.threads, env.cpu);
    for (const std::string& note : node.notes) {
      std::fprintf(stderr, "tandemd: profile: %s\n", note.c_str());
    }
    env.devices = node.devices();
    absl::StatusOr<profile::ProfileResult> result = profile::ProfileModel(request, env);
    if (!result.ok()) return ToGrpc(result.status());
    *response->mutable_profile() = std::move(result->profile);
    response->set_cached(result->cached);
    response->set_chrome_trace_json(std::move(result->chrome_trace_json));
    return grpc::Status::OK;
  };
}

}  // namespace tandem::server
