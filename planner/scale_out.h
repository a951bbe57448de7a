// Data parallelism over several nodes of a hardware spec (docs/distributed.md):
// one rank per accelerator, each running its node's best plan on its share of
// the batch, its gradients reduced over the spec's links. The global batch
// grows with the nodes (weak scaling, as published DDP figures are).
//
// Communication is the hierarchical all-reduce of NCCL-style libraries on each
// gradient bucket of `bucket_bytes`: a reduce-scatter among a node's G
// accelerators (accelerator_to_accelerator), an all-reduce of each
// accelerator's 1/G slice with its peers on the other N - 1 nodes (network),
// an all-gather within the node; each phase a ring of alpha-beta steps:
//   2 (G-1)/G S / B_acc + 2 (G-1) a_acc + 2 (N-1)/N (S/G) / B_net + 2 (N-1) a_net.
// The step is the rank plan's as each rank's executor runs it: the plan
// lowered for its ranks (schedule/lower.h, DATA-PARALLEL RANKS: each bucket's
// collective on the NETWORK stream once backward has finished its layers,
// the previous bucket's done) and timed by the simulator, each collective at
// the formula's seconds (a reduce-scatter or all-gather at half an
// all-reduce's). What the collectives add is that step against the same
// program with them free.
//
// A node's G ranks share its host: each rank is planned with 1/G of the
// host's cores, rates, bandwidth and memory.
//
// Partitioned (ZeRO with offload), as the executor partitions: each host
// bucket is reduce-scattered, each rank updates 1/ranks of each host-updated
// layer, and the host's weights are all-gathered before they go back up; the
// accelerator's buckets are all-reduced whole. The optimizer state per rank is
// 1/ranks of it, so a plan that did not fit the host replicated may fit
// partitioned.
#ifndef TANDEM_PLANNER_SCALE_OUT_H_
#define TANDEM_PLANNER_SCALE_OUT_H_

#include <vector>

#include "absl/status/statusor.h"
#include "planner/planner.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::planner {

struct ScaleOutRequest {
  // The job on one rank's resources: `hardware` required; batch_size is one
  // node's batch (split over its accelerators).
  PlanRequest rank;
  std::vector<int> nodes;
  int64_t bucket_bytes = int64_t{25} << 20;
  tandem::v1::OptimizerSharding sharding = tandem::v1::OPTIMIZER_SHARDING_AUTO;
  // Bytes per gradient element on the wire: 4 (fp32), 2 (bf16 mixed precision).
  int gradient_bytes_per_element = 4;
};

// The hierarchical all-reduce of `bytes` over `nodes` nodes of `accelerators`
// each, in seconds (the formula above).
double AllReduceSeconds(const tandem::v1::HardwareSpec& hardware, int nodes, int accelerators,
                        double bytes);

absl::StatusOr<std::vector<tandem::v1::ScaleOutPlan>> PlanScaleOut(const ScaleOutRequest& request);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_SCALE_OUT_H_
