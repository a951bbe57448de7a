#include "server/server_metrics.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "prometheus/text_serializer.h"
#include "runtime/base/build_info.h"

namespace tandem::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// start, start*factor, ... (count of them).
prometheus::Histogram::BucketBoundaries ExponentialBuckets(double start, double factor, int count) {
  prometheus::Histogram::BucketBoundaries bounds;
  for (int i = 0; i < count; ++i, start *= factor) bounds.push_back(start);
  return bounds;
}

}  // namespace

ServerMetrics::ServerMetrics()
    : registry(std::make_shared<prometheus::Registry>()),
      job_telemetry(std::make_shared<metrics::JobTelemetryCollector>()),
      build_info(BuildGauge()
                     .Name("tandem_build_info")
                     .Help("Always 1; labels give the version and commit of this tandemd.")
                     .Register(*registry)),
      rpc_requests(BuildCounter()
                       .Name("tandem_rpc_requests_total")
                       .Help("RPCs answered, by method and gRPC status code.")
                       .Register(*registry)),
      rpc_duration(BuildHistogram()
                       .Name("tandem_rpc_duration_seconds")
                       .Help("RPC latency from arrival to status, by method and code.")
                       .Register(*registry)),
      jobs(BuildGauge()
               .Name("tandem_jobs")
               .Help("Jobs known to this daemon, by state.")
               .Register(*registry)),
      queue_length(BuildGauge()
                       .Name("tandem_job_queue_length")
                       .Help("Jobs waiting to run.")
                       .Register(*registry)),
      jobs_finished(BuildCounter()
                        .Name("tandem_jobs_finished_total")
                        .Help("Jobs that ended, by final state.")
                        .Register(*registry)),
      job_step_seconds(BuildGauge()
                           .Name("tandem_job_step_seconds")
                           .Help("Mean wall time of a training step over the latest window.")
                           .Register(*registry)),
      job_step_duration(BuildHistogram()
                            .Name("tandem_job_step_duration_seconds")
                            .Help("Wall time of each training step.")
                            .Register(*registry)),
      job_loss(BuildGauge()
                   .Name("tandem_job_loss")
                   .Help("Training loss of the latest step, in nats.")
                   .Register(*registry)),
      job_eval_accuracy(BuildGauge()
                            .Name("tandem_job_eval_accuracy_ratio")
                            .Help("Test accuracy of the latest evaluation.")
                            .Register(*registry)),
      job_samples_per_second(BuildGauge()
                                 .Name("tandem_job_samples_per_second")
                                 .Help("Training throughput over the latest window.")
                                 .Register(*registry)),
      job_progress(BuildGauge()
                       .Name("tandem_job_progress_ratio")
                       .Help("Steps completed over total steps.")
                       .Register(*registry)),
      job_steps(BuildCounter()
                    .Name("tandem_job_steps_total")
                    .Help("Optimizer steps completed by the job in this process.")
                    .Register(*registry)),
      job_predicted_step_seconds(BuildGauge()
                                     .Name("tandem_job_predicted_step_seconds")
                                     .Help("Step time the job's plan predicted.")
                                     .Register(*registry)),
      device_memory(BuildGauge()
                        .Name("tandem_device_memory_bytes")
                        .Help("Memory allocated by running jobs, by device and category.")
                        .Register(*registry)),
      device_memory_budget(BuildGauge()
                               .Name("tandem_device_memory_budget_bytes")
                               .Help("Memory all jobs together may use, by device.")
                               .Register(*registry)),
      device_memory_reserved(BuildGauge()
                                 .Name("tandem_device_memory_reserved_bytes")
                                 .Help("Memory reserved by admitted jobs, by device.")
                                 .Register(*registry)),
      process_cpu(BuildCounter()
                      .Name("tandem_process_cpu_seconds_total")
                      .Help("CPU time consumed by tandemd (user and system).")
                      .Register(*registry)),
      process_resident(BuildGauge()
                           .Name("tandem_process_resident_memory_bytes")
                           .Help("Resident set size of tandemd.")
                           .Register(*registry)),
      process_start_time(BuildGauge()
                             .Name("tandem_process_start_time_seconds")
                             .Help("Start time of tandemd since the Unix epoch.")
                             .Register(*registry)),
      rpc_duration_buckets(ExponentialBuckets(0.0001, 2.5, 14)),
      job_step_duration_buckets(ExponentialBuckets(0.001, 2, 16)) {
  build_info.Add({{"version", TandemVersion()}, {"commit", GitCommit()}}).Set(1);
  process_start_time.Add({}).Set(static_cast<double>(::time(nullptr)));
}

void ServerMetrics::SampleProcess() {
  absl::MutexLock lock(&sample_mu_);
  std::ifstream stat("/proc/self/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the parenthesised command: state is field 3; utime 14, stime 15.
  const size_t close = content.rfind(')');
  if (close != std::string::npos) {
    std::istringstream fields(content.substr(close + 2));
    std::string field;
    double utime = 0, stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stod(field);
      if (i == 15) stime = std::stod(field);
    }
    const double cpu = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
    process_cpu.Add({}).Increment(cpu - last_cpu_seconds_);
    last_cpu_seconds_ = cpu;
  }
  std::ifstream statm("/proc/self/statm");
  long pages_total = 0, pages_resident = 0;
  if (statm >> pages_total >> pages_resident) {
    process_resident.Add({}).Set(static_cast<double>(pages_resident) * sysconf(_SC_PAGESIZE));
  }
}

std::string ServerMetrics::Serialize() const {
  std::vector<prometheus::MetricFamily> families = registry->Collect();
  for (prometheus::MetricFamily& f : job_telemetry->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tandem::server
