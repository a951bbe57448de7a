#include "runtime/profile/cupti/activity_attribution.h"

#include <algorithm>

namespace tandem::profile {

std::string OverheadKindName(CUpti_ActivityOverheadKind kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_OVERHEAD_DRIVER_COMPILER:
      return "driver_compiler";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH:
      return "cupti_buffer_flush";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION:
      return "cupti_instrumentation";
    case CUPTI_ACTIVITY_OVERHEAD_CUPTI_RESOURCE:
      return "cupti_resource";
    case CUPTI_ACTIVITY_OVERHEAD_RUNTIME_TRIGGERED_MODULE_LOADING:
      return "module_loading";
    case CUPTI_ACTIVITY_OVERHEAD_LAZY_FUNCTION_LOADING:
      return "lazy_function_loading";
    case CUPTI_ACTIVITY_OVERHEAD_COMMAND_BUFFER_FULL:
      return "command_buffer_full";
    case CUPTI_ACTIVITY_OVERHEAD_ACTIVITY_BUFFER_REQUEST:
      return "activity_buffer_request";
    default:
      return "other";
  }
}

void ActivityAttributor::Add(const Activity& activity) {
  if (static_cast<int64_t>(activities_.size()) >= max_activities_) {
    ++dropped_;
    return;
  }
  activities_.push_back(activity);
}

void ActivityAttributor::OnRecord(const CUpti_Activity* record) {
  ++records_;
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const KernelRecord*>(record);
      Add({Kind::kKernel, k->correlationId, k->start, k->end, 0});
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const MemcpyRecord*>(record);
      Add({Kind::kMemcpy, m->correlationId, m->start, m->end, m->bytes});
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const MemsetRecord*>(record);
      Add({Kind::kMemset, m->correlationId, m->start, m->end, m->bytes});
      break;
    }
    case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
      const auto* e = reinterpret_cast<const ExternalCorrelationRecord*>(record);
      if (e->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
        external_ids_[e->correlationId] = e->externalId;
      }
      break;
    }
    case CUPTI_ACTIVITY_KIND_OVERHEAD: {
      const auto* o = reinterpret_cast<const OverheadRecord*>(record);
      const double seconds = o->end > o->start ? 1e-9 * static_cast<double>(o->end - o->start) : 0;
      overhead_seconds_ += seconds;
      overhead_by_kind_[OverheadKindName(o->overheadKind)] += seconds;
      break;
    }
    default:
      break;
  }
}

std::map<PhaseKey, GpuPhaseTotals> ActivityAttributor::Attribute() const {
  std::map<PhaseKey, GpuPhaseTotals> totals;
  for (const Activity& a : activities_) {
    auto it = external_ids_.find(a.correlation_id);
    PhaseKey key;
    if (it == external_ids_.end() || !UnpackExternalId(it->second, &key)) continue;
    GpuPhaseTotals& t = totals[key];
    const double seconds =
        a.end_ns > a.start_ns ? 1e-9 * static_cast<double>(a.end_ns - a.start_ns) : 0;
    switch (a.kind) {
      case Kind::kKernel:
        ++t.kernels;
        t.kernel_seconds += seconds;
        break;
      case Kind::kMemcpy:
        ++t.memcpys;
        t.memcpy_bytes += static_cast<int64_t>(a.bytes);
        t.memcpy_seconds += seconds;
        break;
      case Kind::kMemset:
        ++t.memsets;
        t.memset_bytes += static_cast<int64_t>(a.bytes);
        t.memset_seconds += seconds;
        break;
    }
    t.first_start_ns = t.first_start_ns == 0 ? a.start_ns : std::min(t.first_start_ns, a.start_ns);
    t.last_end_ns = std::max(t.last_end_ns, a.end_ns);
  }
  return totals;
}

int64_t ActivityAttributor::Unattributed() const {
  int64_t n = 0;
  PhaseKey key;
  for (const Activity& a : activities_) {
    auto it = external_ids_.find(a.correlation_id);
    if (it == external_ids_.end() || !UnpackExternalId(it->second, &key)) ++n;
  }
  return n;
}

void ActivityAttributor::Clear() {
  activities_.clear();
  external_ids_.clear();
}

}  // namespace tandem::profile
