// Every metric tandemd exports, registered in one place so names, units and
// labels are consistent (prefix tandem_, base units, _total on counters; per-job
// series carry job_id, per-device series device). Thread-safe (see registry.h).
#ifndef TANDEM_SERVER_SERVER_METRICS_H_
#define TANDEM_SERVER_SERVER_METRICS_H_

#include <string>

#include "absl/synchronization/mutex.h"
#include "server/metrics/registry.h"

namespace tandem::server {

struct ServerMetrics {
  explicit ServerMetrics(metrics::Registry& registry);

  metrics::Registry& registry;
  metrics::Family<metrics::Gauge>& build_info;
  metrics::Family<metrics::Counter>& rpc_requests;
  metrics::Family<metrics::Histogram>& rpc_duration;
  metrics::Family<metrics::Gauge>& jobs;
  metrics::Family<metrics::Gauge>& queue_length;
  metrics::Family<metrics::Counter>& jobs_finished;
  metrics::Family<metrics::Gauge>& job_step_seconds;
  metrics::Family<metrics::Histogram>& job_step_duration;
  metrics::Family<metrics::Gauge>& job_loss;
  metrics::Family<metrics::Gauge>& job_eval_accuracy;
  metrics::Family<metrics::Gauge>& job_samples_per_second;
  metrics::Family<metrics::Gauge>& job_progress;
  metrics::Family<metrics::Counter>& job_steps;
  metrics::Family<metrics::Gauge>& job_predicted_step_seconds;
  metrics::Family<metrics::Histogram>& layer_step;
  metrics::Family<metrics::Gauge>& device_memory;
  metrics::Family<metrics::Gauge>& device_memory_budget;
  metrics::Family<metrics::Gauge>& device_memory_reserved;
  metrics::Family<metrics::Counter>& process_cpu;
  metrics::Family<metrics::Gauge>& process_resident;
  metrics::Family<metrics::Gauge>& process_start_time;

  // Samples process CPU time and RSS from /proc/self (call before a scrape).
  void SampleProcess();

 private:
  absl::Mutex sample_mu_;
  double last_cpu_seconds_ ABSL_GUARDED_BY(sample_mu_) = 0;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SERVER_METRICS_H_
