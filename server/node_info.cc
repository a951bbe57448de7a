#include "server/node_info.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/build_info.h"
#include "runtime/cpu/onednn.h"
#include "server/metrics/exposer.h"
#include "server/metrics/nvml_collector.h"

namespace tandem::server {
namespace {

const tandem::v1::JobState kStates[] = {
    tandem::v1::JOB_STATE_QUEUED, tandem::v1::JOB_STATE_RUNNING, tandem::v1::JOB_STATE_SUCCEEDED,
    tandem::v1::JOB_STATE_FAILED, tandem::v1::JOB_STATE_CANCELLED};

std::string StateName(tandem::v1::JobState s) {
  return std::string(absl::StripPrefix(tandem::v1::JobState_Name(s), "JOB_STATE_"));
}

}  // namespace

tandem::v1::NodeInfo BuildNodeInfo(const NodeResources& resources, JobManager& jobs,
                                   const google::protobuf::Timestamp& start_time) {
  tandem::v1::NodeInfo node;
  node.set_hostname(resources.hostname);
  node.set_version(TandemVersion());
  node.set_git_commit(GitCommit());
  *node.mutable_start_time() = start_time;
  if (const std::shared_ptr<const node::NodeOffer> offer = jobs.node(); offer && offer->profile) {
    *node.mutable_profile() = *offer->profile;
    node.set_profile_source(offer->profile_source);
  }
  const JobManager::Snapshot snapshot = jobs.TakeSnapshot();
  auto* cpu = node.add_devices();
  cpu->set_id("cpu");
  cpu->set_kind(tandem::v1::DEVICE_KIND_CPU);
  cpu->set_name(absl::StrCat(resources.cpu_name, " (", resources.cpu_threads, " threads)"));
  cpu->set_memory_total_bytes(resources.host_memory_bytes);
  cpu->set_memory_budget_bytes(jobs.options().host_memory_budget_bytes);
  cpu->set_memory_reserved_bytes(snapshot.reserved_host_bytes);
  cpu->set_threads(resources.cpu_threads);
  (*cpu->mutable_versions())["onednn"] = cpu::OneDnnVersion();
  (*cpu->mutable_versions())["onednn_isa"] = cpu::OneDnnIsa();
  auto* use = cpu->mutable_memory_in_use();
  use->set_parameter_bytes(snapshot.host_memory.in_use(MemoryCategory::kParameters));
  use->set_gradient_bytes(snapshot.host_memory.in_use(MemoryCategory::kGradients));
  use->set_optimizer_state_bytes(snapshot.host_memory.in_use(MemoryCategory::kOptimizerState));
  use->set_activation_bytes(snapshot.host_memory.in_use(MemoryCategory::kActivations));
  use->set_workspace_bytes(snapshot.host_memory.in_use(MemoryCategory::kWorkspace));
  use->set_total_bytes(snapshot.host_memory.total_in_use_bytes);
  for (const cuda::CudaDeviceInfo& d : resources.cuda_devices) {
    auto* gpu = node.add_devices();
    gpu->set_id(absl::StrCat("cuda:", d.ordinal));
    gpu->set_kind(tandem::v1::DEVICE_KIND_CUDA);
    gpu->set_name(d.name);
    gpu->set_memory_total_bytes(d.memory_bytes);
    gpu->set_memory_budget_bytes(jobs.options().accelerator_memory_budget_bytes);
    gpu->set_memory_reserved_bytes(snapshot.reserved_accelerator_bytes);
    gpu->set_threads(d.multiprocessors);
    gpu->set_compute_capability(absl::StrCat(d.compute_major, ".", d.compute_minor));
  }
  for (tandem::v1::JobState s : kStates) {
    auto it = snapshot.jobs_by_state.find(s);
    (*node.mutable_jobs_by_state())[StateName(s)] =
        it == snapshot.jobs_by_state.end() ? 0 : it->second;
  }
  if (const std::shared_ptr<const node::NodeOffer> offer = jobs.node()) {
    node.set_emulated_accelerators(std::max(1, offer->emulated_accelerators));
  }
  node.set_accepting_jobs(snapshot.accepting);
  node.set_not_accepting_reason(snapshot.not_accepting_reason);
  node.add_features("onednn");
  node.add_features("emulated_accelerator");
  if (cuda::BuiltWithCuda()) node.add_features("cuda");
  return node;
}

void ExportNodeMetrics(JobManager& jobs, ServerMetrics* metrics) {
  const JobManager::Snapshot s = jobs.TakeSnapshot();
  for (tandem::v1::JobState state : kStates) {
    auto it = s.jobs_by_state.find(state);
    std::string label = StateName(state);
    for (char& c : label) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    metrics->jobs.Add({{"state", label}}).Set(it == s.jobs_by_state.end() ? 0 : it->second);
  }
  metrics->queue_length.Add({}).Set(static_cast<double>(s.queued));
  for (int c = 0; c < kMemoryCategoryCount; ++c) {
    metrics->device_memory
        .Add({{"device", "cpu"}, {"category", MemoryCategoryName(static_cast<MemoryCategory>(c))}})
        .Set(static_cast<double>(s.host_memory.in_use_bytes[c]));
  }
  metrics->device_memory_reserved.Add({{"device", "cpu"}})
      .Set(static_cast<double>(s.reserved_host_bytes));
  if (const std::shared_ptr<const node::NodeOffer> offer = jobs.node();
      offer && !offer->cuda_devices.empty()) {
    metrics->device_memory_reserved.Add({{"device", "cuda:0"}})
        .Set(static_cast<double>(s.reserved_accelerator_bytes));
    metrics->device_memory_budget.Add({{"device", "cuda:0"}})
        .Set(static_cast<double>(jobs.options().accelerator_memory_budget_bytes));
  }
}

std::vector<std::shared_ptr<prometheus::Collectable>> MetricsSources(
    ServerMetrics& metrics, JobManager& jobs, const std::string& nvml_library) {
  std::vector<std::shared_ptr<prometheus::Collectable>> sources = {
      std::make_shared<metrics::ScrapeHook>([&metrics, &jobs] {
        metrics.SampleProcess();
        ExportNodeMetrics(jobs, &metrics);
      }),
      metrics.registry, metrics.job_telemetry};
  if (nvml_library.empty()) return sources;
  absl::StatusOr<std::shared_ptr<metrics::NvmlCollector>> nvml =
      metrics::NvmlCollector::Open(nvml_library);
  if (nvml.ok()) {
    std::fprintf(stderr, "tandemd: GPU gauges from NVML for %d device(s)\n",
                 (*nvml)->device_count());
    sources.push_back(*std::move(nvml));
  } else {
    std::fprintf(stderr, "tandemd: no GPU gauges: %s\n",
                 std::string(nvml.status().message()).c_str());
  }
  return sources;
}

}  // namespace tandem::server
