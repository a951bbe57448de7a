// What this node has (detected once at start) and what it is doing (sampled on
// request): GetNode's answer and the node's gauges on each metrics scrape.
#ifndef TANDEM_SERVER_NODE_INFO_H_
#define TANDEM_SERVER_NODE_INFO_H_

#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/timestamp.pb.h"
#include "prometheus/collectable.h"
#include "runtime/cuda/device_query.h"
#include "server/job_manager.h"
#include "server/server_metrics.h"
#include "tandem/v1/node.pb.h"

namespace tandem::server {

struct NodeResources {
  std::string hostname;
  std::string cpu_name;
  int cpu_threads = 0;
  // Physical memory, or the container's memory limit when lower.
  int64_t host_memory_bytes = 0;
  // Where host_memory_bytes came from when not physical memory.
  std::string memory_note;
  std::vector<cuda::CudaDeviceInfo> cuda_devices;
  std::string cuda_note;
};

NodeResources DetectNodeResources();

tandem::v1::NodeInfo BuildNodeInfo(const NodeResources& resources, JobManager& jobs,
                                   const google::protobuf::Timestamp& start_time);

// Refreshes jobs-by-state and per-device memory gauges.
void ExportNodeMetrics(JobManager& jobs, ServerMetrics* metrics);

// What /metrics serves, in order: a hook that samples the process and the
// node's gauges first, the registry, the jobs' telemetry, and the GPUs' gauges
// from `nvml_library` where it loads (empty: none). Logs which GPU gauges
// are exported and, when NVML does not load, why.
std::vector<std::shared_ptr<prometheus::Collectable>> MetricsSources(
    ServerMetrics& metrics, JobManager& jobs, const std::string& nvml_library);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_NODE_INFO_H_
