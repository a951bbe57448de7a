// The per-job series of the always-on profiler, read at each scrape from the
// jobs' JobTelemetry (runtime/profile/job_telemetry.h) rather than copied into
// registry families on every step:
//
//   tandem_layer_step_seconds{job_id,layer,phase}            histogram
//   tandem_resource_busy_seconds_total{job_id,device,resource}
//   tandem_resource_wait_seconds_total{job_id,device,resource,waited_on}
//   tandem_link_transferred_bytes_total{job_id,device,direction}
//   tandem_pinned_host_memory_bytes{job_id,device}          gauge
//
// `resource` and `waited_on` use one vocabulary (accelerator_compute,
// copy_h2d, copy_d2h, host_update, host_compute); `device` is the accelerator
// ("cuda:0", "emulated:0") for its compute stream and copy engines, "cpu" for
// the host's. Label values are cut to kMaxLabelValueBytes. Thread-safe.
#ifndef TANDEM_SERVER_METRICS_JOB_TELEMETRY_COLLECTOR_H_
#define TANDEM_SERVER_METRICS_JOB_TELEMETRY_COLLECTOR_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "runtime/profile/job_telemetry.h"

namespace tandem::metrics {

// Longer label values (a layer name) are cut, so one job cannot make every
// scrape arbitrarily large.
inline constexpr size_t kMaxLabelValueBytes = 128;
// tandem_layer_step_seconds keeps its own series for at most this many layers
// of a job (the merged series included): its optimizer step and the layers
// with the most time over all phases at the first scrape that sees more,
// kept for the job's life. The others' observations are merged, phase by
// phase, into layer="other layers". A
// histogram is about 22 series (its buckets, sum and count) per layer and
// phase: a 4,096-layer job would export 270,000 of them, 64 layers at most
// about 4,200.
inline constexpr size_t kMaxLayerSeriesPerJob = 64;
inline constexpr const char* kOtherLayersLabel = "other layers";
inline constexpr int kOtherLayersIndex = -2;

class JobTelemetryCollector final : public prometheus::Collectable {
 public:
  // Serves `telemetry` under `job_id` until Forget(job_id).
  void Track(const std::string& job_id, std::shared_ptr<const profile::JobTelemetry> telemetry);
  void Forget(const std::string& job_id);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const profile::JobTelemetry>> jobs_ ABSL_GUARDED_BY(mu_);
  // Per job of more than kMaxLayerSeriesPerJob layers: the layers with series
  // of their own, chosen once (job_telemetry_collector.cc, BoundedLayers).
  mutable std::map<std::string, std::set<int>> kept_layers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::metrics

#endif  // TANDEM_SERVER_METRICS_JOB_TELEMETRY_COLLECTOR_H_
