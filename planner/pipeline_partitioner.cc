#include "planner/pipeline_partitioner.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::planner {

double OffloadedUpdateSeconds(const CostModel& cost, int layer, int host_threads, bool weights_up) {
  return cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, cost.GradientBytes(layer)) +
         cost.UpdateSeconds(layer, tandem::v1::PLACEMENT_HOST,
                            host_threads > 0 ? host_threads : cost.host_threads()) +
         (weights_up ? cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE,
                                        cost.ParameterBytes(layer))
                     : 0.0);
}

int HostUpdatedFrom(const tandem::v1::PipelineStage& stage) {
  if (!stage.offload_optimizer()) return stage.last_layer() + 1;
  return stage.host_updated_layers() > 0 ? stage.last_layer() + 1 - stage.host_updated_layers()
                                         : stage.first_layer();
}

double BottleneckSeconds(const std::vector<tandem::v1::PipelineStage>& stages) {
  double worst = 0;
  for (const tandem::v1::PipelineStage& s : stages) {
    worst = std::max({worst, s.compute_seconds(), 2 * s.communication_seconds()});
  }
  return worst;
}

namespace {

// How a stage holds its layers besides keeping everything on its device.
struct StageMode {
  bool recompute = false;
  bool offload = false;
  // Each micro-batch's activations go down to the host after its forward and
  // come back before its backward (exclusive with recompute), beside the
  // compute (two micro-batches' held) or, `wait_copies`, waited for (one).
  bool offload_activations = false;
  bool wait_copies = false;
  // With offload: only the last this many layers (0: all of them).
  int host_layers = 0;
  // With offload: the host-updated layers' weights stay on the host and
  // come up for each forward and backward (and recompute) of each
  // micro-batch, beside the compute.
  bool stream_weights = false;
};

// The first layer of [i, j) that `mode` updates on the host (j: none).
int HostFrom(int i, int j, StageMode mode) {
  return !mode.offload ? j : mode.host_layers > 0 ? j - mode.host_layers : i;
}

// What a stage of S costs, from prefix sums over the layers: its time per
// micro-batch, its memory and how it holds its layers.
class StageCosts {
 public:
  StageCosts(const CostModel& cost, const PipelineRequest& r, int stages)
      : cost_(cost), r_(r), S_(stages), m_(r.micro_batch_size) {
    const int L = cost.num_layers();
    for (auto* v : {&time_, &forward_, &offload_extra_, &activation_copies_, &weights_up_}) {
      v->assign(L + 1, 0.0);
    }
    for (auto* v : {&state_, &activation_, &optimizer_, &parameters_}) v->assign(L + 1, 0);
    for (int l = 0; l < L; ++l) {
      const double scale = l < static_cast<int>(r.compute_scale.size()) ? r.compute_scale[l] : 1.0;
      const double f = scale * cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m_);
      forward_[l + 1] = forward_[l] + f;
      time_[l + 1] =
          time_[l] + f + scale * cost.BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m_);
      offload_extra_[l + 1] = offload_extra_[l] + OffloadedUpdateSeconds(cost, l, r.host_threads) -
                              cost.UpdateSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, 1);
      state_[l + 1] =
          state_[l] + cost.ParameterBytes(l) + cost.GradientBytes(l) + cost.OptimizerStateBytes(l);
      activation_[l + 1] = activation_[l] + cost.ActivationBytes(l, m_);
      activation_copies_[l + 1] =
          activation_copies_[l] +
          cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, cost.ActivationBytes(l, m_)) +
          cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, cost.ActivationBytes(l, m_));
      optimizer_[l + 1] = optimizer_[l] + cost.OptimizerStateBytes(l);
      parameters_[l + 1] = parameters_[l] + cost.ParameterBytes(l);
      weights_up_[l + 1] =
          weights_up_[l] +
          cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, cost.ParameterBytes(l));
    }
    // Sparse table of the layer with the largest weights over each range of
    // 2^e layers.
    largest_.push_back(std::vector<int>(L));
    for (int l = 0; l < L; ++l) largest_[0][l] = l;
    for (int e = 1; (1 << e) <= L; ++e) {
      const std::vector<int>& below = largest_[e - 1];
      std::vector<int> row(L - (1 << e) + 1);
      for (size_t l = 0; l < row.size(); ++l) {
        row[l] = Larger(below[l], below[l + (1 << (e - 1))]);
      }
      largest_.push_back(std::move(row));
    }
  }

  // The layer of [i, j) with the largest weights (-1 when empty).
  int Largest(int i, int j) const {
    if (j <= i) return -1;
    int e = 0;
    while ((2 << e) <= j - i) ++e;
    return Larger(largest_[e][i], largest_[e][j - (1 << e)]);
  }
  // The weights of the two layers of [i, j) with the largest: what a stage
  // streaming them holds at most (the one computing, the one coming).
  int64_t TwoLargestWeights(int i, int j) const {
    const int first = Largest(i, j);
    if (first < 0) return 0;
    const int second = Larger(Largest(i, first), Largest(first + 1, j));
    return cost_.ParameterBytes(first) + (second < 0 ? 0 : cost_.ParameterBytes(second));
  }

  // Of two layers (-1: none), the one with larger weights.
  int Larger(int a, int b) const {
    if (a < 0 || b < 0) return std::max(a, b);
    return cost_.ParameterBytes(b) > cost_.ParameterBytes(a) ? b : a;
  }

  // Sending layer l's output one way.
  double Send(int l) const { return cost_.PeerCopySeconds(cost_.OutputBytes(l, m_)); }

  // Forward and backward of a micro-batch over [i, j), and the forward again
  // when recomputing, or the activations' copies down and back when
  // offloading them (on the stage's own thread, after its forward and before
  // its backward).
  double Time(int i, int j, StageMode mode) const {
    return time_[j] - time_[i] + Extra(i, j, mode);
  }
  // What recomputing or offloading activations adds to each micro-batch.
  // The runner copies offloaded activations on the stage's copy thread
  // while it computes: only copies longer than the compute add, unless the
  // stage waits for each.
  // Streamed weights' copies are what the stage's compute does not hide of
  // them (ExposedFetches).
  double Extra(int i, int j, StageMode mode) const {
    const double fetches =
        mode.stream_weights ? ExposedFetches(i, j, HostFrom(i, j, mode), mode.recompute) : 0.0;
    if (mode.recompute) return forward_[j] - forward_[i] + fetches;
    if (mode.offload_activations) {
      const double copies = activation_copies_[j] - activation_copies_[i];
      return (mode.wait_copies ? copies : std::max(0.0, copies - (time_[j] - time_[i]))) + fetches;
    }
    return fetches;
  }

  // Per micro-batch, what of the streamed layers' (those of [h, j) with
  // weights) copies up the compute of [i, j) does not hide. The runner
  // copies a streamed layer's weights while the stage computes from the
  // streamed layer before it in the op on (the op's first during the op
  // before: counted hidden), one copy at a time: a forward up the stage, a
  // backward down it, and recomputing one forward more.
  double ExposedFetches(int i, int j, int h, bool recompute) const {
    double exposed = 0;
    for (const bool backward : {false, true}) {
      double window = -1;  // compute since the streamed layer before began
      for (int n = 0; n < j - i; ++n) {
        const int l = backward ? j - 1 - n : i + n;
        const double fetch = weights_up_[l + 1] - weights_up_[l];
        if (l >= h && fetch > 0) {
          const int passes = !backward && recompute ? 2 : 1;
          if (window >= 0) exposed += passes * std::max(0.0, fetch - window);
          window = 0;
        }
        const double forward = forward_[l + 1] - forward_[l];
        if (window >= 0) window += backward ? time_[l + 1] - time_[l] - forward : forward;
      }
    }
    return exposed;
  }

  // What the update adds over the device's, per step: the offloaded layers'
  // host updates, without their weights' copy up when streamed (the next
  // forward fetches them).
  double OffloadAdded(int i, int j, StageMode mode) const {
    const int h = HostFrom(i, j, mode);
    const double added = offload_extra_[j] - offload_extra_[h];
    return std::max(0.0, mode.stream_weights ? added - (weights_up_[j] - weights_up_[h]) : added);
  }

  // Stage k holding layers [i, j) as `mode` says: their state (without the
  // optimizer state when offloading), and for each micro-batch in flight
  // their activations and the stage's input (layer i-1's output, received
  // from the stage before and kept for the backward); recomputing, every
  // micro-batch's input and one micro-batch's activations; offloading
  // activations, every input and the activations of two micro-batches in
  // flight (one computing, one moving; the others' are on the host), or of
  // one when waiting for the copies. Over a peer link
  // also the gradient of its input, which waits on its device until the
  // stage before pulls it.
  int64_t Memory(int k, int i, int j, StageMode mode) const {
    // A continuous PipeDream keeps S-k in flight across steps, whatever M.
    const int64_t in_flight = r_.gpipe        ? r_.micro_batches
                              : r_.continuous ? S_ - k
                                              : std::min(S_ - k, r_.micro_batches);
    const int64_t input = i > 0 ? cost_.OutputBytes(i - 1, m_) : 0;
    const int64_t stale = !r_.stash_weights ? 0
                          : r_.continuous   ? S_ - k - 1
                                            : std::min(S_ - k - 1, r_.micro_batches);
    // Weight copies besides the stage's own: the stash (none without stale
    // gradients, unless vertical sync delays even the last stage's), and
    // vertical sync's history of the stage's latest versions.
    int64_t versions = stale > 0 || r_.vertical_sync ? stale + 1 : 0;
    if (r_.vertical_sync && k > 0) versions += k + 1;
    const int64_t weights = parameters_[j] - parameters_[i];
    const int64_t held = mode.recompute || mode.wait_copies ? 1
                         : mode.offload_activations         ? std::min<int64_t>(in_flight, 2)
                                                            : in_flight;
    const int64_t activations = in_flight * input + held * (activation_[j] - activation_[i]);
    const int h = HostFrom(i, j, mode);
    // Streaming: the host-updated layers' weights stay on the host, but for
    // the two layers' the device holds at a time (the one computing, the
    // one coming).
    const int64_t offloaded =
        optimizer_[j] - optimizer_[h] +
        (mode.stream_weights ? parameters_[j] - parameters_[h] - TwoLargestWeights(h, j) : 0);
    const int64_t awaiting_pull = cost_.has_peer_link() ? input : 0;
    return state_[j] - state_[i] - offloaded + activations + versions * weights + awaiting_pull;
  }

  // How stage k holds [i, j): as it is when that fits, else the fitting mix
  // of recomputing or offloading its activations and offloading the
  // optimizer state of its fewest last layers that adds least to the step
  // ((M + S - 1) forwards, or activation copies, against the offloaded
  // updates' extra time); only where none of those fits, the same with
  // those layers' weights streamed; nullopt when nothing fits.
  std::optional<StageMode> Choose(int k, int i, int j) const {
    std::optional<StageMode> best = ChooseAmong(k, i, j, /*stream_weights=*/false);
    if (best || !r_.allow_stream_weights) return best;
    return ChooseAmong(k, i, j, /*stream_weights=*/true);
  }

  std::optional<StageMode> ChooseAmong(int k, int i, int j, bool stream_weights) const {
    std::optional<StageMode> best;
    double best_added = 0;
    // {recompute, offload, offload_activations, wait_copies}
    for (StageMode mode : {StageMode{false, false, false}, StageMode{true, false, false},
                           StageMode{false, false, true}, StageMode{false, false, true, true},
                           StageMode{false, true, false}, StageMode{true, true, false},
                           StageMode{false, true, true}, StageMode{false, true, true, true}}) {
      mode.stream_weights = stream_weights;
      if ((mode.recompute && (!r_.allow_recompute || r_.stash_weights)) ||
          (mode.offload_activations && !r_.allow_offload_activations) ||
          (mode.offload && (!r_.allow_offload || r_.stash_weights)) ||
          (stream_weights && !mode.offload)) {
        continue;
      }
      if (mode.offload && !FewestHostLayers(k, i, j, &mode)) continue;
      if (r_.device_memory_bytes > 0 && Memory(k, i, j, mode) > r_.device_memory_bytes) continue;
      if (!mode.recompute && !mode.offload && !mode.offload_activations) return mode;  // fits
      const double added =
          (r_.micro_batches + S_ - 1) * Extra(i, j, mode) + OffloadAdded(i, j, mode);
      if (!best || added < best_added) {
        best = mode;
        best_added = added;
      }
    }
    return best;
  }

  // Offloading: the fewest last layers of [i, j) whose optimizer state on
  // the host makes stage k fit as `mode` otherwise holds it (its memory
  // falls as they grow), in mode->host_layers (0: all of them); false when
  // not even all of them do.
  bool FewestHostLayers(int k, int i, int j, StageMode* mode) const {
    if (r_.device_memory_bytes <= 0) return true;  // everything fits (all offloaded)
    int lo = 1, hi = j - i;
    mode->host_layers = 0;
    if (Memory(k, i, j, *mode) > r_.device_memory_bytes) return false;
    while (lo < hi) {  // the fewest in [lo, hi] that fit; hi always fits
      const int mid = (lo + hi) / 2;
      mode->host_layers = mid;
      if (Memory(k, i, j, *mode) <= r_.device_memory_bytes) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    mode->host_layers = hi == j - i || !r_.offload_fewest_layers ? 0 : hi;
    return true;
  }

  // Stage k as layers [i, j) held as `mode`: its times and memory.
  tandem::v1::PipelineStage Stage(int k, int i, int j, StageMode mode) const {
    tandem::v1::PipelineStage stage;
    stage.set_device_index(k);
    stage.set_first_layer(i);
    stage.set_last_layer(j - 1);
    stage.set_recompute(mode.recompute);
    stage.set_offload_optimizer(mode.offload);
    stage.set_host_updated_layers(mode.offload ? mode.host_layers : 0);
    stage.set_stream_weights(mode.offload && mode.stream_weights);
    stage.set_offload_activations(mode.offload_activations);
    stage.set_wait_for_activation_copies(mode.wait_copies);
    stage.set_compute_seconds(Time(i, j, mode));
    stage.set_communication_seconds(j < cost_.num_layers() ? Send(j - 1) : 0.0);
    stage.set_memory_bytes(Memory(k, i, j, mode));
    return stage;
  }

 private:
  const CostModel& cost_;
  const PipelineRequest& r_;
  const int S_, m_;
  std::vector<double> time_, forward_, offload_extra_, activation_copies_, weights_up_;
  std::vector<int64_t> state_, activation_, optimizer_, parameters_;
  std::vector<std::vector<int>> largest_;
};

}  // namespace

absl::StatusOr<std::vector<tandem::v1::PipelineStage>> PartitionPipeline(const CostModel& cost,
                                                                         const PipelineRequest& r) {
  const int L = cost.num_layers();
  if (r.devices < 1) return absl::InvalidArgumentError("pipeline_devices: must be >= 1");
  if (r.micro_batch_size < 1 || r.micro_batches < 1) {
    return absl::InvalidArgumentError("micro_batch_size: must be >= 1");
  }
  const int S = std::min(r.devices, L);
  const StageCosts costs(cost, r, S);
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][j]: slowest stage when layers [0, j) form stages 0..s-1.
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(L + 1, inf));
  std::vector<std::vector<int>> cut(S + 1, std::vector<int>(L + 1, -1));
  best[0][0] = 0;
  for (int s = 1; s <= S; ++s) {
    for (int j = s; j <= L - (S - s); ++j) {
      if (r.stop && r.stop()) return absl::CancelledError("the plan's caller has gone");
      for (int i = s - 1; i < j; ++i) {
        if (best[s - 1][i] == inf) continue;
        const std::optional<StageMode> mode = costs.Choose(s - 1, i, j);
        if (!mode) continue;
        const double boundary = i > 0 ? 2 * costs.Send(i - 1) : 0.0;
        const double slowest = std::max({best[s - 1][i], boundary, costs.Time(i, j, *mode)});
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
    stages[s - 1] = costs.Stage(s - 1, i, j, costs.Choose(s - 1, i, j).value_or(StageMode{}));
    j = i;
  }
  return stages;
}

absl::StatusOr<std::vector<tandem::v1::PipelineStage>> TimePipelineStages(
    const CostModel& cost, const PipelineRequest& r,
    const std::vector<tandem::v1::PipelineStage>& given) {
  const int L = cost.num_layers();
  const int S = static_cast<int>(given.size());
  const StageCosts costs(cost, r, S);
  std::vector<tandem::v1::PipelineStage> stages;
  int next = 0;
  for (int s = 0; s < S; ++s) {
    const tandem::v1::PipelineStage& g = given[s];
    if (g.first_layer() != next || g.last_layer() < g.first_layer() || g.last_layer() >= L) {
      return absl::InvalidArgumentError(absl::StrCat("pipeline[", s, "]: layers ", g.first_layer(),
                                                     "..", g.last_layer(), " do not follow layer ",
                                                     next - 1, " within ", L, " layers"));
    }
    stages.push_back(costs.Stage(
        s, g.first_layer(), g.last_layer() + 1,
        StageMode{g.recompute(), g.offload_optimizer(), g.offload_activations(),
                  g.wait_for_activation_copies(), g.host_updated_layers(), g.stream_weights()}));
    next = g.last_layer() + 1;
  }
  if (next != L) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline: the stages end at layer ", next - 1, " of ", L));
  }
  return stages;
}

}  // namespace tandem::planner
