#include "schedule/schedule_proto.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem::schedule {
namespace {

using PB = tandem::v1::Schedule;

// The proto enums are the C++ ones shifted past their UNSPECIFIED value
// (TensorKind has none: kNone is 0 in both).
constexpr int kOpKinds = static_cast<int>(OpKind::kAllGather) + 1;
constexpr int kModes = static_cast<int>(Mode::kHetero) + 1;
constexpr int kTensorKinds = static_cast<int>(TensorKind::kOptimizerState) + 1;

PB::Op OpToProto(const Op& op) {
  PB::Op out;
  out.set_kind(static_cast<PB::OpKind>(static_cast<int>(op.kind) + 1));
  out.set_phase(op.phase);
  out.set_resource(op.resource);
  out.set_host_replica(op.replica == kHostReplica);
  out.set_layer(op.layer);
  out.set_micro_batch(op.micro_batch);
  out.set_bytes(op.bytes);
  out.set_tensor(static_cast<PB::TensorKind>(op.tensor));
  out.set_delivers_update(op.delivers_update);
  out.set_bucket_layers(op.bucket_layers);
  for (const Dep& d : op.deps) {
    PB::Dep* dep = out.add_deps();
    dep->set_op(d.op);
    dep->set_lag(d.lag);
    dep->set_on_start(d.on_start);
  }
  for (const MemoryEvent& e : op.memory) {
    PB::MemoryEvent* event = out.add_memory();
    event->set_pool(e.pool);
    event->set_at_end(e.at_end);
    event->set_delta_bytes(e.delta);
  }
  return out;
}

// Index checks, each naming the field it read.
class Checker {
 public:
  explicit Checker(const PB& proto) : proto_(proto) {}

  absl::Status Index(int value, int size, const std::string& field) const {
    if (value >= 0 && value < size) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("schedule.", field, ": ", value, " is not in [0, ", size, ")"));
  }
  // -1 (none) or an operation.
  absl::Status Mark(int value, const std::string& field) const {
    return value == -1 ? absl::OkStatus() : Index(value, proto_.ops_size(), field);
  }

 private:
  const PB& proto_;
};

absl::StatusOr<Op> OpFromProto(const PB::Op& in, int index, const PB& proto, const Checker& c) {
  const std::string field = absl::StrCat("ops[", index, "]");
  Op op;
  if (in.kind() < 1 || in.kind() > kOpKinds) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.", field, ".kind: unknown"));
  }
  op.kind = static_cast<OpKind>(in.kind() - 1);
  op.phase = in.phase();
  if (absl::Status s = c.Index(in.resource(), proto.resources_size(), field + ".resource");
      !s.ok()) {
    return s;
  }
  op.resource = in.resource();
  op.replica = in.host_replica() ? kHostReplica : kAcceleratorReplica;
  op.layer = in.layer();
  op.micro_batch = in.micro_batch();
  op.bytes = in.bytes();
  if (in.tensor() < 0 || in.tensor() >= kTensorKinds) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.", field, ".tensor: unknown"));
  }
  op.tensor = static_cast<TensorKind>(in.tensor());
  op.delivers_update = in.delivers_update();
  if (in.bucket_layers() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.", field, ".bucket_layers: < 0"));
  }
  op.bucket_layers = in.bucket_layers();
  for (int i = 0; i < in.deps_size(); ++i) {
    const PB::Dep& d = in.deps(i);
    const std::string dep = absl::StrCat(field, ".deps[", i, "]");
    if (absl::Status s = c.Index(d.op(), proto.ops_size(), dep + ".op"); !s.ok()) return s;
    if (d.lag() < 0) return absl::InvalidArgumentError(absl::StrCat("schedule.", dep, ".lag: < 0"));
    op.deps.push_back(Dep{d.op(), d.lag(), d.on_start()});
  }
  for (int i = 0; i < in.memory_size(); ++i) {
    const PB::MemoryEvent& e = in.memory(i);
    const std::string event = absl::StrCat(field, ".memory[", i, "].pool");
    if (absl::Status s = c.Index(e.pool(), proto.pools_size(), event); !s.ok()) return s;
    op.memory.push_back(MemoryEvent{e.pool(), e.at_end(), e.delta_bytes()});
  }
  return op;
}

// Each operation appears exactly once, in its own resource's order.
absl::Status CheckOrder(const Schedule& s) {
  std::vector<int> seen(s.ops.size(), 0);
  for (int r = 0; r < static_cast<int>(s.order.size()); ++r) {
    for (int op : s.order[r]) {
      const std::string field = absl::StrCat("schedule.order[", r, "]");
      if (op < 0 || op >= s.num_ops() || s.ops[op].resource != r) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": ", op, " is not an operation of resource ", r));
      }
      if (seen[op]++) {
        return absl::InvalidArgumentError(absl::StrCat(field, ": operation ", op, " twice"));
      }
    }
  }
  for (int op = 0; op < s.num_ops(); ++op) {
    if (!seen[op]) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule.order: operation ", op, " is in no resource's order"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadMarks(const PB& proto, const Checker& c, Schedule* out) {
  for (int l = 0; l < proto.layers_size(); ++l) {
    const PB::LayerMarks& m = proto.layers(l);
    const std::string field = absl::StrCat("layers[", l, "].");
    for (const auto& [value, name] :
         {std::pair<int, const char*>{m.first_forward(), "first_forward"},
          {m.reuse_start(), "reuse_start"},
          {m.host_update(), "host_update"},
          {m.weights_return(), "weights_return"}}) {
      if (absl::Status s = c.Mark(value, field + name); !s.ok()) return s;
    }
    out->layers.push_back(
        LayerMarks{m.first_forward(), m.reuse_start(), m.host_update(), m.weights_return()});
  }
  for (int i = 0; i < proto.lead_size(); ++i) {
    if (absl::Status s = c.Index(proto.lead(i), proto.ops_size(), absl::StrCat("lead[", i, "]"));
        !s.ok()) {
      return s;
    }
    out->lead.push_back(proto.lead(i));
  }
  return c.Index(proto.program_resource(), proto.resources_size(), "program_resource");
}

}  // namespace

tandem::v1::Schedule ToProto(const Schedule& schedule) {
  PB out;
  out.set_mode(static_cast<PB::Mode>(static_cast<int>(schedule.mode) + 1));
  for (const Resource& r : schedule.resources) {
    PB::Resource* resource = out.add_resources();
    resource->set_kind(r.kind);
    resource->set_device(r.device);
    resource->set_rank(r.rank);
    resource->set_in_order(r.in_order);
  }
  for (int p = 0; p < static_cast<int>(schedule.pools.size()); ++p) {
    PB::MemoryPool* pool = out.add_pools();
    pool->set_host(schedule.pools[p].host);
    pool->set_device(schedule.pools[p].device);
    pool->set_rank(schedule.pools[p].rank);
    pool->set_resident_bytes(schedule.resident_bytes[p]);
  }
  for (const Op& op : schedule.ops) *out.add_ops() = OpToProto(op);
  for (const std::vector<int>& order : schedule.order) {
    out.add_order()->mutable_ops()->Add(order.begin(), order.end());
  }
  out.mutable_lead()->Add(schedule.lead.begin(), schedule.lead.end());
  for (const LayerMarks& m : schedule.layers) {
    PB::LayerMarks* marks = out.add_layers();
    marks->set_first_forward(m.first_forward);
    marks->set_reuse_start(m.reuse_start);
    marks->set_host_update(m.host_update);
    marks->set_weights_return(m.weights_return);
  }
  out.set_program_resource(schedule.program_resource);
  return out;
}

absl::StatusOr<Schedule> FromProto(const tandem::v1::Schedule& proto) {
  const Checker check(proto);
  Schedule s;
  if (proto.mode() < 1 || proto.mode() > kModes) {
    return absl::InvalidArgumentError("schedule.mode: unspecified or unknown");
  }
  s.mode = static_cast<Mode>(proto.mode() - 1);
  for (const PB::Resource& r : proto.resources()) {
    s.resources.push_back(Resource{r.kind(), r.device(), r.rank(), r.in_order()});
  }
  for (const PB::MemoryPool& p : proto.pools()) {
    s.pools.push_back(MemoryPool{p.host(), p.device(), p.rank()});
    s.resident_bytes.push_back(p.resident_bytes());
  }
  for (int i = 0; i < proto.ops_size(); ++i) {
    absl::StatusOr<Op> op = OpFromProto(proto.ops(i), i, proto, check);
    if (!op.ok()) return op.status();
    s.ops.push_back(*std::move(op));
  }
  if (proto.order_size() != proto.resources_size()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.order: ", proto.order_size(),
                                                   " lists for ", proto.resources_size(),
                                                   " resources"));
  }
  for (const PB::Order& order : proto.order())
    s.order.emplace_back(order.ops().begin(), order.ops().end());
  if (absl::Status st = CheckOrder(s); !st.ok()) return st;
  if (absl::Status st = ReadMarks(proto, check, &s); !st.ok()) return st;
  s.program_resource = proto.program_resource();
  return s;
}

bool SameSchedule(const Schedule& a, const Schedule& b) {
  // The message holds every field of a Schedule, so equal messages are equal
  // schedules.
  return ToProto(a).SerializeAsString() == ToProto(b).SerializeAsString();
}

}  // namespace tandem::schedule
