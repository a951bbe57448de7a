#include "schedule/schedule.h"

#include "absl/strings/str_cat.h"

namespace tandem::schedule {

const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kForward:
      return "forward";
    case OpKind::kRecompute:
      return "recompute";
    case OpKind::kBackward:
      return "backward";
    case OpKind::kUpdate:
      return "update";
    case OpKind::kCopy:
      return "copy";
    case OpKind::kGradientAverage:
      return "gradient_average";
    case OpKind::kGradientNorm:
      return "gradient_norm";
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kSend:
      return "send";
    case OpKind::kReceive:
      return "receive";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kAllGather:
      return "all_gather";
  }
  return "?";
}

int Schedule::ResourceOf(tandem::v1::TimelineResource kind, int device) const {
  for (int r = 0; r < static_cast<int>(resources.size()); ++r) {
    if (resources[r].kind == kind && resources[r].device == device && resources[r].rank == 0) {
      return r;
    }
  }
  return -1;
}

std::string Describe(const Schedule& s) {
  std::string out;
  for (size_t r = 0; r < s.order.size(); ++r) {
    if (s.order[r].empty()) continue;
    absl::StrAppend(&out, tandem::v1::TimelineResource_Name(s.resources[r].kind), " device ",
                    s.resources[r].device, " rank ", s.resources[r].rank, ":\n");
    for (int id : s.order[r]) {
      const Op& op = s.ops[id];
      absl::StrAppend(&out, "  #", id, " ", OpKindName(op.kind), " ",
                      tandem::v1::TimelinePhase_Name(op.phase), " layer ", op.layer, " mb ",
                      op.micro_batch);
      if (op.bytes > 0) absl::StrAppend(&out, " bytes ", op.bytes);
      if (!op.deps.empty()) {
        absl::StrAppend(&out, " after");
        for (const Dep& d : op.deps) {
          absl::StrAppend(&out, " #", d.op, d.lag > 0 ? absl::StrCat("@-", d.lag) : "",
                          d.on_start ? "(start)" : "");
        }
      }
      absl::StrAppend(&out, "\n");
    }
  }
  return out;
}

}  // namespace tandem::schedule
