// Schedule: one training step written down once, as data. For every resource
// (each accelerator's compute stream and copy engines, the host's update pool
// and compute, later each link and rank) the ordered list of operations it
// runs: forward, recompute and backward of a layer for a micro-batch, copies of
// weights, gradients and activations between memories, optimizer updates,
// hetero_dp's gradient average, a data-parallel rank's gradient all-reduce on
// the NETWORK stream, and (for what comes next) send/receive. Each operation names its dependencies
// and the memory it allocates and frees.
//
// Lower (lower.h) turns a plan's Decisions into a Schedule; the planner's
// simulator times it (simulate.h, planner/simulator.cc) and the plan executor
// runs it (runtime/exec/plan_executor.cc). Nothing else decides the order of
// work. docs/architecture.md has the picture.
//
// EXECUTION RULES (both the simulator and the executor follow them):
//  - A resource runs one operation at a time. A STREAM (every compute stream)
//    runs its operations in `order[resource]`: one starts when it is first in
//    line and its dependencies are met. A QUEUE (copy engines, the host update
//    pool) runs them in the order they become ready, the moment the last
//    dependency is met (ties in `order`), as a copy engine fed by several
//    producers does; `order` is then the program order they are issued in.
//    The order repeats every iteration: the first operation of iteration k+1
//    on a stream follows its last one of iteration k.
//  - A dependency names an operation of the same iteration (lag 0) or of the
//    iteration `lag` steps before (weights one update old, buffers reused from
//    the previous step); a lag reaching before the first iteration is met.
//  - A dependency `on_start` is met when that operation starts rather than
//    ends (a weight prefetch issued when the compute stream starts the span
//    before the one it feeds).
//  - Memory events change a pool's level when their operation starts or ends.
//
// Value type; thread-compatible.
#ifndef TANDEM_SCHEDULE_SCHEDULE_H_
#define TANDEM_SCHEDULE_SCHEDULE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "schedule/decisions.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::schedule {

// Which replicas a plan runs: its layers on the accelerator (gpu_only,
// zero_offload, reuse_distance), on the host (cpu_only), or both (hetero_dp).
enum class Mode { kAccelerator, kHost, kHetero };
Mode ModeOf(const Decisions& decisions);

enum class OpKind : int8_t {
  kForward,
  kRecompute,
  kBackward,
  // One layer's optimizer step.
  kUpdate,
  // A tensor from one memory to another over a link.
  kCopy,
  // hetero_dp: the host averages the two replicas' gradients of one layer.
  kGradientAverage,
  // The global gradient norm, for clipping (LowerOptions::clip_gradients):
  // every update waits for it.
  kGradientNorm,
  // A bucket of consecutive layers' gradients summed over the data-parallel
  // ranks (LowerOptions::ranks > 1) where the updates read them: on the
  // host for layers updated there, else on the accelerator.
  kAllReduce,
  // Between pipeline stages. No strategy lowers to these yet; the simulator
  // times them like copies and the executor rejects them.
  kSend,
  kReceive,
  // ZeRO-partitioned host state (LowerOptions::partition_host_state): a host
  // bucket's gradients summed over the ranks, rank r receiving only piece r
  // of it; after the rank's updates of its pieces, every rank's updated
  // weights of the bucket gathered on every rank.
  kReduceScatter,
  kAllGather,
};
const char* OpKindName(OpKind kind);

// What a copy moves.
// kOptimizerState: a layer's fp32 master weights (mixed precision) and
// optimizer state, streamed in for an accelerator update and back.
enum class TensorKind : int8_t { kNone, kWeights, kGradient, kActivation, kOptimizerState };

// Which replica an operation belongs to.
enum Replica : int8_t { kAcceleratorReplica = 0, kHostReplica = 1 };

struct Resource {
  tandem::v1::TimelineResource kind = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
  // Accelerator index within the node (copy engines and compute streams).
  int device = 0;
  // Data-parallel rank; 0 on one node.
  int rank = 0;
  // A stream (true) or a queue (false); see EXECUTION RULES.
  bool in_order = true;
};

// A memory whose level the schedule tracks: the host's, or an accelerator's.
struct MemoryPool {
  bool host = true;
  int device = 0;
  int rank = 0;
};

struct Dep {
  int op = -1;
  // Iterations back: 0 this one, 1 the one before...
  int lag = 0;
  bool on_start = false;
};

struct MemoryEvent {
  int pool = 0;
  bool at_end = false;
  int64_t delta = 0;
};

struct Op {
  OpKind kind = OpKind::kForward;
  // How the timeline shows it.
  tandem::v1::TimelinePhase phase = tandem::v1::TIMELINE_PHASE_UNSPECIFIED;
  int resource = 0;
  Replica replica = kAcceleratorReplica;
  int layer = -1;
  int micro_batch = 0;
  // Bytes moved (copies) or touched (updates, averages).
  int64_t bytes = 0;
  TensorKind tensor = TensorKind::kNone;
  // A copy that brings freshly updated weights to the accelerator: a compute
  // operation whose last dependency it is was stalled on the update.
  bool delivers_update = false;
  // kAllReduce, kReduceScatter, kAllGather: the bucket is layers [layer,
  // layer + bucket_layers); the host's gradients (kHostReplica) or the
  // accelerator's (kAllReduce only).
  int bucket_layers = 0;
  // Inline storage: an operation has a few of each, and a schedule has
  // thousands of operations (the planner lowers one per simulation).
  absl::InlinedVector<Dep, 4> deps;
  absl::InlinedVector<MemoryEvent, 2> memory;
};

// Per layer, the operations the reuse distance and slack are measured
// between (docs/planning.md); -1 where the layer has none.
struct LayerMarks {
  // FORWARD(l, 0) of the layer-computing replica.
  int first_forward = -1;
  // BACKWARD(l, M-1), or the accelerator UPDATE(l) right after it.
  int reuse_start = -1;
  // The host UPDATE(l) that produces the layer's next weights.
  int host_update = -1;
  // The PARAMETER_H2D that brings them back (resident weights only).
  int weights_return = -1;
  // Streamed optimizer state: the STATE_H2D that brings it in, and the
  // STATE_D2H that takes it back.
  int state_in = -1;
  int state_out = -1;
};

struct Schedule {
  Mode mode = Mode::kAccelerator;
  std::vector<Resource> resources;
  std::vector<MemoryPool> pools;
  // Per pool: bytes held for the whole run (resident weights, optimizer state...).
  std::vector<int64_t> resident_bytes;
  // Every operation of one iteration, in program order (the order Lower
  // wrote them; ties between simultaneous events go to the earlier one).
  std::vector<Op> ops;
  // Per resource, the order a stream runs its operations in; for a queue,
  // the order they are issued in.
  std::vector<std::vector<int>> order;
  // The operations whose earliest start marks the start of an iteration.
  std::vector<int> lead;
  std::vector<LayerMarks> layers;
  // The compute stream whose program defines reuse distances.
  int program_resource = 0;

  // Index of the resource of `kind` on accelerator `device`, rank 0; -1 if absent.
  int ResourceOf(tandem::v1::TimelineResource kind, int device = 0) const;
  int num_ops() const { return static_cast<int>(ops.size()); }
};

// One line per operation, grouped by resource in order: for tests and
// debugging.
std::string Describe(const Schedule& schedule);

}  // namespace tandem::schedule

#endif  // TANDEM_SCHEDULE_SCHEDULE_H_
