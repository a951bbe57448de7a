// What this node is doing, sampled on request: GetNode's answer (with what the
// node has, node/resources.h) and the node's gauges on each metrics scrape.
#ifndef TANDEM_SERVER_NODE_INFO_H_
#define TANDEM_SERVER_NODE_INFO_H_

#include <memory>
#include <string>
#include <vector>

#include "google/protobuf/timestamp.pb.h"
#include "node/resources.h"
#include "prometheus/collectable.h"
#include "server/job_manager.h"
#include "server/server_metrics.h"
#include "tandem/v1/node.pb.h"

namespace tandem::server {

using node::NodeResources;

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
