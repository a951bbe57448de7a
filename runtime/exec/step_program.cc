// The step program: a step's Schedule (schedule/lower.h) turned into spans.
// Every operation becomes one span with the schedule's dependencies, its
// stream's order and, where the executor keeps one copy of a buffer that the
// schedule's rules would let two steps use at once, a hazard dependency
// (Hazards below). Nothing here decides the order of work; the schedule does.
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/exec/executor_state.h"
#include "schedule/lower.h"
#include "schedule/schedule_proto.h"

namespace tandem {
namespace {

using schedule::Op;
using schedule::OpKind;
using tandem::v1::ActivationPolicy;

constexpr ActivationPolicy kKeep = tandem::v1::ACTIVATION_POLICY_KEEP;
constexpr ActivationPolicy kOffload = tandem::v1::ACTIVATION_POLICY_OFFLOAD;

// The longest lag a schedule reaches back (delayed updates' weights).
constexpr int64_t kMaxLag = 2;

// Whether operation `o` belongs to one micro-batch (the timeline and error
// messages name it): compute, activation copies, and streamed weights (every
// weight copy but a resident layer's copy back).
bool PerMicroBatch(const schedule::Schedule& s, int o) {
  const Op& op = s.ops[o];
  return op.kind == OpKind::kForward || op.kind == OpKind::kRecompute ||
         op.kind == OpKind::kBackward || op.phase == tandem::v1::TIMELINE_PHASE_ACTIVATION_D2H ||
         op.phase == tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D ||
         (op.phase == tandem::v1::TIMELINE_PHASE_PARAMETER_H2D &&
          o != s.layers[op.layer].weights_return);
}

// Operations the executor cannot run yet (between pipeline stages).
absl::Status CheckRunnable(const schedule::Schedule& s) {
  for (const Op& op : s.ops) {
    if (op.kind == OpKind::kSend || op.kind == OpKind::kReceive) {
      return absl::UnimplementedError(absl::StrCat("the plan executor does not run ",
                                                   schedule::OpKindName(op.kind), " operations"));
    }
  }
  return absl::OkStatus();
}

// The program of `micro_batches` micro-batches. Only its shape depends on the
// batch: it lowers micro-batches of one sample (a short batch has fewer of
// them, or a short last one).
absl::StatusOr<schedule::Schedule> LowerProgram(const schedule::Decisions& decisions,
                                                const std::vector<schedule::LayerSizes>& sizes,
                                                int micro_batches,
                                                const schedule::LowerOptions& options) {
  schedule::Decisions d = decisions;
  d.micro_batch_size = 1;
  if (d.strategy == tandem::v1::STRATEGY_HETERO_DP) {
    d.accelerator_batch_share = micro_batches;
    d.batch_size = micro_batches + 1;
  } else {
    d.batch_size = micro_batches;
  }
  TANDEM_ASSIGN_OR_RETURN(schedule::Schedule s, schedule::Lower(d, sizes, options));
  TANDEM_RETURN_IF_ERROR(CheckRunnable(s));
  return s;
}

// One layer's decisions as the executor runs them.
absl::Status NormalizeLayer(const Model& model, const tandem::v1::Plan& plan, int l,
                            schedule::LayerDecisions& d) {
  const bool host_only = plan.strategy() == tandem::v1::STRATEGY_CPU_ONLY;
  if (d.activation == tandem::v1::ACTIVATION_POLICY_UNSPECIFIED) d.activation = kKeep;
  if (host_only) {
    // cpu_only: everything on the host; there is nowhere to offload to.
    d = {tandem::v1::PLACEMENT_HOST, tandem::v1::PARAMETER_HOME_HOST, tandem::v1::PLACEMENT_HOST,
         d.activation == kOffload ? kKeep : d.activation};
  } else if (plan.layers(l).compute() == tandem::v1::PLACEMENT_HOST) {
    return PlanError(absl::StrCat("layers[", l, "].compute"),
                     "host compute of single layers inside an accelerator plan is not supported");
  } else if (plan.strategy() == tandem::v1::STRATEGY_HETERO_DP) {
    // Both replicas keep their state resident and update with the same gradient.
    d = {tandem::v1::PLACEMENT_ACCELERATOR, tandem::v1::PARAMETER_HOME_ACCELERATOR,
         tandem::v1::PLACEMENT_ACCELERATOR, d.activation == kOffload ? kKeep : d.activation};
  }
  const bool streamed = d.parameter_home == tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  if (streamed && !host_only && d.update != tandem::v1::PLACEMENT_HOST) {
    return PlanError(absl::StrCat("layers[", l, "].update"),
                     "a streamed layer must update on the host");
  }
  if (plan.delayed_parameter_update() && streamed && model.layer(l).ParamCount() > 0) {
    return PlanError("delayed_parameter_update", "is not supported with streamed layers");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("plan.", field, ": ", message));
}

absl::StatusOr<schedule::Decisions> ExecutorDecisions(const Model& model,
                                                      const tandem::v1::Plan& plan) {
  TANDEM_ASSIGN_OR_RETURN(schedule::Decisions d,
                          schedule::DecisionsFromPlan(plan, model.num_layers()));
  d.host_update_threads = std::max(1, d.host_update_threads);
  for (int l = 0; l < model.num_layers(); ++l) {
    TANDEM_RETURN_IF_ERROR(NormalizeLayer(model, plan, l, d.layers[l]));
  }
  return d;
}

std::vector<schedule::LayerSizes> ExecutorLayerSizes(const Model& model, int64_t micro,
                                                     int optimizer_states, DType state) {
  std::vector<schedule::LayerSizes> sizes(model.num_layers());
  for (int l = 0; l < model.num_layers(); ++l) {
    const tandem::Layer& layer = model.layer(l);
    schedule::LayerSizes& z = sizes[l];
    const LayerStateBytes bytes = StateBytesOf(model.param_slice(l), optimizer_states, state);
    z.parameters = bytes.parameters;
    z.gradients = bytes.gradients;
    z.update = model.param_slice(l) * 4;
    z.optimizer_state = bytes.optimizer_state;
    z.activations = layer.OutputBytes(micro) + layer.SavedBytes(micro);
    z.checkpoint = l == 0 ? 0 : std::min(z.activations, model.layer(l - 1).OutputBytes(micro));
    z.workspace = layer.WorkspaceBytes(micro) + bytes.staging;
    // A streamed-state update widens a bf16 gradient to fp32 (span_work.cc).
    z.update_staging = state == DType::kBF16 ? model.param_slice(l) * 4 : 0;
    z.host_activations = z.activations;
    z.host_checkpoint = z.checkpoint;
    z.host_workspace = z.workspace;
  }
  return sizes;
}

bool NeedsGradientNorm(const Model& model, const tandem::v1::OptimizerSpec& optimizer) {
  return optimizer.max_grad_norm() > 0 || model.compute_dtype() == DType::kF16;
}

DType ExecutorStateType(const Model& model, const tandem::v1::Plan& plan) {
  const bool accelerator_state = plan.strategy() != tandem::v1::STRATEGY_CPU_ONLY &&
                                 plan.strategy() != tandem::v1::STRATEGY_HETERO_DP;
  // fp16 models keep fp32 state: working copies are bf16's alone.
  return accelerator_state && model.compute_dtype() == DType::kBF16 ? DType::kBF16 : DType::kF32;
}

bool HasWorkingCopy(const Model& model, DType state, const schedule::Decisions& decisions, int l) {
  return state == DType::kBF16 && model.param_slice(l) > 0 &&
         (decisions.layers[l].update == tandem::v1::PLACEMENT_HOST ||
          decisions.layers[l].stream_state);
}

bool KeepsWorkingCopies(const Model& model, const tandem::v1::Plan& plan) {
  const DType state = ExecutorStateType(model, plan);
  if (plan.pipeline_size() > 0 || state != DType::kBF16) return false;
  const absl::StatusOr<schedule::Decisions> decisions = ExecutorDecisions(model, plan);
  if (!decisions.ok()) return false;  // a plan the executor refuses to run
  for (int l = 0; l < model.num_layers(); ++l) {
    if (HasWorkingCopy(model, state, *decisions, l)) return true;
  }
  return false;
}

int FullMicroBatches(const tandem::v1::Plan& plan, int64_t max_batch) {
  const int64_t batch = plan.batch_size() > 0 ? plan.batch_size() : max_batch;
  const int64_t samples =
      plan.strategy() == tandem::v1::STRATEGY_HETERO_DP && plan.accelerator_batch_share() > 0
          ? plan.accelerator_batch_share()
          : batch;
  const int64_t micro = std::min<int64_t>(plan.micro_batch_size(), std::max<int64_t>(1, samples));
  return static_cast<int>((samples + micro - 1) / micro);
}

absl::StatusOr<schedule::Schedule> LowerStepProgram(const Model& model,
                                                    const tandem::v1::Plan& plan,
                                                    const tandem::v1::OptimizerSpec& optimizer,
                                                    int64_t max_batch) {
  if (plan.layers_size() != model.num_layers()) {
    return PlanError("layers", absl::StrCat("has ", plan.layers_size(), " layers; the model has ",
                                            model.num_layers()));
  }
  if (plan.micro_batch_size() <= 0) return PlanError("micro_batch_size", "must be > 0");
  TANDEM_ASSIGN_OR_RETURN(const schedule::Decisions d, ExecutorDecisions(model, plan));
  const std::vector<schedule::LayerSizes> sizes = ExecutorLayerSizes(
      model, plan.micro_batch_size(), Optimizer::Stateless(optimizer)->state_count(),
      ExecutorStateType(model, plan));
  schedule::LowerOptions lower;
  lower.has_accelerator = plan.strategy() != tandem::v1::STRATEGY_CPU_ONLY;
  lower.clip_gradients = NeedsGradientNorm(model, optimizer);
  return LowerProgram(d, sizes, FullMicroBatches(plan, max_batch), lower);
}

int PlanExecutor::Program::Counterpart(int op, const Program& to) const {
  if (this == &to) return op;
  const Op& a = ops[op];
  // Each replica by its own micro-batches: hetero_dp's host replica has
  // fewer than the accelerator's, and mapped by the accelerator's count its
  // operations found none, so their dependencies on the step before were lost.
  const int from_last = last_micro_batch[a.replica], to_last = to.last_micro_batch[a.replica];
  const int j = a.micro_batch == from_last ? to_last : std::min(a.micro_batch, to_last);
  for (int o : to.order[a.resource]) {
    const Op& b = to.ops[o];
    if (b.kind == a.kind && b.phase == a.phase && b.layer == a.layer && b.replica == a.replica &&
        b.tensor == a.tensor && b.micro_batch == j) {
      return o;
    }
  }
  return -1;
}

PlanExecutor::Program::Program(schedule::Schedule s) : schedule::Schedule(std::move(s)) {
  const int L = static_cast<int>(layers.size());
  place.assign(num_ops(), 0);
  for (const std::vector<int>& resource : order) {
    for (size_t i = 0; i < resource.size(); ++i) place[resource[i]] = static_cast<int>(i);
  }
  gradient_d2h.assign(L, -1);
  host_update.assign(L, -1);
  for (std::vector<bool>& r : recomputes) r.assign(L, false);
  const int pool = ResourceOf(tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE);
  for (int o = 0; o < num_ops(); ++o) {
    const Op& op = ops[o];
    if (op.phase == tandem::v1::TIMELINE_PHASE_GRADIENT_D2H) gradient_d2h[op.layer] = o;
    if (op.kind == OpKind::kUpdate && op.resource == pool) host_update[op.layer] = o;
    if (op.kind == OpKind::kRecompute) recomputes[op.replica][op.layer] = true;
    if (op.kind == OpKind::kGradientNorm) gradient_norm = o;
    last_micro_batch[op.replica] = std::max(last_micro_batch[op.replica], op.micro_batch);
  }
}

absl::StatusOr<const PlanExecutor::Program*> PlanExecutor::ScheduleFor(int micro_batches,
                                                                       bool full_batch) {
  auto found = schedules_.find(micro_batches);
  if (found != schedules_.end()) return found->second.get();
  schedule::LowerOptions lower;
  lower.has_accelerator = accel_ != nullptr;
  lower.clip_gradients = NeedsGradientNorm(model_, options_.optimizer);
  if (options_.collective != nullptr) {
    lower.ranks = options_.collective->ranks();
    lower.bucket_bytes = options_.bucket_bytes;
    lower.partition_host_state = options_.partition_host_state;
  }
  TANDEM_ASSIGN_OR_RETURN(schedule::Schedule s,
                          LowerProgram(decisions_, sizes_, micro_batches, lower));
  if (full_batch && options_.schedule.ops_size() > 0) {
    AdoptStoredProgram(micro_batches, std::move(s));
  } else {
    schedules_[micro_batches] = std::make_unique<Program>(std::move(s));
  }
  return schedules_[micro_batches].get();
}

void PlanExecutor::AdoptStoredProgram(int micro_batches, schedule::Schedule lowered) {
  // Only a program that is exactly this plan's lowering runs: the executor
  // relies on invariants of Lower's output (every index in range, an acyclic
  // order, the marks set) that a damaged or older record need not keep.
  absl::StatusOr<schedule::Schedule> stored = schedule::FromProto(options_.schedule);
  const bool same = stored.ok() && schedule::SameSchedule(*stored, lowered);
  schedules_[micro_batches] =
      std::make_unique<Program>(same ? *std::move(stored) : std::move(lowered));
}

SpanId PlanExecutor::SpanOf(const Iteration& it, int op, int lag) const {
  if (lag == 0) return it.spans[op];
  auto before = recent_.find(it.k - lag);
  if (before == recent_.end()) return 0;
  const Iteration& past = *before->second;
  const int o = it.schedule->Counterpart(op, *past.schedule);
  return o < 0 ? 0 : past.spans[o];
}

void PlanExecutor::BuildStep(const std::shared_ptr<Iteration>& shared) {
  Iteration& it = *shared;
  const schedule::Schedule& s = *it.schedule;
  it.spans.assign(s.num_ops(), 0);
  it.streamed.resize(s.num_ops());
  recent_[it.k] = shared;
  while (!recent_.empty() && recent_.begin()->first < it.k - kMaxLag)
    recent_.erase(recent_.begin());
  auto previous = recent_.find(it.k - 1);
  for (int o = 0; o < s.num_ops(); ++o) {
    const Op& op = s.ops[o];
    if (decisions_.delayed_parameter_update && op.layer >= 0 &&
        o == s.layers[op.layer].weights_return) {
      continue;  // the next step issues it (AddDeferredReturn)
    }
    if (decisions_.delayed_parameter_update && op.kind == OpKind::kUpdate &&
        o == s.layers[op.layer].host_update && previous != recent_.end()) {
      // The previous update's weights go back before this update overwrites
      // the host weights that copy reads (and after this step's last backward
      // of the layer has read the accelerator's copy).
      AddDeferredReturn(previous->second, it, op.layer);
    }
    AddOp(shared, o, Hazards(it, o));
  }
}

void PlanExecutor::AddDeferredReturn(const std::shared_ptr<Iteration>& past, const Iteration& now,
                                     int layer) {
  const int o = past->schedule->layers[layer].weights_return;
  if (o < 0 || past->spans[o] != 0) return;
  AddOp(past, o, {now.spans[now.schedule->layers[layer].reuse_start]});
}

std::vector<SpanId> PlanExecutor::Hazards(const Iteration& it, int o) const {
  const schedule::Schedule& s = *it.schedule;
  const Op& op = s.ops[o];
  std::vector<SpanId> hazards;
  if (op.layer < 0) return hazards;
  const int l = op.layer;
  auto previous = recent_.find(it.k - 1);
  if (previous == recent_.end()) return hazards;
  const Iteration& past = *previous->second;
  const Program& ps = *past.schedule;
  auto past_span = [&](int past_op) { return past_op < 0 ? SpanId{0} : past.spans[past_op]; };
  if (decisions_.delayed_parameter_update && !layers_[l]->accel_update) {
    // With weights one update old, the next step's work on a layer may
    // overlap this step's update of it; the executor holds one host gradient
    // and one accelerator gradient per layer, so:
    if (op.phase == tandem::v1::TIMELINE_PHASE_GRADIENT_D2H) {
      // the gradient comes down once the previous update has read the last one,
      hazards.push_back(past_span(ps.host_update[l]));
    } else if (op.kind == OpKind::kBackward && op.micro_batch == 0 &&
               op.replica == schedule::kAcceleratorReplica) {
      // the first backward writes the gradient the previous copy has read,
      hazards.push_back(past_span(ps.gradient_d2h[l]));
    } else if (o == s.layers[l].host_update) {
      // and the update writes the host weights the previous return has read.
      hazards.push_back(past_span(ps.layers[l].weights_return));
    }
  }
  if (hetero_ && op.phase == tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC &&
      s.resources[op.resource].kind == tandem::v1::TIMELINE_RESOURCE_COPY_D2H) {
    // hetero_dp: the accelerator's gradient comes down into the host gradient
    // the host replica's previous update read.
    hazards.push_back(past_span(ps.host_update[l]));
  }
  return hazards;
}

void PlanExecutor::AddOp(const std::shared_ptr<Iteration>& shared, int o,
                         std::vector<SpanId> deps) {
  Iteration& it = *shared;
  const Program& s = *it.schedule;
  const Op& op = s.ops[o];
  std::vector<SpanId> start_deps;
  for (const schedule::Dep& d : op.deps) {
    (d.on_start ? start_deps : deps).push_back(SpanOf(it, d.op, d.lag));
  }
  if (s.resources[op.resource].in_order) {
    // A stream runs its operations in the schedule's order, step after step.
    const std::vector<int>& order = s.order[op.resource];
    const int place = s.place[o];
    if (place > 0) {
      deps.push_back(it.spans[order[place - 1]]);
    } else if (auto past = recent_.find(it.k - 1); past != recent_.end()) {
      const std::vector<int>& before = past->second->schedule->order[op.resource];
      if (!before.empty()) deps.push_back(past->second->spans[before.back()]);
    }
  }
  SpanInfo info;
  info.resource = s.resources[op.resource].kind;
  info.phase = op.phase;
  info.layer = op.layer;
  info.micro_batch = PerMicroBatch(s, o) ? op.micro_batch : -1;
  info.bytes = op.bytes;
  info.iteration = it.k;
  info.op = o;
  ++iteration_spans_[it.k];
  it.spans[o] = engine_->Add(info, std::move(deps), std::move(start_deps), Work(shared, o));
}

}  // namespace tandem
