// Turning CUPTI activity records into per-phase GPU work. The tracer feeds raw
// records (CUpti_Activity*) to an ActivityRecordSink; ActivityAttributor keeps
// the kernels, copies and sets, the correlation records that tie each to the
// external id pushed around a layer phase (external_id.h), and CUPTI's own
// overhead records, and joins them on demand. Records arrive in any order and
// across buffers, so the join happens in Attribute(), not on arrival.
//
// Tests feed synthetic records of the header's types (no GPU needed). CUDA
// builds only. Thread-compatible: the tracer serialises OnRecord calls; read
// after a flush.
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_ATTRIBUTION_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_ATTRIBUTION_H_

#include <cupti_activity.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/profile/cupti/external_id.h"

namespace tandem::profile {

// The record struct versions of the headers we build against (CUDA 13).
using KernelRecord = CUpti_ActivityKernel10;
using MemcpyRecord = CUpti_ActivityMemcpy6;
using MemsetRecord = CUpti_ActivityMemset4;
using OverheadRecord = CUpti_ActivityOverhead3;
using ExternalCorrelationRecord = CUpti_ActivityExternalCorrelation;

class ActivityRecordSink {
 public:
  virtual ~ActivityRecordSink() = default;
  virtual void OnRecord(const CUpti_Activity* record) = 0;
};

// GPU work of one call of one phase.
struct GpuPhaseTotals {
  int64_t kernels = 0;
  // Sum of kernel durations (end - start); overlapping kernels on several
  // streams count each.
  double kernel_seconds = 0;
  int64_t memcpys = 0;
  int64_t memcpy_bytes = 0;
  double memcpy_seconds = 0;
  int64_t memsets = 0;
  int64_t memset_bytes = 0;
  double memset_seconds = 0;
  // From the first start to the last end of the call's work, on CUPTI's clock.
  uint64_t first_start_ns = 0;
  uint64_t last_end_ns = 0;
  double span_seconds() const {
    return last_end_ns > first_start_ns ? 1e-9 * static_cast<double>(last_end_ns - first_start_ns)
                                        : 0.0;
  }
};

class ActivityAttributor final : public ActivityRecordSink {
 public:
  // At most `max_activities` kernels, copies and sets are kept between Clear()
  // calls; more are counted in dropped() rather than stored.
  explicit ActivityAttributor(int64_t max_activities = int64_t{1} << 22)
      : max_activities_(max_activities) {}

  void OnRecord(const CUpti_Activity* record) override;

  // Work per phase call, for every activity whose correlation record names one
  // of our external ids.
  std::map<PhaseKey, GpuPhaseTotals> Attribute() const;
  // Kernels, copies and sets with no external id of ours (launched outside any
  // profiled phase, or whose correlation record was dropped).
  int64_t Unattributed() const;

  // CUPTI's own overhead records since construction (Clear keeps them), in
  // seconds: all kinds, and by kind ("cupti_buffer_flush", ...).
  double overhead_seconds() const { return overhead_seconds_; }
  const std::map<std::string, double>& overhead_by_kind() const { return overhead_by_kind_; }
  int64_t dropped() const { return dropped_; }
  int64_t records() const { return records_; }

  // Forgets activities and correlations (after a layer was collected).
  void Clear();

 private:
  enum class Kind : uint8_t { kKernel, kMemcpy, kMemset };
  struct Activity {
    Kind kind;
    uint32_t correlation_id;
    uint64_t start_ns;
    uint64_t end_ns;
    uint64_t bytes;
  };
  void Add(const Activity& activity);

  const int64_t max_activities_;
  std::vector<Activity> activities_;
  std::unordered_map<uint32_t, uint64_t> external_ids_;
  double overhead_seconds_ = 0;
  std::map<std::string, double> overhead_by_kind_;
  int64_t dropped_ = 0;
  int64_t records_ = 0;
};

// "cupti_buffer_flush", "driver_compiler", ...
std::string OverheadKindName(CUpti_ActivityOverheadKind kind);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_ATTRIBUTION_H_
