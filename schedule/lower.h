// Lower: a plan's Decisions to the Schedule of one training step
// (schedule.h). The program it writes, for each kind of plan:
//
// ACCELERATOR PLANS (gpu_only, zero_offload, reuse_distance). Layers
// l = 0..L-1, micro-batches j = 0..M-1. The accelerator's compute stream runs
//     for j: FORWARD(0..L-1, j), then for l = L-1..0: [RECOMPUTE(l, j)],
//            BACKWARD(l, j), and when j = M-1 and l updates on the
//            accelerator, UPDATE(l) right after its backward.
// Gradients accumulate over micro-batches; updates follow the last one.
// Layers without parameters have no update and no gradient traffic.
//
// A layer updated on the host: when BACKWARD(l, M-1) ends, GRADIENT_D2H(l) on
// the D2H engine, then UPDATE(l) on the host update pool (gradient-ready
// order, L-1 first), then PARAMETER_H2D(l) on the H2D engine. FORWARD(l, 0) of the next
// iteration waits for that copy; with delayed_parameter_update, for the one of
// the iteration before (lag 2: the forward uses weights one update old).
//
// Parameter home HOST_STREAMED (update on the host; a layer without parameters
// streams nothing and computes as if resident): before each FORWARD(l, j)
// and each BACKWARD(l, j) (or its RECOMPUTE) a PARAMETER_H2D of its weights,
// issued when the compute stream starts the previous FORWARD/BACKWARD
// (prefetch one layer ahead). The forward copy of micro-batch 0 also waits for
// UPDATE(l) of the previous iteration: it brings the new weights, so such a
// layer has no separate return copy. The copy is allocated when it starts and
// freed when the forward (backward) ends.
//
// STREAMED OPTIMIZER STATE (stream_state: update ACCELERATOR, weights
// resident). The layer's optimizer state S = optimizer_state bytes (with its
// fp32 master weights in mixed precision) lives on the host; UPDATE(l) runs on
// the compute stream right after BACKWARD(l, M-1) as for resident state (with
// state_update_lag q > 0 and neither clipping nor ranks: after BACKWARD(max(l
// - q, 0), M-1) and the updates placed there before it, L-1 first), but
// waits for a STATE_H2D of S on the H2D engine and is followed by a STATE_D2H
// of S on the D2H engine. The STATE_H2D is prefetched d =
// state_prefetch_layers layers ahead: issued when BACKWARD(min(l + d, L-1),
// M-1) starts (for l = L-1, its own). Two state buffers
// at most are in flight: the STATE_H2D of the k-th streamed update of the
// step (program order, L-1 first) also waits for the (k-1)-th UPDATE to start
// and for the STATE_D2H of the (k-2)-th to end; and for the layer's STATE_D2H
// of the step before (lag 1), whose bytes it reads. S is allocated on the accelerator when the
// STATE_H2D starts and freed when the STATE_D2H ends; the update holds update_staging (the bf16
// gradient widened to fp32) while it runs. On a data-parallel rank the update
// also waits for its bucket's ALL_REDUCE, as a resident one does (DATA-PARALLEL
// RANKS; state_update_lag does not apply there), and S stays whole on every
// rank, partitioned host state or not.
//
// Activations, per micro-batch (A = activation bytes; checkpoint C = min(A,
// output bytes of layer l-1), 0 for l = 0):
//   KEEP       A allocated when FORWARD starts, freed when BACKWARD ends.
//   OFFLOAD    ACTIVATION_D2H on the D2H engine after the forward; A freed on
//              the accelerator when it ends (the host holds A from its start
//              until the ACTIVATION_H2D ends); ACTIVATION_H2D before BACKWARD,
//              issued like a streamed parameter and after the D2H; A
//              allocated when it starts, freed when BACKWARD ends.
//   RECOMPUTE  A - C freed when the next layer's FORWARD ends (its own for the
//              last layer); a RECOMPUTE (the forward again) before BACKWARD
//              allocates A - C when it starts.
// Workspace is held during each FORWARD, RECOMPUTE and BACKWARD; a layer's
// gradient from the start of BACKWARD(l, 0) until GRADIENT_D2H(l) ends (host
// update) or UPDATE(l) ends (accelerator update).
//
// cpu_only. The same program on HOST_COMPUTE, parameters, gradients and
// optimizer state in host memory; UPDATE(l) on the host update pool after
// BACKWARD(l, M-1); FORWARD(l, 0) of the next iteration waits for it.
//
// hetero_dp. The accelerator runs the program above over its share in
// micro-batches (state resident, KEEP or RECOMPUTE); HOST_COMPUTE runs all
// layers over the rest in one micro-batch, keeping its activations. Per layer,
// L-1 first: GRADIENT_SYNC on the D2H engine (accelerator gradient down) after
// the accelerator's last BACKWARD(l); on the host update pool the average of
// the two once that copy and the host's BACKWARD(l) end, then the host
// replica's UPDATE(l); GRADIENT_SYNC on the H2D engine (averaged gradient
// back). After its last backward the accelerator runs UPDATE(L-1..0), each
// after its averaged gradient. Each replica's next FORWARD(l) waits for its
// own UPDATE(l).
//
// Gradient clipping (LowerOptions::clip_gradients): every update needs the
// global norm, so none runs until GRADIENT_NORM has read every gradient. It
// runs after the last backward on the program's compute stream (accelerator
// plans: also after every GRADIENT_D2H; cpu_only: on HOST_COMPUTE) or, for
// hetero_dp, on the host update pool after every average. The accelerator's
// UPDATEs follow it on the compute stream (L-1 first); host UPDATEs wait for it.
//
// DATA-PARALLEL RANKS (LowerOptions::ranks > 1). Every gradient is summed over
// the ranks before its update reads it. Layers with parameters join buckets,
// L-1 first, as their gradients become final where their updates read them:
// after BACKWARD(l, M-1) (cpu_only; accelerator updates) or after
// GRADIENT_D2H(l) (host updates). A bucket closes once it holds bucket_bytes of
// gradient, or before a gradient in the other memory joins it; each bucket is
// one ALL_REDUCE on the NETWORK stream (a stream, so that every rank issues the
// same collectives in the same order), covering layers [layer, layer +
// bucket_layers), the host's gradients or the accelerator's. Host updates wait
// for their bucket; accelerator updates move behind the last backward (as
// under clipping), L-1 first, each after its bucket; GRADIENT_NORM waits for
// every bucket. The collectives thereby overlap the rest of backward.
//
// ZeRO-partitioned host state (LowerOptions::partition_host_state, ZeRO-Offload
// on many ranks): a host bucket is a REDUCE_SCATTER instead: rank r receives
// the summed gradient of piece r of the bucket (the bucket's floats cut into
// `ranks` consecutive pieces) and its host UPDATEs step that piece alone,
// with the optimizer state of that piece alone. Once every bucket is summed,
// one ALL_GATHER per host bucket (in bucket order, on the NETWORK stream)
// brings every rank's updated piece to every rank, after the bucket's
// UPDATEs (the weights as the accelerator takes them: in a mixed-precision
// plan the bf16 working copies, each rank keeping only its pieces of the
// fp32 masters); the weights' way back to the accelerator (the PARAMETER_H2D of
// resident weights, a streamed layer's next prefetch, cpu_only's next
// FORWARD) waits for the ALL_GATHER instead of the UPDATE. Under clipping the
// GRADIENT_NORM sums the squares of the rank's pieces and the accelerator's
// gradients, and adds the other ranks' pieces in a reduction of its own (the
// NETWORK stream is idle then: every bucket is summed and no ALL_GATHER can
// start before the updates that wait for the norm).
//
// Resident memory. Accelerator: resident parameters and the optimizer state of
// layers updated there (not streamed). Host: master parameters, gradient and
// optimizer state of every layer updated on the host (of its state 1/ranks,
// rounded up, when partitioned); the streamed state of the others.
#ifndef TANDEM_SCHEDULE_LOWER_H_
#define TANDEM_SCHEDULE_LOWER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "schedule/decisions.h"
#include "schedule/schedule.h"

namespace tandem::schedule {

// A layer's bytes as the schedule accounts them. The accelerator replica's
// figures are at micro_batch_size samples (the host's at micro_batch_size for
// cpu_only); host_* are hetero_dp's host replica at its whole share.
struct LayerSizes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer_state = 0;
  // Bytes an update reads and writes.
  int64_t update = 0;
  // Bytes an accelerator update of streamed state allocates while it runs.
  int64_t update_staging = 0;
  int64_t activations = 0;
  int64_t checkpoint = 0;
  int64_t workspace = 0;
  int64_t host_activations = 0;
  int64_t host_checkpoint = 0;
  int64_t host_workspace = 0;
  bool has_parameters() const { return parameters > 0 || gradients > 0; }
};

// INVALID_ARGUMENT naming the plan field when `decisions` are not a program
// the rules above cover (e.g. a HOST_STREAMED layer updated on the accelerator);
// `has_accelerator` says whether the target has one.
absl::Status Validate(const Decisions& decisions, int num_layers, bool has_accelerator);

// What the step needs beyond the plan's decisions.
struct LowerOptions {
  bool has_accelerator = true;
  // The optimizer clips gradients to a global norm (max_grad_norm > 0).
  bool clip_gradients = false;
  // Data parallelism: the step is one of `ranks` ranks' (see DATA-PARALLEL
  // RANKS above); hetero_dp is refused for ranks > 1.
  int ranks = 1;
  // A bucket closes once it holds at least this many bytes of gradient.
  int64_t bucket_bytes = int64_t{25} << 20;
  // ZeRO with offload (see DATA-PARALLEL RANKS): the host's buckets are
  // reduce-scattered and all-gathered, and each rank keeps 1/ranks of the
  // optimizer state of the layers the host updates.
  bool partition_host_state = false;
};

// `sizes` has one entry per layer. Validates first.
absl::StatusOr<Schedule> Lower(const Decisions& decisions, const std::vector<LayerSizes>& sizes,
                               const LowerOptions& options);
absl::StatusOr<Schedule> Lower(const Decisions& decisions, const std::vector<LayerSizes>& sizes,
                               bool has_accelerator = true);

}  // namespace tandem::schedule

#endif  // TANDEM_SCHEDULE_LOWER_H_
