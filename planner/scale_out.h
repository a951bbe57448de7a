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
// Buckets are reduced in turn, each starting when backward has finished its
// layers (the rank plan's predicted timeline) and the previous one is done;
// what runs past the end of backward is exposed.
//
// A node's G ranks share its host: each rank is planned with 1/G of the
// host's cores, rates, bandwidth and memory.
//
// Partitioned (ZeRO with offload): each bucket is reduce-scattered (half the
// all-reduce's bandwidth term), each rank updates 1/ranks of the weights (the
// plan's update work after backward shrinks to 1/ranks), and the weights are
// all-gathered (the other half) before the next step. The optimizer state per rank is 1/ranks of
// it, so a plan that did not fit the host replicated may fit partitioned.
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
