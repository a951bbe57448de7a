// The profiler's always-on view of one running job, for the daemon's metrics:
// per-layer phase histograms (layer_histograms.h) and, for hybrid plans, each
// resource's busy time, the bytes each copy engine moved, the time a resource
// sat idle waiting on another (the accelerator on host updates, the host on
// gradients), and the pinned host memory in use.
//
// A JobTelemetry is the LayerTimingSink a job's runner feeds from its driving
// thread; the metrics scrape reads it concurrently through the snapshots.
// Resource totals are sums since the job started in this process (Prometheus
// counters). Thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_JOB_TELEMETRY_H_
#define TANDEM_RUNTIME_PROFILE_JOB_TELEMETRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "runtime/device/timing_sink.h"
#include "runtime/profile/layer_histograms.h"

namespace tandem::profile {

struct ResourceUsageSnapshot {
  // The accelerator the spans ran beside; empty until a hybrid span ran.
  std::string accelerator;
  int64_t pinned_host_bytes = 0;
  // The accelerator's memory at the latest step's end (unset before one
  // ended): in use by category, and its peak since the job began.
  std::optional<MemoryStats> accelerator_memory;
  struct Resource {
    tandem::v1::TimelineResource resource;
    double busy_seconds = 0;
    int64_t bytes = 0;
  };
  // Resources that ran at least one span, by resource.
  std::vector<Resource> resources;
  struct Wait {
    tandem::v1::TimelineResource resource;
    tandem::v1::TimelineResource waited_on;
    double seconds = 0;
  };
  // Only pairs with a wait recorded, by (resource, waited_on).
  std::vector<Wait> waits;
};

// Whether a resource belongs to the accelerator (its compute stream and copy
// engines) rather than the host.
bool OnAccelerator(tandem::v1::TimelineResource resource);
// "accelerator_compute", "copy_h2d", "host_update", ...: the `resource` label.
std::string ResourceLabel(tandem::v1::TimelineResource resource);

class JobTelemetry final : public LayerTimingSink {
 public:
  explicit JobTelemetry(std::vector<std::string> layer_names);

  void Record(int layer, Phase phase, double seconds) override;
  void RecordSpans(const ResourceSpanBatch& batch) override;

  LayerHistogramSnapshot LayerSnapshot() const { return layers_.Snapshot(); }
  ResourceUsageSnapshot ResourceSnapshot() const;

 private:
  struct Totals {
    double busy_seconds = 0;
    int64_t bytes = 0;
  };
  LayerHistograms layers_;
  mutable absl::Mutex mu_;
  std::string accelerator_ ABSL_GUARDED_BY(mu_);
  int64_t pinned_host_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<MemoryStats> accelerator_memory_ ABSL_GUARDED_BY(mu_);
  std::map<tandem::v1::TimelineResource, Totals> totals_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<tandem::v1::TimelineResource, tandem::v1::TimelineResource>, double> waits_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_JOB_TELEMETRY_H_
