// The plan executor's state, shared by its three files (plan_executor.h): each
// layer's decisions and accelerator state, where a replica computes, and the
// tensors of one step. Internal to runtime/exec.
#ifndef TANDEM_RUNTIME_EXEC_EXECUTOR_STATE_H_
#define TANDEM_RUNTIME_EXEC_EXECUTOR_STATE_H_

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/exec/plan_executor.h"

namespace tandem {

// The step program's inputs (step_program.cc), pure functions of the plan and
// the model, so LowerStepProgram and the executor compute them the same way.
// The plan's decisions as the executor runs them: cpu_only and hetero_dp's
// implied placements filled in, unset activation policies KEEP.
// INVALID_ARGUMENT naming the plan field it cannot run.
absl::StatusOr<schedule::Decisions> ExecutorDecisions(const Model& model,
                                                      const tandem::v1::Plan& plan);
// The schedule's bytes per layer: the accelerator replica's at `micro_batch`,
// its state counted in `state` (StateBytesOf: kBF16 for the bf16 working
// copies of a mixed-precision plan, ExecutorStateType).
std::vector<schedule::LayerSizes> ExecutorLayerSizes(const Model& model, int64_t micro_batch,
                                                     int optimizer_states, DType state);
// How a plan's accelerator holds the state of `model`: kBF16 (working copies)
// for a bf16 model under a plan that computes on the accelerator, except
// hetero_dp, whose two replicas keep fp32 weights; kF32 otherwise.
DType ExecutorStateType(const Model& model, const tandem::v1::Plan& plan);
// Whether layer l keeps a bf16 working copy of its weights (and a bf16
// gradient): weights, a `state` of kBF16, and an update on the host or with
// its state streamed (whose fp32 master comes in with the moments).
bool HasWorkingCopy(const Model& model, DType state, const schedule::Decisions& decisions, int l);
// Whether a step takes the global gradient norm before any update: to clip,
// or, for an fp16 model (dynamic loss scaling), to find an overflow.
bool NeedsGradientNorm(const Model& model, const tandem::v1::OptimizerSpec& optimizer);
// INVALID_ARGUMENT "plan.<field>: <message>".
absl::Status PlanError(const std::string& field, const std::string& message);
// Micro-batches of a full batch (the plan's, or `max_batch` samples).
int FullMicroBatches(const tandem::v1::Plan& plan, int64_t max_batch);

// A lowered schedule and what the executor looks up in it, computed once
// when it is lowered rather than on every step.
struct PlanExecutor::Program : schedule::Schedule {
  // Each operation's place in its resource's order.
  std::vector<int> place;
  // Per layer, -1 where there is none: its GRADIENT_D2H, and the UPDATE on
  // the host update pool (of whichever replica).
  std::vector<int> gradient_d2h, host_update;
  // Per replica (schedule::Replica) and layer: whether the schedule
  // recomputes it, so its forward's saved tensors are dropped.
  std::vector<bool> recomputes[2];
  // The GRADIENT_NORM operation (clipping, fp16's overflow check); -1: none.
  int gradient_norm = -1;
  // Per replica, its last micro-batch.
  int last_micro_batch[2] = {0, 0};

  explicit Program(schedule::Schedule s);
  // Operation `op` of this program, or the one that plays its part in `to`
  // (a step with another number of micro-batches: a replica's last
  // micro-batch is its last one there too, and one past the end there is
  // that last one); -1 if `to` has none.
  int Counterpart(int op, const Program& to) const;
};

// One layer's decisions and its state on the accelerator.
struct PlanExecutor::Layer {
  const tandem::Layer* layer = nullptr;
  bool streamed = false;
  bool accel_update = true;
  // An accelerator update of state streamed from the host
  // (LayerPlan.stream_optimizer_state): `moments` (and, for a working copy,
  // `master`) exist on the accelerator from the layer's STATE_H2D to its
  // STATE_D2H; the host's copies hold them in between.
  bool stream_state = false;
  bool has_params = false;
  // A mixed-precision plan's host-updated (or streamed-state) layer: the accelerator holds a bf16
  // working copy of its weights (`params`, resident or streamed) and a bf16
  // gradient (`grads`); the fp32 master weights and state stay on the host.
  // Each call widens the copy to fp32 for the layer and rounds the gradient
  // it computes back (StateBytesOf's staging).
  bool working_copy = false;
  // Bytes of the weights and of the gradient on the accelerator.
  int64_t state_bytes() const { return param_elements * (working_copy ? 2 : 4); }
  int64_t param_elements = 0;  // the layer's slice of the flat buffers (padded)
  // The optimizer state the host keeps for the layer: moments at
  // moment_offset of host_moments_, for the weights [moment_first,
  // moment_first + moment_elements) of the flat buffers. The whole layer,
  // except a host-updated layer's under partitioned host state: the part of
  // it in this rank's piece of its bucket (`partitioned`), maybe none.
  int64_t moment_offset = 0, moment_first = 0, moment_elements = 0;
  bool partitioned = false;
  int64_t buffer_elements = 0;
  int64_t param_offset = 0, buffer_offset = 0;
  // Accelerator state: resident weights, running statistics, optimizer moments,
  // and the gradient from a step's first backward until copied or applied
  // (bf16 for a working copy, else fp32).
  Buffer params, buffers, grads;
  std::vector<Buffer> moments;
  // A streamed working copy's fp32 master weights while on the accelerator.
  Buffer master;
};

// Where a replica computes: its memory, layer contexts and copies to and from
// the host. The host side copies with memcpy.
struct PlanExecutor::Side {
  Accelerator* dev = nullptr;  // null on the host
  Allocator* alloc = nullptr;

  LayerContext Context() const {
    if (dev != nullptr) return dev->ComputeContext();
    return LayerContext();
  }
  absl::Status Finish() const { return dev != nullptr ? dev->FinishCompute() : absl::OkStatus(); }
  absl::Status FromHost(void* dst, const void* src, int64_t bytes) const {
    if (dev != nullptr) return dev->CopyToDevice(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status ToHost(void* dst, const void* src, int64_t bytes) const {
    if (dev != nullptr) return dev->CopyToHost(dst, src, bytes);
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status Fill(float* dst, float value, int64_t n) const {
    if (dev != nullptr) return dev->Fill(dst, value, n);
    std::fill(dst, dst + n, value);
    return absl::OkStatus();
  }
};

// The tensors of one replica's work in one step, touched by spans in
// dependency order.
struct PlanExecutor::Replica {
  Side side;
  // Samples of the whole batch this replica computes, in micro-batches.
  std::vector<int64_t> mb_start, mb_size;
  // [layer][micro-batch]: outputs, saved tensors, the incoming gradient, and
  // an offloaded layer's input and saved tensors while on the host.
  std::vector<std::vector<Buffer>> out, saved, grad, host_in, host_saved;
  std::vector<Buffer> x, targets;
  // Host replica only: where its backward writes gradients (cpu_only: the
  // executor's host gradients; hetero_dp: its own, apart from the
  // accelerator's, which arrive in the executor's host gradients).
  float* host_grads = nullptr;

  int micro_batches() const { return static_cast<int>(mb_start.size()); }
  void Size(int layers, int64_t first, int64_t samples, int64_t micro_batch) {
    for (int64_t s = 0; s < samples; s += micro_batch) {
      mb_start.push_back(first + s);
      mb_size.push_back(std::min(micro_batch, samples - s));
    }
    const size_t M = mb_start.size();
    for (auto* v : {&out, &saved, &grad, &host_in, &host_saved}) {
      v->clear();
      v->resize(layers);
      for (auto& per_layer : *v) per_layer.resize(M);
    }
    x.resize(M);
    targets.resize(M);
  }
  // Layer l's input for micro-batch j: the batch, or the previous layer's output.
  Buffer& Input(int l, int j) { return l == 0 ? x[j] : out[l - 1][j]; }
};

struct PlanExecutor::Iteration {
  int64_t k = 0;
  int64_t batch = 0;
  StepOptions options;
  StepConstants step;
  const Batch* input = nullptr;
  Replica accel, host;
  std::vector<float> losses;
  float grad_scale = 1.0f;
  double grad_norm = 0;
  // The program this step runs, each operation's span, and the weights a
  // streaming copy brought for the operations that depend on it.
  const Program* schedule = nullptr;
  std::vector<SpanId> spans;
  std::vector<Buffer> streamed;

  // The replica a forward, recompute or backward computes on.
  Replica& ReplicaOf(const schedule::Op& op) {
    return op.replica == schedule::kHostReplica ? host : accel;
  }
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_EXECUTOR_STATE_H_
