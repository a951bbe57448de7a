#include "server/model_rpcs.h"

#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/time_util.h"
#include "runtime/core/omp_threads.h"
#include "runtime/profile/node_devices.h"
#include "runtime/profile/node_profile.h"
#include "runtime/train/profile_model.h"

namespace tandem::server {

PlanHandler MakePlanHandler(PathResolver resolve, JobManager* jobs) {
  return [resolve = std::move(resolve), jobs](const tandem::v1::PlanModelRequest& request,
                                              tandem::v1::PlanModelResponse* response,
                                              const StopCheck& stop) {
    // A request naming its cost source needs no node; one for this node does.
    std::shared_ptr<const node::NodeOffer> node = jobs->node();
    if (node == nullptr) {
      if (request.cost_source_case() == tandem::v1::PlanModelRequest::COST_SOURCE_NOT_SET) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "this daemon has no node description: give a profile or hardware");
      }
      node = std::make_shared<const node::NodeOffer>();
    }
    node::PlanModelContext context;
    context.resolve = resolve;
    // The planner asks `stop` before every simulation once the caller has
    // gone; the plan's working memory is held from the host budget.
    context.stop = stop;
    context.reserve = [jobs](int64_t bytes) {
      return jobs->HoldHostMemory(bytes, "the plan", /*yield_to_queue=*/true);
    };
    context.measured = [jobs](const Model& model, const tandem::v1::JobSpec& resolved) {
      return jobs->MeasuredLayerProfile(model, resolved);
    };
    context.pipeline_corrections = [jobs](const Model& model, const tandem::v1::JobSpec& resolved,
                                          const tandem::v1::Profile* base) {
      return jobs->PipelineCorrections(model, resolved, base);
    };
    // As the job would be resolved: the same rates and cache keys.
    context.job_threads = jobs->options().default_threads;
    absl::StatusOr<tandem::v1::PlanModelResponse> answer = node::PlanModel(request, *node, context);
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
    absl::StatusOr<JobManager::Resolved> resolved =
        jobs->Resolve(profile::ProfiledPart(request.spec()), /*plan=*/false);
    if (!resolved.ok()) return ToGrpc(resolved.status());
    const MemoryEstimate& estimate = resolved->estimate;
    const int64_t model_bytes = estimate.host_bytes - estimate.data_bytes;
    const int64_t hold_bytes = model_bytes + model_bytes / 4 + kProfileOverhead;
    absl::StatusOr<std::shared_ptr<void>> hold =
        jobs->HoldHostMemory(hold_bytes, "the profile", /*yield_to_queue=*/true);
    if (!hold.ok()) return ToGrpc(hold.status());
    profile::ProfilerEnvironment env;
    env.cache_dir = cache_dir;
    env.resolve_path = resolve;
    env.threads = threads;
    env.stop = stop;
    env.cpu.allocator_budget_bytes = hold_bytes;
    // The devices and the measurement on a thread of their own: the CPU
    // device counts on the OpenMP team it is created under, and that team
    // would stay docked on this RPC thread (runtime/core/omp_threads.h).
    absl::StatusOr<profile::ProfileResult> result;
    RunOnOwnOmpThread(threads, [&] {
      const profile::NodeProfiledDevices node =
          profile::OpenNodeProfiledDevices(env.threads, env.cpu);
      for (const std::string& note : node.notes) {
        std::fprintf(stderr, "tandemd: profile: %s\n", note.c_str());
      }
      env.devices = node.devices();
      result = profile::ProfileModel(request, env);
    });
    if (!result.ok()) return ToGrpc(result.status());
    *response->mutable_profile() = std::move(result->profile);
    response->set_cached(result->cached);
    response->set_chrome_trace_json(std::move(result->chrome_trace_json));
    return grpc::Status::OK;
  };
}

void ApplyEmulatedSettings(const NodeOfferSettings& settings, node::NodeOffer* offer) {
  offer->emulated_link_throttle_bytes_per_second = settings.emulated_link_throttle_bytes_per_second;
  offer->emulated_accelerators = settings.emulated_accelerators;
  offer->emulated_peer_link = settings.emulated_peer_link;
}

absl::StatusOr<node::NodeOffer> MeasureNodeOffer(const NodeOfferSettings& settings, bool refresh,
                                                 absl::string_view measured_as) {
  profile::NodeProfileOptions options;
  options.cache_path = settings.state_dir + "/node_profile.pb";
  options.refresh = refresh;
  absl::StatusOr<profile::NodeProfileResult> result;
  // On a thread of its own: the measurement's parallel regions would leave
  // their workers docked on the caller (runtime/core/omp_threads.h).
  RunOnOwnOmpThread(settings.threads, [&] {
    const profile::NodeProfiledDevices devices = profile::OpenNodeProfiledDevices(settings.threads);
    for (const std::string& note : devices.notes) {
      std::fprintf(stderr, "tandemd: node profile: %s\n", note.c_str());
    }
    result = profile::LoadOrMeasureNodeProfile(devices.devices(), options);
  });
  if (!result.ok()) return result.status();
  for (const std::string& note : result->notes) {
    std::fprintf(stderr, "tandemd: node profile: %s\n", note.c_str());
  }
  node::NodeOffer node = node::NodeOfferFromProfile(
      result->profile, settings.accelerator_budget_bytes, settings.cuda_devices);
  ApplyEmulatedSettings(settings, &node);
  const std::string seconds = absl::StrFormat("%.1f s", result->profile.measure_seconds());
  node.profile_source =
      result->cached
          ? absl::StrCat(
                "cached in ", options.cache_path, " (measured ",
                google::protobuf::util::TimeUtil::ToString(result->profile.measured_time()), " in ",
                seconds, ")")
          : absl::StrCat(measured_as, " in ", seconds);
  std::fprintf(stderr, "tandemd: node profile %s\n", node.profile_source.c_str());
  return node;
}

NodeRefresher MakeNodeRefresher(NodeOfferSettings settings, JobManager* jobs) {
  return [settings = std::move(settings), jobs](const StopCheck&) {
    // No job starts while the node is measured, and none may be running.
    absl::StatusOr<std::shared_ptr<void>> hold =
        jobs->ReserveNodeForMeasuring(kNodeProfileHostBytes);
    if (!hold.ok()) {
      return ToGrpc(absl::Status(hold.status().code(),
                                 absl::StrCat("refresh_profile: ", hold.status().message())));
    }
    absl::StatusOr<node::NodeOffer> offer =
        MeasureNodeOffer(settings, /*refresh=*/true, "measured again on request");
    if (!offer.ok()) {
      return ToGrpc(
          absl::Status(offer.status().code(),
                       absl::StrCat("refresh_profile: measuring the node failed (",
                                    offer.status().message(), "); the old profile stays")));
    }
    jobs->ReplaceNode(*std::move(offer));
    return grpc::Status::OK;
  };
}

}  // namespace tandem::server
