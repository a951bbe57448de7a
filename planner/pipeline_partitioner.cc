#include "planner/pipeline_partitioner.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::planner {

namespace {

// How a stage holds its layers besides keeping everything on its device.
struct StageMode {
  bool recompute = false;
  bool offload = false;
};

}  // namespace

double OffloadedUpdateSeconds(const CostModel& cost, int layer, int host_threads) {
  return cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, cost.GradientBytes(layer)) +
         cost.UpdateSeconds(layer, tandem::v1::PLACEMENT_HOST,
                            host_threads > 0 ? host_threads : cost.host_threads()) +
         cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, cost.ParameterBytes(layer));
}

double BottleneckSeconds(const std::vector<tandem::v1::PipelineStage>& stages) {
  double worst = 0;
  for (const tandem::v1::PipelineStage& s : stages) {
    worst = std::max({worst, s.compute_seconds(), 2 * s.communication_seconds()});
  }
  return worst;
}

absl::StatusOr<std::vector<tandem::v1::PipelineStage>> PartitionPipeline(const CostModel& cost,
                                                                         const PipelineRequest& r) {
  const int L = cost.num_layers();
  if (r.devices < 1) return absl::InvalidArgumentError("pipeline_devices: must be >= 1");
  if (r.micro_batch_size < 1 || r.micro_batches < 1) {
    return absl::InvalidArgumentError("micro_batch_size: must be >= 1");
  }
  const int S = std::min(r.devices, L);
  const int m = r.micro_batch_size;
  // Prefix sums over the layers: forward + backward and forward alone of a
  // micro-batch; what offloading adds to the update; state (weights,
  // gradients, optimizer state), activations and optimizer state.
  std::vector<double> time(L + 1, 0.0), forward(L + 1, 0.0), offload_extra(L + 1, 0.0);
  std::vector<int64_t> state(L + 1, 0), activation(L + 1, 0), optimizer(L + 1, 0);
  for (int l = 0; l < L; ++l) {
    forward[l + 1] = forward[l] + cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m);
    time[l + 1] = time[l] + cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m) +
                  cost.BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m);
    offload_extra[l + 1] = offload_extra[l] + OffloadedUpdateSeconds(cost, l, r.host_threads) -
                           cost.UpdateSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, 1);
    state[l + 1] =
        state[l] + cost.ParameterBytes(l) + cost.GradientBytes(l) + cost.OptimizerStateBytes(l);
    activation[l + 1] = activation[l] + cost.ActivationBytes(l, m);
    optimizer[l + 1] = optimizer[l] + cost.OptimizerStateBytes(l);
  }
  // Sending layer l's output one way.
  auto send = [&](int l) { return cost.PeerCopySeconds(cost.OutputBytes(l, m)); };
  // Stage k holding layers [i, j) as `mode` says: their state (without the
  // optimizer state when offloading), and for each micro-batch in flight
  // their activations and the stage's input (layer i-1's output, received
  // from the stage before and kept for the backward); recomputing, every
  // micro-batch's input and one micro-batch's activations.
  auto stage_memory = [&](int k, int i, int j, StageMode mode) {
    const int64_t in_flight = r.gpipe ? r.micro_batches : std::min(S - k, r.micro_batches);
    const int64_t input = i > 0 ? cost.OutputBytes(i - 1, m) : 0;
    const int64_t stale = r.stash_weights ? std::min(S - k - 1, r.micro_batches) : 0;
    // Weight copies besides the stage's own: the stash (none without stale
    // gradients, unless vertical sync delays even the last stage's), and
    // vertical sync's history of the stage's latest versions.
    int64_t versions = stale > 0 || r.vertical_sync ? stale + 1 : 0;
    if (r.vertical_sync && k > 0) versions += k + 1;
    int64_t weights = 0;
    for (int l = i; l < j && versions > 0; ++l) weights += cost.ParameterBytes(l);
    const int64_t activations = mode.recompute
                                    ? in_flight * input + (activation[j] - activation[i])
                                    : in_flight * (activation[j] - activation[i] + input);
    const int64_t offloaded = mode.offload ? optimizer[j] - optimizer[i] : 0;
    return state[j] - state[i] - offloaded + activations + versions * weights;
  };
  // How stage k holds [i, j): as it is when that fits, else the fitting mix
  // of recomputing and offloading that adds least to the step; nullopt when
  // nothing fits.
  auto choose = [&](int k, int i, int j) -> std::optional<StageMode> {
    std::optional<StageMode> best;
    double best_added = 0;
    for (const StageMode mode : {StageMode{false, false}, StageMode{true, false},
                                 StageMode{false, true}, StageMode{true, true}}) {
      if ((mode.recompute && (!r.allow_recompute || r.stash_weights)) ||
          (mode.offload && (!r.allow_offload || r.stash_weights))) {
        continue;
      }
      if (r.device_memory_bytes > 0 && stage_memory(k, i, j, mode) > r.device_memory_bytes) {
        continue;
      }
      if (!mode.recompute && !mode.offload) return mode;  // fits as it is
      const double added =
          (mode.recompute ? (r.micro_batches + S - 1) * (forward[j] - forward[i]) : 0.0) +
          (mode.offload ? std::max(0.0, offload_extra[j] - offload_extra[i]) : 0.0);
      if (!best || added < best_added) {
        best = mode;
        best_added = added;
      }
    }
    return best;
  };
  auto stage_time = [&](int i, int j, StageMode mode) {
    return time[j] - time[i] + (mode.recompute ? forward[j] - forward[i] : 0.0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][j]: slowest stage when layers [0, j) form stages 0..s-1.
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(S + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= S; ++s) {
    for (int j = s; j <= L - (S - s); ++j) {
      for (int i = s - 1; i < j; ++i) {
        if (best[s - 1][i] == inf) continue;
        const std::optional<StageMode> mode = choose(s - 1, i, j);
        if (!mode) continue;
        const double boundary = i > 0 ? 2 * send(i - 1) : 0.0;
        const double slowest = std::max({best[s - 1][i], boundary, stage_time(i, j, *mode)});
        if (slowest < best[s][j]) {
          best[s][j] = slowest;
          cut[s][j] = i;
        }
      }
    }
  }
  if (best[S][L] == inf) {
    return absl::ResourceExhaustedError(absl::StrCat("no partition of ", L, " layers over ", S,
                                                     " accelerators fits ", r.device_memory_bytes,
                                                     " bytes per device"));
  }
  std::vector<tandem::v1::PipelineStage> stages(S);
  int j = L;
  for (int s = S; s >= 1; --s) {
    const int i = cut[s][j];
    const StageMode mode = choose(s - 1, i, j).value_or(StageMode{});
    tandem::v1::PipelineStage& stage = stages[s - 1];
    stage.set_device_index(s - 1);
    stage.set_first_layer(i);
    stage.set_last_layer(j - 1);
    stage.set_recompute(mode.recompute);
    stage.set_offload_optimizer(mode.offload);
    stage.set_compute_seconds(stage_time(i, j, mode));
    stage.set_communication_seconds(j < L ? send(j - 1) : 0.0);
    stage.set_memory_bytes(stage_memory(s - 1, i, j, mode));
    j = i;
  }
  return stages;
}

}  // namespace tandem::planner
