// Every metric tandemd exports, registered in one place so names, units and
// labels are consistent (prefix tandem_, base units, _total on counters; per-job
// series carry job_id, per-device series device). The families live in a
// prometheus-cpp Registry; the running jobs' per-layer and per-resource series
// come from `job_telemetry`, read at each scrape; the GPU's own gauges from
// NVML where it loads (nvml_collector.h). Updates are thread-safe
// (prometheus-cpp's metrics are).
#ifndef TANDEM_SERVER_SERVER_METRICS_H_
#define TANDEM_SERVER_SERVER_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics/job_telemetry_collector.h"
#include "tandem/v1/job.pb.h"

namespace tandem::server {

struct ServerMetrics {
  ServerMetrics();

  const std::shared_ptr<prometheus::Registry> registry;
  const std::shared_ptr<metrics::JobTelemetryCollector> job_telemetry;

  prometheus::Family<prometheus::Gauge>& build_info;
  prometheus::Family<prometheus::Counter>& rpc_requests;
  prometheus::Family<prometheus::Histogram>& rpc_duration;
  // The expensive RPCs' lanes (work_lane.h): requests queued or running, by lane.
  prometheus::Family<prometheus::Gauge>& rpc_lane_requests;
  prometheus::Family<prometheus::Gauge>& jobs;
  prometheus::Family<prometheus::Gauge>& queue_length;
  prometheus::Family<prometheus::Counter>& jobs_finished;
  prometheus::Family<prometheus::Gauge>& job_step_seconds;
  prometheus::Family<prometheus::Histogram>& job_step_duration;
  prometheus::Family<prometheus::Gauge>& job_loss;
  prometheus::Family<prometheus::Gauge>& job_eval_accuracy;
  prometheus::Family<prometheus::Gauge>& job_samples_per_second;
  prometheus::Family<prometheus::Gauge>& job_progress;
  prometheus::Family<prometheus::Counter>& job_steps;
  prometheus::Family<prometheus::Gauge>& job_predicted_step_seconds;
  // JobSpec.updates: the rule (an info gauge), staleness, waits and exchanges.
  prometheus::Family<prometheus::Gauge>& job_update_rule;
  prometheus::Family<prometheus::Gauge>& job_update_staleness;
  // Pipeline jobs, per stage (label stage): the latest step's busy, bubble,
  // copy and update seconds (label phase), and the peak against the plan.
  prometheus::Family<prometheus::Gauge>& job_pipeline_stage_seconds;
  prometheus::Family<prometheus::Gauge>& job_pipeline_stage_bytes;
  prometheus::Family<prometheus::Gauge>& job_ranks;
  prometheus::Family<prometheus::Gauge>& job_collective_bytes;
  prometheus::Family<prometheus::Gauge>& job_collective_seconds;
  // Ranks this daemon runs for distributed jobs coordinated elsewhere.
  prometheus::Family<prometheus::Gauge>& rank_collective_bytes;
  prometheus::Family<prometheus::Gauge>& rank_collective_seconds;
  prometheus::Family<prometheus::Gauge>& job_update_lagged;
  prometheus::Family<prometheus::Gauge>& job_update_wait_seconds;
  prometheus::Family<prometheus::Gauge>& job_update_exchanges;
  // PRECISION_FP16 jobs' dynamic loss scaling: the scale the next step uses,
  // and the steps whose update an overflow skipped.
  prometheus::Family<prometheus::Gauge>& job_loss_scale;
  prometheus::Family<prometheus::Gauge>& job_skipped_steps;
  prometheus::Family<prometheus::Gauge>& job_checked_step_seconds;
  prometheus::Family<prometheus::Gauge>& job_step_time_ratio;
  prometheus::Family<prometheus::Counter>& replans;
  prometheus::Family<prometheus::Gauge>& device_memory;
  prometheus::Family<prometheus::Gauge>& device_memory_budget;
  prometheus::Family<prometheus::Gauge>& device_memory_reserved;
  prometheus::Family<prometheus::Counter>& process_cpu;
  prometheus::Family<prometheus::Gauge>& process_resident;
  prometheus::Family<prometheus::Gauge>& process_start_time;

  // Bucket bounds of the histogram families, passed to each series' Add.
  const prometheus::Histogram::BucketBoundaries rpc_duration_buckets;
  const prometheus::Histogram::BucketBoundaries job_step_duration_buckets;

  // Samples process CPU time and RSS from /proc/self (call before a scrape).
  void SampleProcess();

  // The text exposition of the registry's families and the jobs' (tests; a
  // scrape serves these too, after the scrape hook and before NVML's).
  std::string Serialize() const;

 private:
  absl::Mutex sample_mu_;
  double last_cpu_seconds_ ABSL_GUARDED_BY(sample_mu_) = 0;
};

// Drops the series with exactly `labels` from `family`, if it has one.
// Histogram families pass their buckets (prometheus-cpp's Add needs them).
template <typename T, typename... Args>
void RemoveSeries(prometheus::Family<T>& family, const prometheus::Labels& labels, Args&&... args) {
  if (family.Has(labels)) family.Remove(&family.Add(labels, std::forward<Args>(args)...));
}

// A distributed job's (or rank's) collectives: `bytes` set to the bytes sent,
// `seconds` to each phase's seconds (label phase: total, step_gradient,
// step_waited, step_other), each series under `labels` (plus phase).
void SetCollectiveSeries(prometheus::Family<prometheus::Gauge>& bytes,
                         prometheus::Family<prometheus::Gauge>& seconds,
                         const prometheus::Labels& labels,
                         const tandem::v1::DistributedStats& stats);
// Drops the series SetCollectiveSeries set under `labels`.
void RemoveCollectiveSeries(prometheus::Family<prometheus::Gauge>& bytes,
                            prometheus::Family<prometheus::Gauge>& seconds,
                            const prometheus::Labels& labels);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SERVER_METRICS_H_
