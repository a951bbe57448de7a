// The job commands of the CLI: submit, jobs, status, watch, cancel.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "clients/cli/commands.h"
#include "clients/cli/progress.h"
#include "clients/cli/rpc_client.h"
#include "runtime/profile/chrome_trace.h"
#include "spec/job_spec.h"

ABSL_DECLARE_FLAG(std::string, trace_out);

ABSL_FLAG(bool, watch, false,
          "tandem submit: follow the job until it ends; exit with its outcome.");
ABSL_FLAG(std::string, request_id, "",
          "tandem submit: idempotency key; the same key and spec return the same job.");
ABSL_FLAG(std::string, state, "", "tandem jobs: only these states, e.g. QUEUED,RUNNING.");
ABSL_FLAG(int, limit, 50, "tandem jobs: at most this many jobs.");
ABSL_FLAG(int64_t, from, 1, "tandem watch: first event sequence to show.");
ABSL_FLAG(std::string, reason, "", "tandem cancel: recorded in the job's reason.");

namespace tandem::cli {

namespace {
constexpr char kUsagePayload[] = "tandem.cli/usage";
}  // namespace

absl::Status UsageError(absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kUsagePayload, absl::Cord("1"));
  return s;
}

bool IsUsageError(const absl::Status& status) {
  return status.GetPayload(kUsagePayload).has_value();
}

ClientOptions GlobalClientOptions() {
  const Globals& g = GetGlobals();
  return {.server = g.server, .token = g.token, .tls_root_certs = g.tls_root_certs};
}

namespace {

using tandem::v1::Job;
using tandem::v1::JobEvent;
using tandem::v1::JobState;

// Exit codes of `submit --watch` and `watch`: the job's outcome.
constexpr int kExitSucceeded = 0;
constexpr int kExitFailed = 1;
constexpr int kExitCancelled = 3;
constexpr int kExitLostContact = 4;

RpcClient Client() { return RpcClient(GlobalClientOptions()); }

std::string ShortState(JobState s) {
  return std::string(absl::StripPrefix(tandem::v1::JobState_Name(s), "JOB_STATE_"));
}

int ExitCodeFor(JobState s) {
  switch (s) {
    case tandem::v1::JOB_STATE_SUCCEEDED:
      return kExitSucceeded;
    case tandem::v1::JOB_STATE_CANCELLED:
      return kExitCancelled;
    default:
      return kExitFailed;
  }
}

bool Terminal(JobState s) {
  return s == tandem::v1::JOB_STATE_SUCCEEDED || s == tandem::v1::JOB_STATE_FAILED ||
         s == tandem::v1::JOB_STATE_CANCELLED;
}

// A distributed job's ranks, sharding and collectives (docs/distributed.md).
void PrintDistributed(const Job& job) {
  if (job.resolved_spec().distributed().replicas() <= 1) return;
  const tandem::v1::DistributedStats& d = job.metrics().distributed();
  std::printf(
      "  distributed: %d ranks, %s (%s)\n", job.resolved_spec().distributed().replicas(),
      tandem::v1::OptimizerSharding_Name(job.resolved_spec().distributed().sharding()).c_str(),
      job.distributed_reason().c_str());
  if (d.ranks() > 1) {
    std::string nodes;
    for (const std::string& n : d.nodes()) nodes += (nodes.empty() ? "" : ", ") + n;
    std::printf(
        "  collectives: %d buckets; latest step %.4f s of gradient reduction, %.4f s waited "
        "after backward, %.4f s other; %.1f MB sent in %.2f s this run; nodes %s\n",
        d.buckets(), d.step_gradient_seconds(), d.step_waited_seconds(), d.step_other_seconds(),
        d.collective_bytes() / 1e6, d.collective_seconds(), nodes.c_str());
    if (d.optimizer_elements() > 0) {
      std::printf("  optimizer state: rank 0 keeps %ld floats per moment on its host\n",
                  static_cast<long>(d.optimizer_elements()));
    }
    if (d.master_weight_elements() > 0) {
      std::printf("  master weights: rank 0 keeps %ld fp32 weights on its host\n",
                  static_cast<long>(d.master_weight_elements()));
    }
  }
}

// "REUSE_DISTANCE, micro-batch 4", or a pipeline's split: "2 stages,
// layers 0-3 | 4-10, 8 micro-batches".
std::string PlacedAs(const tandem::v1::Plan& plan) {
  if (plan.pipeline_size() <= 1) {
    return absl::StrCat(tandem::v1::Strategy_Name(plan.strategy()), ", micro-batch ",
                        plan.micro_batch_size());
  }
  std::vector<std::string> stages;
  for (const tandem::v1::PipelineStage& st : plan.pipeline()) {
    stages.push_back(absl::StrCat(st.first_layer(), "-", st.last_layer()));
  }
  return absl::StrCat(plan.pipeline_size(), " stages, layers ", absl::StrJoin(stages, " | "), ", ",
                      plan.micro_batches(), " micro-batches");
}

// Closed-loop planning: every plan the job ran under, and why it was replaced.
void PrintPlanHistory(const Job& job) {
  if (job.plan_history_size() <= 1) return;
  std::printf("  plans:\n");
  for (int i = 0; i < job.plan_history_size(); ++i) {
    const tandem::v1::PlanRecord& r = job.plan_history(i);
    std::printf("    %d. from step %ld: %s; predicted %.1f ms", i + 1,
                static_cast<long>(r.from_step()), PlacedAs(r.plan()).c_str(),
                r.predicted_step_seconds() * 1e3);
    if (r.measured_step_seconds() > 0) {
      std::printf(", measured %.1f ms", r.measured_step_seconds() * 1e3);
    }
    std::printf("\n");
    if (!r.cost_source().empty()) std::printf("       figures: %s\n", r.cost_source().c_str());
    if (r.replaced_at_step() > 0) {
      std::printf("       %s at step %ld: %s\n",
                  r.placement_changed() ? "replaced" : "re-calibrated",
                  static_cast<long>(r.replaced_at_step()), r.replaced_because().c_str());
    }
  }
}

void PrintJobText(const Job& job) {
  const auto& p = job.progress();
  const auto& m = job.metrics();
  std::printf("%s  %s%s\n", job.id().c_str(), ShortState(job.state()).c_str(),
              job.spec().display_name().empty() ? "" : ("  " + job.spec().display_name()).c_str());
  if (!job.reason().empty()) std::printf("  reason:    %s\n", job.reason().c_str());
  std::printf("  progress:  step %ld of %ld (%.1f%%), epoch %ld\n", static_cast<long>(p.step()),
              static_cast<long>(p.total_steps()), 100 * p.fraction(), static_cast<long>(p.epoch()));
  if (p.step() > 0) {
    std::printf("  training:  loss %.4f, %.0f samples/s, %.4f s/step\n", m.loss(),
                m.samples_per_second(), m.step_seconds());
  }
  if (m.eval_step() > 0) {
    std::printf("  eval:      accuracy %.4f, loss %.4f at step %ld\n", m.eval_accuracy(),
                m.eval_loss(), static_cast<long>(m.eval_step()));
  }
  const std::string updates = DescribeUpdates(m.updates());
  if (!updates.empty()) std::printf("  updates:   %s\n", updates.c_str());
  const std::string scaling = DescribeLossScaling(m);
  if (!scaling.empty()) std::printf("  loss scale: %s\n", scaling.c_str());
  for (const std::string& line : DescribePipeline(m)) {
    std::printf("  pipeline:  %s\n", line.c_str());
  }
  PrintDistributed(job);
  if (job.checkpoint_step() > 0) {
    std::printf("  checkpoint step %ld: %s\n", static_cast<long>(job.checkpoint_step()),
                job.checkpoint_path().c_str());
  }
  if (job.plan().layers_size() > 0) {
    const tandem::v1::Plan& plan = job.plan();
    std::printf("  plan:      %s, micro-batch %d x %d, accelerator budget %.1f MiB\n",
                tandem::v1::Strategy_Name(plan.strategy()).c_str(), plan.micro_batch_size(),
                plan.micro_batches(), plan.accelerator_memory_budget_bytes() / 1048576.0);
    std::printf("  step time: predicted %.2f ms", m.predicted_step_seconds() * 1e3);
    if (m.measured_step_seconds() > 0) {
      std::printf(", measured %.2f ms (%.2fx)", m.measured_step_seconds() * 1e3,
                  m.measured_step_seconds() / std::max(m.predicted_step_seconds(), 1e-12));
    }
    std::printf("\n");
  }
  PrintPlanHistory(job);
  if (job.schedule().ops_size() > 0) {
    int streams = 0;
    for (const auto& order : job.schedule().order()) streams += order.ops_size() > 0;
    std::printf("  program:   %d operations per step on %d resources (Job.schedule)\n",
                job.schedule().ops_size(), streams);
  }
  if (m.peak_accelerator_bytes() > 0) {
    std::printf("  memory:    peak host %.1f MiB, peak accelerator %.1f MiB\n",
                m.peak_host_bytes() / 1048576.0, m.peak_accelerator_bytes() / 1048576.0);
  }
  std::printf("  attempts:  %d\n", job.attempts());
}

// Follows a job's events from `from`, printing them; reconnects (resuming at
// the next sequence) when the daemon restarts. Returns the job's final state.
absl::StatusOr<JobState> Follow(const std::string& job_id, uint64_t from, bool json) {
  FILE* out = stdout;
  ProgressPrinter printer(out, !json && ::isatty(::fileno(out)) != 0);
  RpcClient client = Client();
  uint64_t next = from;
  JobState last = tandem::v1::JOB_STATE_UNSPECIFIED;
  const absl::Duration kReconnectFor = absl::Seconds(120);
  absl::Time lost_since = absl::InfiniteFuture();
  while (true) {
    tandem::v1::WatchJobRequest request;
    request.set_job_id(job_id);
    request.set_from_sequence(next);
    auto context = client.StreamContext();
    std::unique_ptr<grpc::ClientReader<JobEvent>> reader =
        client.stub().WatchJob(context.get(), request);
    JobEvent event;
    while (reader->Read(&event)) {
      lost_since = absl::InfiniteFuture();
      next = event.sequence() + 1;
      if (json) {
        std::printf("%s\n", ToJson(event).c_str());
        std::fflush(stdout);
      } else {
        switch (event.payload_case()) {
          case JobEvent::kStep:
            printer.Step(event.step());
            break;
          case JobEvent::kEval:
            printer.Eval(event.eval());
            break;
          case JobEvent::kLog:
            printer.Log(event.log().severity(), event.log().message());
            break;
          case JobEvent::kCheckpoint:
            printer.Checkpoint(event.checkpoint());
            break;
          case JobEvent::kStateChange:
            printer.State(event.state_change());
            break;
          default:
            break;
        }
      }
      if (event.has_state_change()) last = event.state_change().to();
    }
    const grpc::Status status = reader->Finish();
    printer.Finish();
    if (status.ok()) {
      if (Terminal(last)) return last;
      // The stream ended without a final state (a replay with follow off): ask.
      tandem::v1::GetJobRequest get;
      get.set_job_id(job_id);
      Job job;
      auto unary = client.UnaryContext();
      const grpc::Status s = client.stub().GetJob(unary.get(), get, &job);
      if (!s.ok()) return ToAbsl(s, GetGlobals().server);
      return job.state();
    }
    // UNAVAILABLE: the daemon went or drains; CANCELLED: a stopping daemon
    // cancels the streams opened during its drain (this client never does).
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::CANCELLED) {
      return ToAbsl(status, GetGlobals().server);
    }
    // The daemon went away (restart, upgrade): reconnect from where we were.
    if (lost_since == absl::InfiniteFuture()) {
      lost_since = absl::Now();
      std::fprintf(stderr, "tandem: lost the daemon (%s); reconnecting...\n",
                   status.error_message().c_str());
    }
    if (absl::Now() - lost_since > kReconnectFor) return ToAbsl(status, GetGlobals().server);
    absl::SleepFor(absl::Seconds(1));
  }
}

int WatchExit(const absl::StatusOr<JobState>& state) {
  if (!state.ok()) {
    std::fprintf(stderr, "tandem: %s\n", state.status().ToString().c_str());
    // Lost: an unknown job, or a daemon gone past the reconnect window. Any
    // other refusal (a malformed id, a wrong token) is a failed request.
    const absl::StatusCode code = state.status().code();
    return code == absl::StatusCode::kNotFound || code == absl::StatusCode::kUnavailable ||
                   code == absl::StatusCode::kCancelled
               ? kExitLostContact
               : 1;
  }
  std::fprintf(stderr, "job ended %s\n", ShortState(*state).c_str());
  return ExitCodeFor(*state);
}

}  // namespace

// Writes a job's measured timeline (and, beside it, the plan's predicted one)
// as Chrome trace JSON.
absl::Status WriteJobTraces(const Job& job, const std::string& path) {
  profile::ChromeTraceOptions options;
  for (const auto& layer : job.plan().layers()) options.layer_names.push_back(layer.name());
  options.accelerator_id =
      job.plan().pipeline_size() > 1
          ? absl::StrCat(job.plan().pipeline_size(), "-stage pipeline: stage k on lane k",
                         job.plan().accelerator() == tandem::v1::DEVICE_KIND_EMULATED
                             ? " (emulated, never a GPU figure)"
                             : "")
      : job.plan().accelerator() == tandem::v1::DEVICE_KIND_EMULATED
          ? "emulated:0 (never a GPU figure)"
      : job.plan().accelerator() == tandem::v1::DEVICE_KIND_CUDA ? "cuda:0"
                                                                 : "accelerator";
  options.title = absl::StrCat(job.id(), " measured");
  auto write = [](const std::string& file, const std::string& text) -> absl::Status {
    std::ofstream f(file);
    f << text;
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("--trace_out: cannot write '", file, "'"));
    return absl::OkStatus();
  };
  if (job.measured_timeline().spans_size() == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--trace_out: ", job.id(),
                     " has no measured timeline (it runs on the CPU engine, or has "
                     "not finished a step under its plan yet)"));
  }
  if (absl::Status s =
          write(path, profile::TimelineToChromeTrace(job.measured_timeline(), options));
      !s.ok()) {
    return s;
  }
  std::fprintf(stderr, "measured timeline: %s\n", path.c_str());
  if (job.plan().timeline().spans_size() > 0) {
    options.title = absl::StrCat(job.id(), " predicted");
    const std::string predicted = absl::StrCat(path, ".predicted.json");
    if (absl::Status s =
            write(predicted, profile::TimelineToChromeTrace(job.plan().timeline(), options));
        !s.ok()) {
      return s;
    }
    std::fprintf(stderr, "predicted timeline: %s\n", predicted.c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<int> RunSubmit(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem submit FILE [--watch]");
  absl::StatusOr<tandem::v1::JobSpec> spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return spec.status();
  RpcClient client = Client();
  tandem::v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  tandem::v1::SubmitJobResponse response;
  auto context = client.UnaryContext();
  const grpc::Status status = client.stub().SubmitJob(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  const bool json = GetGlobals().json();
  if (json && !absl::GetFlag(FLAGS_watch)) {
    std::printf("%s\n", ToJson(response.job()).c_str());
  } else {
    std::fprintf(
        json ? stderr : stdout, "%s %s%s\n",
        response.created() ? "submitted" : "already submitted as", response.job().id().c_str(),
        response.job().reason().empty() ? "" : (" (" + response.job().reason() + ")").c_str());
  }
  if (!absl::GetFlag(FLAGS_watch)) return 0;
  return WatchExit(Follow(response.job().id(), 1, json));
}

absl::StatusOr<int> RunWatch(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem watch ID [--from=N]");
  return WatchExit(
      Follow(args[0], static_cast<uint64_t>(absl::GetFlag(FLAGS_from)), GetGlobals().json()));
}

absl::StatusOr<int> RunStatus(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem status ID");
  RpcClient client = Client();
  tandem::v1::GetJobRequest request;
  request.set_job_id(args[0]);
  Job job;
  auto context = client.UnaryContext();
  const grpc::Status status = client.stub().GetJob(context.get(), request, &job);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  if (GetGlobals().json()) {
    std::printf("%s\n", ToJson(job).c_str());
  } else {
    PrintJobText(job);
  }
  if (!absl::GetFlag(FLAGS_trace_out).empty()) {
    if (absl::Status s = WriteJobTraces(job, absl::GetFlag(FLAGS_trace_out)); !s.ok()) return s;
  }
  return 0;
}

absl::StatusOr<int> RunJobs(const Args& args) {
  if (!args.empty()) return UsageError("usage: tandem jobs [--state=S1,S2] [--limit=N]");
  RpcClient client = Client();
  tandem::v1::ListJobsRequest request;
  request.set_page_size(std::min(1000, std::max(1, absl::GetFlag(FLAGS_limit))));
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_state), ',', absl::SkipEmpty())) {
    tandem::v1::JobState state;
    if (!tandem::v1::JobState_Parse(absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(name)),
                                    &state)) {
      return UsageError(absl::StrCat("--state: unknown state '", name, "'"));
    }
    request.add_states(state);
  }
  tandem::v1::ListJobsResponse response;
  auto context = client.UnaryContext();
  const grpc::Status status = client.stub().ListJobs(context.get(), request, &response);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  if (GetGlobals().json()) {
    std::printf("%s\n", ToJson(response).c_str());
    return 0;
  }
  std::printf("%-11s %-10s %-15s %-9s %-20s %s\n", "ID", "STATE", "STEP", "LOSS", "NAME", "REASON");
  for (const Job& job : response.jobs()) {
    std::printf(
        "%-11s %-10s %-15s %-9s %-20s %s\n", job.id().c_str(), ShortState(job.state()).c_str(),
        absl::StrFormat("%d/%d", job.progress().step(), job.progress().total_steps()).c_str(),
        job.progress().step() > 0 ? absl::StrFormat("%.4f", job.metrics().loss()).c_str() : "-",
        job.spec().display_name().substr(0, 20).c_str(), job.reason().c_str());
  }
  std::printf("%d of %ld jobs\n", response.jobs_size(), static_cast<long>(response.total_size()));
  return 0;
}

absl::StatusOr<int> RunCancel(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem cancel ID [--reason=TEXT]");
  RpcClient client = Client();
  tandem::v1::CancelJobRequest request;
  request.set_job_id(args[0]);
  request.set_reason(absl::GetFlag(FLAGS_reason));
  Job job;
  auto context = client.UnaryContext();
  const grpc::Status status = client.stub().CancelJob(context.get(), request, &job);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  if (GetGlobals().json()) {
    std::printf("%s\n", ToJson(job).c_str());
  } else {
    std::printf("%s %s: %s\n", job.id().c_str(), ShortState(job.state()).c_str(),
                job.reason().c_str());
  }
  return 0;
}

}  // namespace tandem::cli
