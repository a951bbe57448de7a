// PipeDream's partitioner (Narayanan et al., SOSP'19): split a chain of layers
// into contiguous stages, one per accelerator, minimising the slowest stage,
// where a stage's time is the larger of its compute (forward + backward of
// one micro-batch) and the time to exchange its boundary tensors (its output
// forward and that output's gradient backward, over the peer link). Dynamic
// program over (layers so far, stages so far). A stage that does not fit as
// it is may recompute its activations (counting its forward twice) or offload
// its optimizer state and update to the host, whichever fits and adds less to
// the step ((M + S - 1) forwards against the offloaded update's extra time),
// both if need be:
//
//   A(j, s) = min_{i<j} max(A(i, s-1), 2 * C(i-1), T(i..j-1))
//
// with prefix sums for T, so O(S * L^2). A stage must fit its device: its
// parameters, gradients and optimizer state, plus the activations of the
// micro-batches in flight (under 1F1B S - k for stage k, at most the number
// of micro-batches; under GPipe all of them), each with the stage's input
// (the previous stage's output, kept for the backward). Every accelerator takes at least one layer;
// with fewer layers than devices, some devices stay idle.
//
// Free function; thread-compatible.
#ifndef TANDEM_PLANNER_PIPELINE_PARTITIONER_H_
#define TANDEM_PLANNER_PIPELINE_PARTITIONER_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/cost_model.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::planner {

struct PipelineRequest {
  int devices = 2;
  int micro_batch_size = 1;
  int micro_batches = 1;
  // Per device, in bytes.
  int64_t device_memory_bytes = 0;
  // GPipe holds every micro-batch's activations on every stage; 1F1B at most
  // K - k on stage k.
  bool gpipe = false;
  // PipeDream: stage k also keeps min(S-k-1, micro_batches) + 1 versions of
  // its weights when it has stale ones (weight stashing).
  bool stash_weights = false;
  // PipeDream with vertical sync: every stage stashes min(S-k-1,
  // micro_batches) + 1 versions, and stage k > 0 keeps k + 1 more (the
  // versions the first stage's micro-batches still need).
  bool vertical_sync = false;
  // PipeDream without a drain between steps: stage k's stale versions are
  // S - k - 1, not bounded by the micro-batches.
  bool continuous = false;
  // A stage whose activations do not fit may recompute them (GPipe's
  // re-materialisation): it then keeps each micro-batch's input alone and
  // holds one micro-batch's activations at a time, for one more forward per
  // micro-batch. Not with weight stashing.
  bool allow_recompute = false;
  // A stage may instead (or as well) keep its optimizer state on the host and
  // update there (ZeRO-Offload within the stage): its device holds weights and
  // gradients only, and its update becomes gradients down, the host's update
  // on `host_threads` threads, weights up. Not with weight stashing. With
  // `offload_fewest_layers`, only its fewest last layers that make it fit
  // (PipelineStage.host_updated_layers), else all of them.
  bool allow_offload = false;
  bool offload_fewest_layers = true;
  // Where no such way fits, an offloading stage may also keep its
  // host-updated layers' weights on the host (PipelineStage.stream_weights):
  // the device holds two of their layers' weights at a time (counted as its
  // two largest), and each forward and backward (and recompute) copies them
  // up one layer ahead of the compute (what the compute since the streamed
  // layer before does not hide adds to the stage's time);
  // their weights no longer go up after the update.
  bool allow_stream_weights = false;
  // A stage whose activations do not fit may instead send each micro-batch's
  // down to the host after its forward and fetch them back before its
  // backward: two micro-batches' activations (one waiting for each copy),
  // for two copies of the stage's activations per micro-batch over the host
  // links, beside its compute, instead of a forward.
  bool allow_offload_activations = false;
  int host_threads = 0;
  // Per layer, a factor on its forward and backward (the stage's share of
  // the threads, measured corrections); empty: 1.
  std::vector<double> compute_scale;
  // True once the caller has gone (PlanRequest::stop): the partition ends
  // with CANCELLED within one stage boundary's candidates. Null = never.
  std::function<bool()> stop;
};

// Stages in chain order. INVALID_ARGUMENT for bad counts; RESOURCE_EXHAUSTED
// when no partition fits the devices' memory.
absl::StatusOr<std::vector<tandem::v1::PipelineStage>> PartitionPipeline(
    const CostModel& cost, const PipelineRequest& request);

// `given`'s stages (their layers, recompute, offload_optimizer,
// host_updated_layers, stream_weights and offload_activations) timed and
// sized as PartitionPipeline would: INVALID_ARGUMENT when they do not cover
// the layers in order. A stage that does not fit is returned as it is.
absl::StatusOr<std::vector<tandem::v1::PipelineStage>> TimePipelineStages(
    const CostModel& cost, const PipelineRequest& request,
    const std::vector<tandem::v1::PipelineStage>& given);

// The first layer of `stage` that updates on the host (offload_optimizer,
// host_updated_layers); last_layer + 1 when none does.
int HostUpdatedFrom(const tandem::v1::PipelineStage& stage);

// Layer `layer`'s update when its stage offloads it: its gradients down, the
// host's update on `host_threads` threads (0: all of them), its weights up
// (not when its stage streams them: `weights_up` false).
double OffloadedUpdateSeconds(const CostModel& cost, int layer, int host_threads,
                              bool weights_up = true);

// The slowest stage's time: what bounds the pipeline's throughput, in
// seconds per micro-batch.
double BottleneckSeconds(const std::vector<tandem::v1::PipelineStage>& stages);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PIPELINE_PARTITIONER_H_
