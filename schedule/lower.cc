#include "schedule/lower.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem::schedule {
namespace {

using tandem::v1::ActivationPolicy;
using tandem::v1::Placement;
using tandem::v1::TimelinePhase;

constexpr Placement kAcc = tandem::v1::PLACEMENT_ACCELERATOR;
constexpr Placement kHost = tandem::v1::PLACEMENT_HOST;
constexpr ActivationPolicy kOffload = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
constexpr ActivationPolicy kRecompute = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;

// The resources of one node with one accelerator, in this order; a
// data-parallel rank's NETWORK stream last.
enum ResourceIndex : int { kAccCompute = 0, kH2D, kD2H, kHostUpdate, kHostCompute, kNetwork };
enum PoolIndex : int { kAccPool = 0, kHostPool = 1 };

absl::Status Invalid(int layer, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("plan.layers[", layer, "].", field, ": ", what));
}

// A dependency on an operation written later in the iteration (or at its
// end), resolved once the iteration is complete.
enum class Later { kHostUpdate, kChainUpdate, kChainReturn, kLastLayerOp };
struct Pending {
  int op;
  Later what;
  int layer;
  int lag;
  bool on_start;
};

class Lowering {
 public:
  Lowering(const Decisions& d, const std::vector<LayerSizes>& sizes, Mode mode,
           const LowerOptions& options)
      : d_(d),
        sizes_(sizes),
        mode_(mode),
        clip_(options.clip_gradients),
        dp_(options.ranks > 1),
        partition_(dp_ && options.partition_host_state),
        ranks_(options.ranks),
        bucket_bytes_(options.bucket_bytes),
        L_(static_cast<int>(d.layers.size())) {
    s_.mode = mode;
    using tandem::v1::TimelineResource;
    for (TimelineResource r :
         {tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
          tandem::v1::TIMELINE_RESOURCE_COPY_D2H, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE,
          tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE}) {
      const bool stream = r == tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE ||
                          r == tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE;
      s_.resources.push_back({r, 0, 0, stream});
    }
    // A stream: every rank issues the same collectives in the same order.
    if (dp_) s_.resources.push_back({tandem::v1::TIMELINE_RESOURCE_NETWORK, 0, 0, true});
    s_.order.resize(s_.resources.size());
    s_.pools = {MemoryPool{false, 0, 0}, MemoryPool{true, 0, 0}};
    s_.resident_bytes = {0, 0};
    s_.layers.resize(L_);
    // About five operations per layer and micro-batch (forward, backward,
    // copies, update); more only reallocates.
    const int micro_batches = d.micro_batch_size > 0 ? std::max(1, d.micro_batches()) : 1;
    s_.ops.reserve(static_cast<size_t>(L_) * 5 * micro_batches + 16);
    s_.program_resource = mode == Mode::kHost ? kHostCompute : kAccCompute;
    host_update_.assign(L_, -1);
    host_backward_.assign(L_, -1);
    last_backward_.assign(L_, -1);
    gradient_d2h_.assign(L_, -1);
    reduced_.assign(L_, -1);
    gathered_.assign(L_, -1);
  }

  Schedule Run() {
    ResidentMemory();
    if (mode_ != Mode::kHost) AcceleratorReplica();
    if (mode_ != Mode::kAccelerator) HostReplica();
    if (mode_ == Mode::kHetero) GradientSync();
    Resolve();
    return std::move(s_);
  }

 private:
  int Lag() const { return d_.delayed_parameter_update ? 2 : 1; }
  // A layer without parameters has nothing to stream, whatever its home says.
  bool Streamed(int l) const {
    return d_.layers[l].parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED &&
           sizes_[l].has_parameters();
  }

  // The optimizer state of a layer the host updates that this rank keeps.
  int64_t HostState(const LayerSizes& n) const {
    return partition_ ? (n.optimizer_state + ranks_ - 1) / ranks_ : n.optimizer_state;
  }

  void ResidentMemory() {
    for (int l = 0; l < L_; ++l) {
      const LayerSizes& n = sizes_[l];
      const LayerDecisions& d = d_.layers[l];
      int64_t& acc = s_.resident_bytes[kAccPool];
      int64_t& host = s_.resident_bytes[kHostPool];
      if (mode_ == Mode::kHost) {
        host += n.parameters + n.gradients + HostState(n);
      } else if (mode_ == Mode::kHetero) {
        acc += n.parameters + n.optimizer_state;
        host += n.parameters + n.gradients + n.optimizer_state;
      } else {
        if (d.parameter_home == tandem::v1::PARAMETER_HOME_ACCELERATOR) acc += n.parameters;
        if (n.has_parameters() && d.update == kAcc && !d.stream_state) acc += n.optimizer_state;
        if (n.has_parameters() && d.update == kAcc && d.stream_state) host += n.optimizer_state;
        if (n.has_parameters() && d.update == kHost) {
          host += n.parameters + n.gradients + HostState(n);
        }
      }
    }
  }

  int Add(OpKind kind, int resource, Replica replica, TimelinePhase phase, int layer,
          int micro_batch, int64_t bytes = 0, TensorKind tensor = TensorKind::kNone,
          bool delivers_update = false) {
    // Built in place: an Op's inline vectors make a move no cheaper than
    // the fields.
    Op& op = s_.ops.emplace_back();
    op.kind = kind;
    op.resource = resource;
    op.replica = replica;
    op.phase = phase;
    op.layer = layer;
    op.micro_batch = micro_batch;
    op.bytes = bytes;
    op.tensor = tensor;
    op.delivers_update = delivers_update;
    const int id = static_cast<int>(s_.ops.size()) - 1;
    s_.order[resource].push_back(id);
    return id;
  }
  int Copy(int resource, TimelinePhase phase, int layer, int micro_batch, int64_t bytes,
           TensorKind tensor, bool delivers_update = false) {
    return Add(OpKind::kCopy, resource, kAcceleratorReplica, phase, layer, micro_batch, bytes,
               tensor, delivers_update);
  }
  void Dep(int op, int prerequisite, bool on_start = false) {
    if (op >= 0 && prerequisite >= 0) s_.ops[op].deps.push_back({prerequisite, 0, on_start});
  }
  void DepLater(int op, Later what, int layer, int lag, bool on_start = false) {
    pending_.push_back({op, what, layer, lag, on_start});
  }
  void Mem(int op, bool at_end, int pool, int64_t delta) {
    if (delta != 0) s_.ops[op].memory.push_back({pool, at_end, delta});
  }
  // The operation a prefetch waits for the start of: the accelerator's
  // previous forward or backward, of the previous iteration at first.
  void Prefetch(int copy) {
    if (layer_op_ >= 0) {
      Dep(copy, layer_op_, /*on_start=*/true);
    } else {
      DepLater(copy, Later::kLastLayerOp, -1, 1, /*on_start=*/true);
    }
  }

  void AcceleratorReplica() {
    const int M = d_.micro_batches();
    const bool hetero = mode_ == Mode::kHetero;
    std::vector<int> offload(static_cast<size_t>(L_), -1);
    for (int j = 0; j < M; ++j) {
      for (int l = 0; l < L_; ++l) AcceleratorForward(l, j, hetero, &offload);
      for (int l = L_ - 1; l >= 0; --l) AcceleratorBackward(l, j, M, hetero, offload);
    }
    if (dp_) FlushBucket();
    if (hetero || (!clip_ && !dp_)) return;
    // Clipping: the norm once every gradient is known (those updated on the
    // host once they are down; all of them summed over the ranks), then the
    // updates held back for it. Data-parallel: the accelerator's updates
    // after the last backward, each once its bucket is summed.
    if (clip_) {
      norm_ = Add(OpKind::kGradientNorm, kAccCompute, kAcceleratorReplica,
                  tandem::v1::TIMELINE_PHASE_UPDATE, -1, M - 1);
      for (int l = L_ - 1; l >= 0; --l) Dep(norm_, gradient_d2h_[l]);
      for (int ar : all_reduces_) Dep(norm_, ar);
    }
    for (int l = L_ - 1; l >= 0; --l) {
      if (sizes_[l].has_parameters() && (clip_ || d_.layers[l].update == kAcc)) {
        AcceleratorUpdate(l, M - 1, s_.layers[l].reuse_start);
      }
    }
    GatherHostBuckets();
  }

  // Data-parallel: layer l's gradient, final once `ready` ends, joins the
  // open bucket (a bucket holds one memory's gradients).
  void Bucket(int l, bool host, int ready) {
    if (!bucket_.layers.empty() && bucket_.host != host) FlushBucket();
    bucket_.host = host;
    bucket_.layers.push_back(l);
    bucket_.ready.push_back(ready);
    bucket_.bytes += sizes_[l].gradients;
    if (bucket_.bytes >= bucket_bytes_) FlushBucket();
  }

  // The open bucket's ALL_REDUCE (REDUCE_SCATTER: a partitioned host bucket),
  // then the host updates that wait for it alone (the accelerator's follow the
  // last backward; under clipping all follow the norm).
  void FlushBucket() {
    if (bucket_.layers.empty()) return;
    const int low = bucket_.layers.back(), high = bucket_.layers.front();
    const int M = d_.micro_batches();
    const bool scatter = partition_ && bucket_.host;
    const int ar = Add(
        scatter ? OpKind::kReduceScatter : OpKind::kAllReduce, kNetwork,
        bucket_.host ? kHostReplica : kAcceleratorReplica,
        scatter ? tandem::v1::TIMELINE_PHASE_REDUCE_SCATTER : tandem::v1::TIMELINE_PHASE_ALL_REDUCE,
        low, M - 1, bucket_.bytes, TensorKind::kGradient);
    s_.ops[ar].bucket_layers = high - low + 1;
    for (int ready : bucket_.ready) Dep(ar, ready);
    all_reduces_.push_back(ar);
    if (scatter) scattered_.push_back(ar);
    for (int l : bucket_.layers) {
      reduced_[l] = ar;
      if (clip_) continue;
      if (mode_ == Mode::kHost) {
        HostUpdate(l, M - 1, host_backward_[l]);
      } else if (d_.layers[l].update == kHost) {
        AcceleratorUpdate(l, M - 1, gradient_d2h_[l]);
      }
    }
    bucket_ = OpenBucket();
  }

  // Layer l's update after BACKWARD(l, M-1) `b` (accelerator plans): on the
  // compute stream, or down to the host, updated there and (resident
  // weights) back. Under clipping the host side waits for the norm, and the
  // gradient copy goes first (the norm reads it).
  void AcceleratorUpdate(int l, int j, int b) {
    const LayerSizes& n = sizes_[l];
    if (d_.layers[l].update == kAcc) {
      const bool streamed = d_.layers[l].stream_state;
      const int in = streamed ? StateIn(l, j, b) : -1;
      const int u = Add(OpKind::kUpdate, kAccCompute, kAcceleratorReplica,
                        tandem::v1::TIMELINE_PHASE_UPDATE, l, j, n.update);
      Dep(u, norm_);
      Dep(u, reduced_[l]);
      Dep(u, in);
      Mem(u, true, kAccPool, -n.gradients);
      s_.layers[l].reuse_start = u;
      if (streamed) StateOut(l, j, in, u);
      return;
    }
    int g = gradient_d2h_[l];
    if (g < 0) {
      g = Copy(kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H, l, j, n.gradients,
               TensorKind::kGradient);
      Dep(g, b);
      Mem(g, true, kAccPool, -n.gradients);
      gradient_d2h_[l] = g;
    }
    if ((clip_ && norm_ < 0) || (dp_ && reduced_[l] < 0)) return;
    const int u = Add(OpKind::kUpdate, kHostUpdate, kHostReplica, tandem::v1::TIMELINE_PHASE_UPDATE,
                      l, j, n.update);
    Dep(u, g);
    Dep(u, norm_);
    Dep(u, reduced_[l]);
    s_.layers[l].host_update = u;
    // Partitioned, the weights go back once gathered (GatherHostBuckets).
    if (!Streamed(l) && !partition_) ReturnWeights(l, j, u);
  }

  // A resident layer's updated weights back to the accelerator once `ready`
  // (its update, or the gather of its bucket) ends.
  void ReturnWeights(int l, int j, int ready) {
    const int h = Copy(kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, j, sizes_[l].parameters,
                       TensorKind::kWeights, /*delivers_update=*/true);
    Dep(h, ready);
    s_.layers[l].weights_return = h;
  }

  // Streamed optimizer state (see STREAMED OPTIMIZER STATE in lower.h): the
  // STATE_H2D before layer l's accelerator update, once BACKWARD(l + d, M-1)
  // (d the prefetch distance; past the last layer, its) and the previous
  // streamed update have started, and the state of the streamed layer two
  // before has gone back.
  int StateIn(int l, int j, int b) {
    const int64_t bytes = sizes_[l].optimizer_state;
    const int in =
        Copy(kH2D, tandem::v1::TIMELINE_PHASE_STATE_H2D, l, j, bytes, TensorKind::kOptimizerState);
    const size_t k = state_updates_.size();
    const int ahead = std::min(L_ - 1, l + std::max(1, d_.state_prefetch_layers));
    Dep(in, ahead > l ? last_backward_[ahead] : b, /*on_start=*/true);
    if (k > 0) Dep(in, state_updates_[k - 1], /*on_start=*/true);
    if (k >= 2) Dep(in, s_.layers[s_.ops[state_updates_[k - 2]].layer].state_out);
    Mem(in, false, kAccPool, bytes);
    s_.layers[l].state_in = in;
    return in;
  }
  // The update `u` of the state `in` brought, then the STATE_D2H that takes
  // the state back; the next step's STATE_H2D of the layer reads what it wrote.
  void StateOut(int l, int j, int in, int u) {
    const int64_t bytes = sizes_[l].optimizer_state;
    Mem(u, false, kAccPool, sizes_[l].update_staging);
    Mem(u, true, kAccPool, -sizes_[l].update_staging);
    const int out =
        Copy(kD2H, tandem::v1::TIMELINE_PHASE_STATE_D2H, l, j, bytes, TensorKind::kOptimizerState);
    Dep(out, u);
    Mem(out, true, kAccPool, -bytes);
    s_.ops[in].deps.push_back({out, 1, false});
    s_.layers[l].state_out = out;
    state_updates_.push_back(u);
  }

  // A streamed layer's weights for its forward (or backward) of micro-batch
  // j, prefetched; the forward of micro-batch 0 brings the update. -1 for a
  // layer that is not streamed.
  int StreamWeights(int l, int j, bool forward) {
    if (!Streamed(l)) return -1;
    const bool update = forward && j == 0;
    const int copy = Copy(kH2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D, l, j,
                          sizes_[l].parameters, TensorKind::kWeights, update);
    Prefetch(copy);
    if (update) DepLater(copy, Later::kChainUpdate, l, Lag());
    Mem(copy, false, kAccPool, sizes_[l].parameters);
    return copy;
  }

  void AcceleratorForward(int l, int j, bool hetero, std::vector<int>* offload) {
    const LayerDecisions& d = d_.layers[l];
    const LayerSizes& n = sizes_[l];
    const bool streamed = Streamed(l);
    const int copy = StreamWeights(l, j, /*forward=*/true);
    const int f = Add(OpKind::kForward, kAccCompute, kAcceleratorReplica,
                      tandem::v1::TIMELINE_PHASE_FORWARD, l, j);
    Dep(f, copy);
    if (!hetero && !streamed && n.has_parameters() && d.update == kHost && j == 0) {
      DepLater(f, Later::kChainReturn, l, Lag());
    }
    if (streamed) Mem(f, true, kAccPool, -n.parameters);
    Mem(f, false, kAccPool, n.activations + n.workspace);
    Mem(f, true, kAccPool, -n.workspace);
    if (l > 0 && d_.layers[l - 1].activation == kRecompute) {
      Mem(f, true, kAccPool, -(sizes_[l - 1].activations - sizes_[l - 1].checkpoint));
    }
    if (l == L_ - 1 && d.activation == kRecompute) {
      Mem(f, true, kAccPool, -(n.activations - n.checkpoint));
    }
    if (d.activation == kOffload) {
      const int o = Copy(kD2H, tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H, l, j, n.activations,
                         TensorKind::kActivation);
      Dep(o, f);
      Mem(o, true, kAccPool, -n.activations);
      Mem(o, false, kHostPool, n.activations);
      (*offload)[l] = o;
    }
    if (j == 0) s_.layers[l].first_forward = f;
    if (j == 0 && l == 0) s_.lead.push_back(f);
    layer_op_ = f;
  }

  void AcceleratorBackward(int l, int j, int M, bool hetero, const std::vector<int>& offload) {
    const LayerDecisions& d = d_.layers[l];
    const LayerSizes& n = sizes_[l];
    const bool streamed = Streamed(l);
    const int copy = StreamWeights(l, j, /*forward=*/false);
    int fetch = -1;
    if (d.activation == kOffload) {
      fetch = Copy(kH2D, tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D, l, j, n.activations,
                   TensorKind::kActivation);
      Prefetch(fetch);
      Dep(fetch, offload[l]);
      Mem(fetch, false, kAccPool, n.activations);
      Mem(fetch, true, kHostPool, -n.activations);
    }
    if (d.activation == kRecompute) {
      const int r = Add(OpKind::kRecompute, kAccCompute, kAcceleratorReplica,
                        tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, j);
      Dep(r, copy);
      Mem(r, false, kAccPool, n.activations - n.checkpoint + n.workspace);
      Mem(r, true, kAccPool, -n.workspace);
    }
    const int b = Add(OpKind::kBackward, kAccCompute, kAcceleratorReplica,
                      tandem::v1::TIMELINE_PHASE_BACKWARD, l, j);
    Dep(b, copy);
    Dep(b, fetch);
    Mem(b, false, kAccPool, n.workspace + (j == 0 ? n.gradients : 0));
    Mem(b, true, kAccPool, -n.workspace - n.activations - (streamed ? n.parameters : 0));
    layer_op_ = b;
    if (j != M - 1) return;
    s_.layers[l].reuse_start = b;
    last_backward_[l] = b;
    if (!hetero && n.has_parameters()) {
      // Under clipping an accelerator update waits for the norm; the host
      // ones' gradients go down now (their updates wait for it too); so do
      // a data-parallel rank's, whose updates wait for their bucket's sum.
      const bool lagged = !clip_ && !dp_ && d.stream_state && d_.state_update_lag > 0;
      if (((!clip_ && !dp_) || d.update == kHost) && !lagged) AcceleratorUpdate(l, j, b);
      if (lagged) lagged_.push_back(l);
      if (dp_) Bucket(l, d.update == kHost, d.update == kHost ? gradient_d2h_[l] : b);
    }
    // Streamed updates lagged behind this backward (whatever the layer): those
    // of layer l + lag and above, and after the first layer's, every one still
    // waiting (L-1 first).
    while (!lagged_.empty() && (l == 0 || lagged_.front() - d_.state_update_lag >= l)) {
      const int u = lagged_.front();
      lagged_.erase(lagged_.begin());
      AcceleratorUpdate(u, j, last_backward_[u]);
    }
  }

  void HostReplica() {
    const bool hetero = mode_ == Mode::kHetero;
    const int M = hetero ? 1 : d_.micro_batches();
    for (int j = 0; j < M; ++j) {
      for (int l = 0; l < L_; ++l) {
        const LayerSizes& n = sizes_[l];
        const bool recompute = !hetero && d_.layers[l].activation == kRecompute;
        const int f = Add(OpKind::kForward, kHostCompute, kHostReplica,
                          tandem::v1::TIMELINE_PHASE_FORWARD, l, j);
        if (j == 0 && n.has_parameters()) DepLater(f, Later::kHostUpdate, l, 1);
        Mem(f, false, kHostPool, n.host_activations + n.host_workspace);
        Mem(f, true, kHostPool, -n.host_workspace);
        if (!hetero && l > 0 && d_.layers[l - 1].activation == kRecompute) {
          Mem(f, true, kHostPool,
              -(sizes_[l - 1].host_activations - sizes_[l - 1].host_checkpoint));
        }
        if (l == L_ - 1 && recompute)
          Mem(f, true, kHostPool, -(n.host_activations - n.host_checkpoint));
        if (!hetero && j == 0) s_.layers[l].first_forward = f;
        if (j == 0 && l == 0) s_.lead.push_back(f);
      }
      for (int l = L_ - 1; l >= 0; --l) {
        const LayerSizes& n = sizes_[l];
        if (!hetero && d_.layers[l].activation == kRecompute) {
          const int r = Add(OpKind::kRecompute, kHostCompute, kHostReplica,
                            tandem::v1::TIMELINE_PHASE_RECOMPUTE, l, j);
          Mem(r, false, kHostPool, n.host_activations - n.host_checkpoint + n.host_workspace);
          Mem(r, true, kHostPool, -n.host_workspace);
        }
        const int b = Add(OpKind::kBackward, kHostCompute, kHostReplica,
                          tandem::v1::TIMELINE_PHASE_BACKWARD, l, j);
        Mem(b, false, kHostPool, n.host_workspace);
        Mem(b, true, kHostPool, -n.host_workspace - n.host_activations);
        if (j != M - 1) continue;
        host_backward_[l] = b;
        if (hetero) continue;
        s_.layers[l].reuse_start = b;
        if (n.has_parameters() && dp_) {
          Bucket(l, /*host=*/true, b);
        } else if (n.has_parameters() && !clip_) {
          HostUpdate(l, j, b);
        }
      }
    }
    if (dp_) FlushBucket();
    if (hetero) return;
    if (clip_) {
      norm_ = Add(OpKind::kGradientNorm, kHostCompute, kHostReplica,
                  tandem::v1::TIMELINE_PHASE_UPDATE, -1, M - 1);
      for (int ar : all_reduces_) Dep(norm_, ar);
      for (int l = L_ - 1; l >= 0; --l) {
        if (sizes_[l].has_parameters()) HostUpdate(l, M - 1, host_backward_[l]);
      }
    }
    GatherHostBuckets();
  }

  // Partitioned host state: each host bucket's updated pieces to every rank,
  // on the NETWORK stream after every bucket's sum (in bucket order), once
  // the bucket's updates have ended.
  void GatherHostBuckets() {
    if (!partition_) return;
    const int M = d_.micro_batches();
    for (int rs : scattered_) {
      const Op bucket = s_.ops[rs];  // a copy: Add grows s_.ops
      // The weights as the accelerator takes them up: a mixed-precision
      // plan's bf16 working copies.
      int64_t weights = 0;
      for (int l = bucket.layer; l < bucket.layer + bucket.bucket_layers; ++l) {
        weights += sizes_[l].parameters;
      }
      const int g =
          Add(OpKind::kAllGather, kNetwork, kHostReplica, tandem::v1::TIMELINE_PHASE_ALL_GATHER,
              bucket.layer, M - 1, weights, TensorKind::kWeights);
      s_.ops[g].bucket_layers = bucket.bucket_layers;
      for (int l = bucket.layer; l < bucket.layer + bucket.bucket_layers; ++l) {
        Dep(g, s_.layers[l].host_update);
        gathered_[l] = g;
      }
      if (mode_ != Mode::kAccelerator) continue;
      for (int l = bucket.layer; l < bucket.layer + bucket.bucket_layers; ++l) {
        if (s_.layers[l].host_update >= 0 && !Streamed(l)) ReturnWeights(l, M - 1, g);
      }
    }
  }

  // cpu_only: layer l's update on the host update pool after its last
  // backward `b` (and the norm, when clipping).
  void HostUpdate(int l, int j, int b) {
    const int u = Add(OpKind::kUpdate, kHostUpdate, kHostReplica, tandem::v1::TIMELINE_PHASE_UPDATE,
                      l, j, sizes_[l].update);
    Dep(u, b);
    Dep(u, norm_);
    Dep(u, reduced_[l]);
    host_update_[l] = u;
    s_.layers[l].host_update = u;
  }

  void GradientSync() {
    const int M = d_.micro_batches();
    std::vector<int> averaged(static_cast<size_t>(L_), -1), average(static_cast<size_t>(L_), -1);
    for (int l = L_ - 1; l >= 0; --l) {
      const LayerSizes& n = sizes_[l];
      if (!n.has_parameters()) continue;
      const int down = Copy(kD2H, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, M - 1, n.gradients,
                            TensorKind::kGradient);
      Dep(down, s_.layers[l].reuse_start);
      average[l] = Add(OpKind::kGradientAverage, kHostUpdate, kHostReplica,
                       tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, 0, 3 * n.gradients);
      Dep(average[l], down);
      Dep(average[l], host_backward_[l]);
      const int up = Copy(kH2D, tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC, l, M - 1, n.gradients,
                          TensorKind::kGradient);
      Dep(up, average[l]);
      averaged[l] = up;
      if (!clip_) HostReplicaUpdate(l, average[l]);
    }
    if (clip_) {
      norm_ = Add(OpKind::kGradientNorm, kHostUpdate, kHostReplica,
                  tandem::v1::TIMELINE_PHASE_UPDATE, -1, 0);
      for (int l = L_ - 1; l >= 0; --l) Dep(norm_, average[l]);
      for (int l = L_ - 1; l >= 0; --l) {
        if (sizes_[l].has_parameters()) HostReplicaUpdate(l, average[l]);
      }
    }
    for (int l = L_ - 1; l >= 0; --l) {
      const LayerSizes& n = sizes_[l];
      if (!n.has_parameters()) continue;
      const int u = Add(OpKind::kUpdate, kAccCompute, kAcceleratorReplica,
                        tandem::v1::TIMELINE_PHASE_UPDATE, l, M - 1, n.update);
      Dep(u, averaged[l]);
      Dep(u, norm_);
      Mem(u, true, kAccPool, -n.gradients);
    }
  }

  // hetero_dp: the host replica steps with the averaged gradient.
  void HostReplicaUpdate(int l, int average) {
    const int u = Add(OpKind::kUpdate, kHostUpdate, kHostReplica, tandem::v1::TIMELINE_PHASE_UPDATE,
                      l, 0, sizes_[l].update);
    Dep(u, average);
    Dep(u, norm_);
    host_update_[l] = u;
  }

  void Resolve() {
    for (const Pending& p : pending_) {
      int target = -1;
      switch (p.what) {
        case Later::kHostUpdate:
          // Partitioned: the weights are whole once gathered.
          target = gathered_[p.layer] >= 0 ? gathered_[p.layer] : host_update_[p.layer];
          break;
        case Later::kChainUpdate:
          target = gathered_[p.layer] >= 0 ? gathered_[p.layer] : s_.layers[p.layer].host_update;
          break;
        case Later::kChainReturn:
          target = s_.layers[p.layer].weights_return;
          break;
        case Later::kLastLayerOp:
          target = layer_op_;
          break;
      }
      if (target >= 0) s_.ops[p.op].deps.push_back({target, p.lag, p.on_start});
    }
  }

  const Decisions& d_;
  const std::vector<LayerSizes>& sizes_;
  const Mode mode_;
  const bool clip_;
  // Data-parallel (LowerOptions::ranks > 1), and with partitioned host state.
  const bool dp_;
  const bool partition_;
  const int ranks_;
  const int64_t bucket_bytes_;
  const int L_;
  // Clipping: the GRADIENT_NORM operation (-1 before it is written or
  // without clipping); per layer, its GRADIENT_D2H once written.
  int norm_ = -1;
  std::vector<int> gradient_d2h_;
  // Data-parallel: the bucket being filled (layers the last first, the
  // operations after which each gradient is final), per layer the
  // ALL_REDUCE that sums its gradient, and every ALL_REDUCE.
  struct OpenBucket {
    bool host = true;
    std::vector<int> layers, ready;
    int64_t bytes = 0;
  };
  OpenBucket bucket_;
  std::vector<int> reduced_, all_reduces_;
  // Partitioned: the REDUCE_SCATTERs of the host's buckets, and per layer the
  // ALL_GATHER that brings its weights whole.
  std::vector<int> scattered_, gathered_;
  Schedule s_;
  // The accelerator's latest forward or backward (prefetches start with it).
  int layer_op_ = -1;
  std::vector<int> host_update_, host_backward_;
  // The accelerator's BACKWARD(l, M-1) of each layer.
  std::vector<int> last_backward_;
  // Streamed updates waiting for their place (state_update_lag), L-1 first.
  std::vector<int> lagged_;
  // The accelerator updates of streamed optimizer state, in program order.
  std::vector<int> state_updates_;
  std::vector<Pending> pending_;
};

}  // namespace

Mode ModeOf(const Decisions& d) {
  if (d.strategy == tandem::v1::STRATEGY_HETERO_DP) return Mode::kHetero;
  for (const LayerDecisions& l : d.layers) {
    if (l.compute != kHost) return Mode::kAccelerator;
  }
  return Mode::kHost;
}

absl::Status Validate(const Decisions& s, int num_layers, bool has_accelerator) {
  const int L = num_layers;
  if (static_cast<int>(s.layers.size()) != L) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.layers: has ", s.layers.size(), " layers, the model has ", L));
  }
  if (s.batch_size < 1) return absl::InvalidArgumentError("plan.batch_size: must be >= 1");
  if (s.host_update_threads < 1) {
    return absl::InvalidArgumentError("plan.host_update_threads: must be >= 1");
  }
  const Mode mode = ModeOf(s);
  if (mode == Mode::kHetero &&
      (s.accelerator_batch_share < 1 || s.accelerator_batch_share >= s.batch_size)) {
    return absl::InvalidArgumentError(
        "plan.accelerator_batch_share: must be in [1, batch_size - 1] for hetero_dp");
  }
  if (s.micro_batch_size < 1 || s.replica_samples() % s.micro_batch_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan.micro_batch_size: must be >= 1 and divide ", s.replica_samples(),
                     ", got ", s.micro_batch_size));
  }
  if (mode != Mode::kHost && !has_accelerator) {
    return absl::InvalidArgumentError(
        "plan.layers: the plan computes on an accelerator the cost source does not have");
  }
  for (int l = 0; l < L; ++l) {
    const LayerDecisions& d = s.layers[l];
    const ActivationPolicy a = d.activation;
    if (a != tandem::v1::ACTIVATION_POLICY_KEEP && a != kOffload && a != kRecompute) {
      return Invalid(l, "activation_policy", "must be KEEP, OFFLOAD or RECOMPUTE");
    }
    if (d.stream_state && mode != Mode::kAccelerator) {
      return Invalid(l, "stream_optimizer_state",
                     mode == Mode::kHost ? "needs an accelerator: the layer computes on the host"
                                         : "hetero_dp's accelerator replica keeps its state "
                                           "resident");
    }
    if (mode == Mode::kHost) {
      if (d.parameter_home != tandem::v1::PARAMETER_HOME_HOST) {
        return Invalid(l, "parameter_home", "must be HOST when computing on the host");
      }
      if (d.update != kHost) return Invalid(l, "update", "must be HOST when computing on the host");
      if (a == kOffload) return Invalid(l, "activation_policy", "OFFLOAD needs an accelerator");
      continue;
    }
    if (d.compute != kAcc) {
      return Invalid(l, "compute",
                     "all layers compute on one side (mixed placements are not supported)");
    }
    if (mode == Mode::kHetero) {
      if (d.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR || d.update != kAcc ||
          a == kOffload) {
        return Invalid(l, "parameter_home",
                       "hetero_dp's accelerator replica keeps its state resident, updates on the "
                       "accelerator and keeps or recomputes activations");
      }
      continue;
    }
    if (d.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR &&
        d.parameter_home != tandem::v1::PARAMETER_HOME_HOST_STREAMED) {
      return Invalid(l, "parameter_home", "must be ACCELERATOR or HOST_STREAMED");
    }
    if (d.update != kAcc && d.update != kHost) {
      return Invalid(l, "update", "must be ACCELERATOR or HOST");
    }
    if (d.stream_state &&
        (d.update != kAcc || d.parameter_home != tandem::v1::PARAMETER_HOME_ACCELERATOR)) {
      return Invalid(l, "stream_optimizer_state",
                     "streams the state of an accelerator update to resident weights: needs "
                     "update ACCELERATOR and parameter_home ACCELERATOR");
    }
    if (d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED && d.update != kHost) {
      return Invalid(l, "update",
                     "a HOST_STREAMED layer's master weights live on the host, so it "
                     "must update on the host");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Schedule> Lower(const Decisions& decisions, const std::vector<LayerSizes>& sizes,
                               const LowerOptions& options) {
  const int L = static_cast<int>(sizes.size());
  if (absl::Status v = Validate(decisions, L, options.has_accelerator); !v.ok()) return v;
  if (options.ranks < 1) return absl::InvalidArgumentError("ranks: must be >= 1");
  if (options.ranks > 1 && ModeOf(decisions) == Mode::kHetero) {
    return absl::InvalidArgumentError(
        "plan.strategy: hetero_dp already splits the batch between the host and the "
        "accelerator; it does not run as a data-parallel rank");
  }
  return Lowering(decisions, sizes, ModeOf(decisions), options).Run();
}

absl::StatusOr<Schedule> Lower(const Decisions& decisions, const std::vector<LayerSizes>& sizes,
                               bool has_accelerator) {
  LowerOptions options;
  options.has_accelerator = has_accelerator;
  return Lower(decisions, sizes, options);
}

}  // namespace tandem::schedule
