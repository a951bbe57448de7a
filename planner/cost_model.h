// CostModel: what each layer of a chain costs on each side of a node — the time
// of its forward, backward and optimizer step, the bytes it holds, and the time
// to copy bytes across the host link — from one of two sources:
//
//   - a measured Profile: the per-device TimingStats medians the runtime's
//     profiler recorded (means for a job's measured steps, when the profile's
//     provenance.planning_statistic says MEAN) (host = the DeviceProfile of kind CPU, accelerator =
//     the first of kind CUDA or EMULATED) and the measured pinned LinkProfiles;
//   - an analytic Profile (FLOPs and bytes per layer) plus a HardwareSpec, for a
//     machine we are not running on. Each phase is a roofline:
//
//         t = max(flops / (peak(op) * eff(op)), bytes / (bandwidth * eff(op)))
//             + launch_overhead
//
//     where peak(op) is the matrix rate for matmul, conv and attention (the
//     bf16 or fp16 rate for a profile in that precision, planner/precision.h)
//     and the vector rate otherwise, and eff(op) is the efficiency of the
//     layer's op class (ProcessorSpec.efficiency, else DefaultEfficiency below).
//
// Batch scaling. Every per-batch figure of a Profile is at Profile.batch_size
// (B). For s samples (a micro-batch, a hetero_dp share) a phase costs
//
//         t(s) = o + (t(B) - o) * s / B
//
// where o is the fixed per-call overhead (the processor's launch overhead, or
// for measured timings min(default overhead, t(B))): the work scales linearly in
// samples, the call does not. Activation, workspace and output bytes scale
// linearly in s (rounded down); parameter, gradient, optimizer and staging
// bytes do not (WorkspaceBytes adds a layer's staging to its scaled workspace).
//
// Optimizer step. The step of one layer touches 2 * parameter_bytes (read and
// write the weights) + gradient_bytes (read) + 2 * optimizer_state_bytes (read
// and write the state): 28 bytes per parameter for fp32 Adam, 12 for SGD. In a
// mixed precision the master weights are in optimizer_state_bytes and the step
// writes the 16-bit working copy once: parameter_bytes + gradient_bytes + 2 *
// optimizer_state_bytes, 28 bytes per parameter for Adam again. It is a
// roofline over those bytes and ~(2 + 5k) FLOPs per parameter (k = fp32 state
// elements per parameter), or the measured `update` timing. On the host the step
// runs on `threads` threads; bandwidth scales as min(threads, host threads) /
// host threads of the figure (measured with the profiler's thread count, or the
// whole socket pair for a HardwareSpec).
//
// Copies. bytes / link bandwidth + link latency, page-locked host memory.
//
// Immutable after construction; safe to share between threads.
#ifndef TANDEM_PLANNER_COST_MODEL_H_
#define TANDEM_PLANNER_COST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::planner {

// What a layer kind does, as far as the roofline cares.
enum class OpClass { kMatmul, kConv, kElementwise, kNorm, kAttention, kEmbedding, kPool, kLoss };

// The op class of a runtime layer kind ("linear", "transformer_block", ...);
// INVALID_ARGUMENT for a kind the planner does not know.
absl::StatusOr<OpClass> OpClassOfKind(absl::string_view kind);

// The ProcessorSpec.efficiency key of an op class ("matmul", ...).
absl::string_view OpClassKey(OpClass op_class);

// The fraction of peak an op class reaches when a ProcessorSpec does not say,
// for a processor of `kind`. `key` is an OpClassKey or "optimizer".
double DefaultEfficiency(tandem::v1::DeviceKind kind, absl::string_view key);

// How many times one thread's rate k threads of a CPU reach, where n threads
// reach `speedup` times it (0 = unknown: n), taken linear in k between
// (1, 1) and (n, speedup) and beyond: the model CostModel::ThreadShareSlowdown
// and a job with fewer threads than its node (node/placement.cc) use.
double ThreadsRate(int k, int n, double speedup);
// The same for `spec`'s threads and its matrix rates on them and on one.
double ThreadsRate(const tandem::v1::ProcessorSpec& spec, int k);
// How many times `single_thread_rate` `threads` threads' `rate` is, in
// [1, threads]; 0 when either rate is unknown.
double ThreadSpeedup(int threads, double rate, double single_thread_rate);

// The profile's link in `direction` the cost model plans with: page-locked
// over pageable, with a measured bandwidth; null when there is none.
const tandem::v1::LinkProfile* BestLink(const tandem::v1::Profile& profile,
                                        tandem::v1::LinkDirection direction);

class CostModel {
 public:
  // From the measured timings of `profile`. FAILED_PRECONDITION when a layer
  // lacks a timing the plan would need (forward/backward on the host and on the
  // accelerator when there is one), INVALID_ARGUMENT for malformed fields.
  static absl::StatusOr<CostModel> FromMeasuredProfile(const tandem::v1::Profile& profile);

  // A roofline over the analytic fields of `profile` on `hardware`; measured
  // timings in the profile are ignored.
  static absl::StatusOr<CostModel> FromHardwareSpec(const tandem::v1::Profile& profile,
                                                    const tandem::v1::HardwareSpec& hardware);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const std::string& layer_name(int layer) const { return layers_[layer].name; }
  const std::string& layer_kind(int layer) const { return layers_[layer].kind; }
  int profiled_batch_size() const { return profiled_batch_size_; }
  // The inverse of ForwardSeconds' and BackwardSeconds' scaling: the time at
  // the profiled batch that scales to `seconds` at `samples` on `device`.
  double ProfiledSeconds(double seconds, tandem::v1::Placement device, int samples) const;
  // The profile's precision (planner/precision.h): what its bytes count.
  tandem::v1::Precision precision() const { return precision_; }
  // The job's steps read the global norm of every gradient before any update
  // (PlanRequest::clips_gradients): the simulator lowers its plans so
  // (schedule/lower.h, "Gradient clipping"), every update after the norm and
  // every accelerator-updated layer's gradient held until its update (the
  // recurrences, ResidentChain and HeteroReplicas, and the exact placement
  // search, ChainEvaluator, follow the same rules).
  bool clips_gradients() const { return clips_gradients_; }
  void set_clips_gradients(bool clips) { clips_gradients_ = clips; }
  bool has_accelerator() const { return has_accelerator_; }
  tandem::v1::DeviceKind accelerator_kind() const { return accelerator_kind_; }
  // Accelerators alike the first (the pipeline partitioner's devices).
  int accelerator_count() const { return accelerator_count_; }
  // Host threads the host figures were computed or measured with.
  int host_threads() const { return host_threads_; }
  // How many times slower the accelerator's compute runs on `share` of
  // `threads` host threads than on all of them: an emulated pipeline stage,
  // which computes with its share of the job's threads. From the rate of n
  // threads s(n) taken linear between one thread's measured GEMM rate and the
  // source's threads' rate; linear in threads where the source has no
  // one-thread rate. 1 when share >= threads.
  double ThreadShareSlowdown(int threads, int share) const;
  // Capacities, in bytes; 0 when the source does not say.
  int64_t accelerator_memory_bytes() const { return accelerator_memory_bytes_; }
  int64_t host_memory_bytes() const { return host_memory_bytes_; }
  // "measured" or "hardware_spec:<name>".
  const std::string& source() const { return source_; }

  // One call of a layer's forward / backward over `samples` samples on
  // `device`, in seconds.
  double ForwardSeconds(int layer, tandem::v1::Placement device, int samples) const;
  double BackwardSeconds(int layer, tandem::v1::Placement device, int samples) const;
  // One optimizer step of a layer's parameters, in seconds; `host_threads`
  // only matters on the host.
  double UpdateSeconds(int layer, tandem::v1::Placement device, int host_threads) const;
  // Averaging two gradients of a layer on the host (hetero_dp): read two,
  // write one, in seconds.
  double GradientAverageSeconds(int layer, int host_threads) const;
  // Host link, pinned, in seconds.
  double CopySeconds(tandem::v1::LinkDirection direction, int64_t bytes) const;
  // Accelerator to accelerator (NVLink or PCIe peer), in seconds; through the
  // host when the source has no peer link.
  double PeerCopySeconds(int64_t bytes) const;
  bool has_peer_link() const { return has_peer_link_; }

  // In bytes.
  int64_t ParameterBytes(int layer) const { return layers_[layer].parameter_bytes; }
  int64_t GradientBytes(int layer) const { return layers_[layer].gradient_bytes; }
  int64_t OptimizerStateBytes(int layer) const { return layers_[layer].optimizer_state_bytes; }
  int64_t ActivationBytes(int layer, int samples) const;
  int64_t WorkspaceBytes(int layer, int samples) const;
  int64_t OutputBytes(int layer, int samples) const;
  // Bytes one optimizer step reads and writes.
  int64_t UpdateBytes(int layer) const;
  // Parameters + gradients + optimizer state of the whole model.
  int64_t ModelStateBytes() const;

 private:
  static constexpr int kHost = 0;
  static constexpr int kAccelerator = 1;

  struct LayerCosts {
    std::string name;
    std::string kind;
    // Indexed by kHost / kAccelerator; at the profiled batch, overhead included.
    double forward_seconds[2] = {0, 0};
    double backward_seconds[2] = {0, 0};
    double update_seconds[2] = {0, 0};
    int64_t parameter_bytes = 0;
    int64_t gradient_bytes = 0;
    int64_t optimizer_state_bytes = 0;
    int64_t activation_bytes = 0;
    int64_t workspace_bytes = 0;
    int64_t staging_bytes = 0;
    int64_t output_bytes = 0;
  };
  struct Link {
    double bytes_per_second = 0;
    double latency_seconds = 0;
  };

  CostModel() = default;
  // The factories' steps: a layer's name, kind and bytes from its analytic
  // fields; then, for each source, the processors, the links and each
  // layer's times (an error names the field at fault).
  static LayerCosts AnalyticLayer(const tandem::v1::LayerProfile& layer);
  void SetMeasuredProcessors(const tandem::v1::DeviceProfile& host,
                             const tandem::v1::DeviceProfile* accelerator);
  absl::Status SetMeasuredLinks(const tandem::v1::Profile& profile);
  // `devices` by kHost / kAccelerator; null: not profiled. `mean`: each
  // phase's mean rather than its median (ProfileProvenance.planning_statistic).
  absl::Status AddMeasuredLayer(const tandem::v1::LayerProfile& layer, int index,
                                const tandem::v1::DeviceProfile* const devices[2], bool mean);
  void SetHardwareHost(const tandem::v1::ProcessorSpec& host);
  // Its first accelerator, its links, its count.
  void SetHardwareAccelerator(const tandem::v1::HardwareSpec& hardware);
  // The accelerator's threads and its matrix rates on them and on one.
  void SetThreadSpeedup(int threads, double rate, double single_thread_rate);
  absl::Status AddRooflineLayer(const tandem::v1::LayerProfile& layer, int index,
                                const tandem::v1::ProcessorSpec* const processors[2]);
  static int DeviceIndex(tandem::v1::Placement device);
  double Scaled(double profiled_seconds, int device, int samples) const;
  int64_t ScaledBytes(int64_t bytes, int samples) const;

  std::vector<LayerCosts> layers_;
  int profiled_batch_size_ = 1;
  tandem::v1::Precision precision_ = tandem::v1::PRECISION_FP32;
  bool clips_gradients_ = false;
  bool has_accelerator_ = false;
  tandem::v1::DeviceKind accelerator_kind_ = tandem::v1::DEVICE_KIND_UNSPECIFIED;
  int accelerator_count_ = 0;
  int host_threads_ = 1;
  // The accelerator's threads (a CPU's or the emulated one's; 0 = not a CPU
  // figure) and how many times one thread's matrix rate those reach (0 =
  // unknown: as many as there are threads).
  int accelerator_threads_ = 0;
  double accelerator_thread_speedup_ = 0;
  int64_t accelerator_memory_bytes_ = 0;
  int64_t host_memory_bytes_ = 0;
  // Fixed cost of one call, by device, in seconds.
  double call_overhead_seconds_[2] = {0, 0};
  // Effective host bandwidth of the gradient average, all host threads, in
  // bytes per second.
  double host_stream_bytes_per_second_ = 0;
  Link h2d_;
  Link d2h_;
  Link peer_;
  bool has_peer_link_ = false;
  std::string source_;
};

// What the fast chain evaluators (resident_chain.h, hetero_replicas.h) read of
// one layer in their inner loops: its accelerator forward/backward over a
// micro-batch of `samples`, its update on either side (host with
// `host_threads`), its gradient's copy to the host, its state, activation,
// checkpoint and workspace bytes, and whether it is recomputed.
struct ChainLayerCosts {
  double fwd = 0, bwd = 0, upd_acc = 0, upd_host = 0, grad_d2h = 0;
  int64_t param = 0, grad = 0, opt = 0, act = 0, ckpt = 0, ws = 0, update_bytes = 0;
  bool has_params = false, recompute = false;
};
ChainLayerCosts ChainLayerCostsOf(const CostModel& cost, int layer, int samples, int host_threads,
                                  bool recompute);

// The timeline a fast chain evaluator reports, if any (null = none), with
// span times shifted so that the reported iteration starts at `t0`.
struct ChainTimeline {
  tandem::v1::Timeline* timeline = nullptr;
  double t0 = 0;
  void Span(tandem::v1::TimelineResource resource, tandem::v1::TimelinePhase phase, int layer,
            int micro_batch, double start, double end, int64_t bytes) const;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_COST_MODEL_H_
