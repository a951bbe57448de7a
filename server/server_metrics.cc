#include "server/server_metrics.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "base/build_info.h"
#include "prometheus/text_serializer.h"

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

// A metric family registered under `name` with `help`.
template <typename Builder>
auto& Family(Builder builder, const char* name, const char* help, prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

}  // namespace

ServerMetrics::ServerMetrics()
    : registry(std::make_shared<prometheus::Registry>()),
      job_telemetry(std::make_shared<metrics::JobTelemetryCollector>()),
      build_info(Family(BuildGauge(), "tandem_build_info",
                        "Always 1; labels give the version and commit of this tandemd.",
                        *registry)),
      rpc_requests(Family(BuildCounter(), "tandem_rpc_requests_total",
                          "RPCs answered, by method and gRPC status code.", *registry)),
      rpc_duration(Family(BuildHistogram(), "tandem_rpc_duration_seconds",
                          "RPC latency from arrival to status, by method and code.", *registry)),
      rpc_lane_requests(Family(BuildGauge(), "tandem_rpc_lane_requests",
                               "Expensive RPCs (profiles, plans, node refreshes) accepted on "
                               "their lane and not yet answered, queued or running, by lane.",
                               *registry)),
      jobs(Family(BuildGauge(), "tandem_jobs", "Jobs known to this daemon, by state.", *registry)),
      queue_length(
          Family(BuildGauge(), "tandem_job_queue_length", "Jobs waiting to run.", *registry)),
      jobs_finished(Family(BuildCounter(), "tandem_jobs_finished_total",
                           "Jobs that ended, by final state.", *registry)),
      job_step_seconds(Family(BuildGauge(), "tandem_job_step_seconds",
                              "Mean wall time of a training step over the latest window.",
                              *registry)),
      job_step_duration(Family(BuildHistogram(), "tandem_job_step_duration_seconds",
                               "Wall time of each training step.", *registry)),
      job_loss(Family(BuildGauge(), "tandem_job_loss", "Training loss of the latest step, in nats.",
                      *registry)),
      job_eval_accuracy(Family(BuildGauge(), "tandem_job_eval_accuracy_ratio",
                               "Test accuracy of the latest evaluation.", *registry)),
      job_samples_per_second(Family(BuildGauge(), "tandem_job_samples_per_second",
                                    "Training throughput over the latest window.", *registry)),
      job_progress(Family(BuildGauge(), "tandem_job_progress_ratio",
                          "Steps completed over total steps.", *registry)),
      job_steps(Family(BuildCounter(), "tandem_job_steps_total",
                       "Optimizer steps completed by the job in this process.", *registry)),
      job_predicted_step_seconds(Family(BuildGauge(), "tandem_job_predicted_step_seconds",
                                        "Step time the job's plan predicted.", *registry)),
      job_update_rule(Family(BuildGauge(), "tandem_job_update_rule_info",
                             "1 for the update rule the job runs (label rule).", *registry)),
      job_update_staleness(
          Family(BuildGauge(), "tandem_job_update_staleness",
                 "Versions a gradient lagged the weights it was applied to: mean and max (label "
                 "stat), parameter server and Hogwild.",
                 *registry)),
      job_pipeline_stage_seconds(
          Family(BuildGauge(), "tandem_job_pipeline_stage_seconds",
                 "A pipeline stage's latest step: busy (forward and backward), bubble (waiting "
                 "on a neighbour), copy (activations and gradients in and out) and update "
                 "seconds (label phase; docs/pipeline.md).",
                 *registry)),
      job_pipeline_stage_bytes(Family(BuildGauge(), "tandem_job_pipeline_stage_bytes",
                                      "A pipeline stage's device memory: its peak over the run "
                                      "and the planner's prediction (label kind).",
                                      *registry)),
      job_ranks(Family(BuildGauge(), "tandem_job_ranks",
                       "Ranks of a distributed job (docs/distributed.md).", *registry)),
      job_collective_bytes(
          Family(BuildGauge(), "tandem_job_collective_bytes",
                 "Bytes rank 0 of a distributed job has sent in collectives this run, counted "
                 "as bandwidth-optimal algorithms send them (an all-reduce of n bytes: "
                 "2(N-1)/N n).",
                 *registry)),
      job_collective_seconds(
          Family(BuildGauge(), "tandem_job_collective_seconds",
                 "Rank 0's collectives: the latest step's gradient reductions (step_gradient, "
                 "overlapped with backward), what the step waited on after its backward "
                 "(step_waited), the rest (step_other), and the run's total (label phase).",
                 *registry)),
      rank_collective_bytes(
          Family(BuildGauge(), "tandem_rank_collective_bytes",
                 "Bytes a rank this daemon runs for another daemon's distributed job has sent in "
                 "collectives this run (bus bytes; labels coordinator, job_id, rank).",
                 *registry)),
      rank_collective_seconds(
          Family(BuildGauge(), "tandem_rank_collective_seconds",
                 "That rank's collectives: the latest step's gradient reductions "
                 "(step_gradient), what its step waited on after its backward (step_waited: "
                 "waiting on the other ranks), the rest (step_other), the run's total.",
                 *registry)),
      job_update_lagged(Family(BuildGauge(), "tandem_job_update_lagged_updates",
                               "Updates whose gradient lagged `lag` versions: the staleness "
                               "distribution (parameter server, Hogwild).",
                               *registry)),
      job_update_wait_seconds(Family(BuildGauge(), "tandem_job_update_wait_seconds",
                                     "Seconds the parameter server's workers waited on each other "
                                     "(staleness bound, push order), summed.",
                                     *registry)),
      job_update_exchanges(Family(BuildGauge(), "tandem_job_update_exchanges",
                                  "EASGD exchanges with the centre variable.", *registry)),
      job_loss_scale(Family(BuildGauge(), "tandem_job_loss_scale",
                            "An fp16 job's dynamic loss scale: what its next step's loss "
                            "gradient is multiplied by.",
                            *registry)),
      job_skipped_steps(Family(BuildGauge(), "tandem_job_skipped_steps",
                               "An fp16 job's steps whose update was skipped because the "
                               "scaled gradients overflowed, since the job started.",
                               *registry)),
      job_checked_step_seconds(
          Family(BuildGauge(), "tandem_job_checked_step_seconds",
                 "Median step wall time of the job's latest plan check (closed-loop planning).",
                 *registry)),
      job_step_time_ratio(
          Family(BuildGauge(), "tandem_job_step_time_ratio",
                 "Measured over predicted step time at the job's latest plan check.", *registry)),
      replans(Family(BuildCounter(), "tandem_replans_total",
                     "Plans replaced by closed-loop planning, by reason (step_time, "
                     "resource_busy, slower) and whether the placement changed.",
                     *registry)),
      device_memory(Family(BuildGauge(), "tandem_device_memory_bytes",
                           "Memory allocated by running jobs, by device and category.", *registry)),
      device_memory_budget(Family(BuildGauge(), "tandem_device_memory_budget_bytes",
                                  "Memory all jobs together may use, by device.", *registry)),
      device_memory_reserved(Family(BuildGauge(), "tandem_device_memory_reserved_bytes",
                                    "Memory reserved by admitted jobs, by device.", *registry)),
      process_cpu(Family(BuildCounter(), "tandem_process_cpu_seconds_total",
                         "CPU time consumed by tandemd (user and system).", *registry)),
      process_resident(Family(BuildGauge(), "tandem_process_resident_memory_bytes",
                              "Resident set size of tandemd.", *registry)),
      process_start_time(Family(BuildGauge(), "tandem_process_start_time_seconds",
                                "Start time of tandemd since the Unix epoch.", *registry)),
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

namespace {
constexpr const char* kCollectivePhases[] = {"total", "step_gradient", "step_waited", "step_other"};

prometheus::Labels WithPhase(prometheus::Labels labels, const char* phase) {
  labels["phase"] = phase;
  return labels;
}
}  // namespace

void SetCollectiveSeries(prometheus::Family<prometheus::Gauge>& bytes,
                         prometheus::Family<prometheus::Gauge>& seconds,
                         const prometheus::Labels& labels,
                         const tandem::v1::DistributedStats& stats) {
  bytes.Add(labels).Set(static_cast<double>(stats.collective_bytes()));
  const double values[] = {stats.collective_seconds(), stats.step_gradient_seconds(),
                           stats.step_waited_seconds(), stats.step_other_seconds()};
  for (int i = 0; i < 4; ++i) seconds.Add(WithPhase(labels, kCollectivePhases[i])).Set(values[i]);
}

void RemoveCollectiveSeries(prometheus::Family<prometheus::Gauge>& bytes,
                            prometheus::Family<prometheus::Gauge>& seconds,
                            const prometheus::Labels& labels) {
  RemoveSeries(bytes, labels);
  for (const char* phase : kCollectivePhases) RemoveSeries(seconds, WithPhase(labels, phase));
}

}  // namespace tandem::server
