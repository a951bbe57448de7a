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

namespace tandem {
namespace {

using schedule::Op;
using schedule::OpKind;

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

// Operation `op` of `from`, or the one that plays its part in `to` (a step
// with another number of micro-batches: the last micro-batch's is the last
// micro-batch's); -1 if `to` has none.
int Counterpart(const schedule::Schedule& from, int op, const schedule::Schedule& to) {
  if (&from == &to) return op;
  const Op& a = from.ops[op];
  const int from_last = from.ops[from.order[from.program_resource].back()].micro_batch;
  const int to_last = to.ops[to.order[to.program_resource].back()].micro_batch;
  const int j = a.micro_batch == from_last ? to_last : a.micro_batch;
  for (int o : to.order[a.resource]) {
    const Op& b = to.ops[o];
    if (b.kind == a.kind && b.phase == a.phase && b.layer == a.layer && b.replica == a.replica &&
        b.tensor == a.tensor && b.micro_batch == j) {
      return o;
    }
  }
  return -1;
}

}  // namespace

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
  }
}

absl::StatusOr<const PlanExecutor::Program*> PlanExecutor::ScheduleFor(int micro_batches) {
  auto found = schedules_.find(micro_batches);
  if (found != schedules_.end()) return found->second.get();
  // Only the program's shape depends on the batch: lower micro-batches of
  // one sample (a short batch has fewer of them, or a short last one).
  schedule::Decisions d = decisions_;
  d.micro_batch_size = 1;
  if (hetero_) {
    d.accelerator_batch_share = micro_batches;
    d.batch_size = micro_batches + 1;
  } else {
    d.batch_size = micro_batches;
  }
  schedule::LowerOptions lower;
  lower.has_accelerator = accel_ != nullptr;
  lower.clip_gradients = options_.optimizer.max_grad_norm() > 0;
  TANDEM_ASSIGN_OR_RETURN(schedule::Schedule s, schedule::Lower(d, sizes_, lower));
  for (const Op& op : s.ops) {
    if (op.kind == OpKind::kAllReduce || op.kind == OpKind::kSend || op.kind == OpKind::kReceive) {
      return absl::UnimplementedError(absl::StrCat("the plan executor does not run ",
                                                   schedule::OpKindName(op.kind), " operations"));
    }
  }
  auto& slot = schedules_[micro_batches];
  slot = std::make_unique<Program>(std::move(s));
  return slot.get();
}

SpanId PlanExecutor::SpanOf(const Iteration& it, int op, int lag) const {
  if (lag == 0) return it.spans[op];
  auto before = recent_.find(it.k - lag);
  if (before == recent_.end()) return 0;
  const Iteration& past = *before->second;
  const int o = Counterpart(*it.schedule, op, *past.schedule);
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
