// `tandem train FILE`: runs a job in this process, without a daemon.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/commands.h"
#include "clients/cli/progress.h"
#include "google/protobuf/util/time_util.h"
#include "node/placement.h"
#include "runtime/cuda/device_query.h"
#include "runtime/train/trainer.h"
#include "spec/job_spec.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "tandem train: write checkpoints here and resume from the newest one; empty = none.");
ABSL_FLAG(int, threads, 0,
          "tandem train, tandem profile: CPU threads (0 = all cores, or training.threads).");

ABSL_DECLARE_FLAG(std::string, trace_out);

namespace tandem::cli {

namespace {

// The trainer's options for a local run: a job with an accelerator (the
// node's GPU, or the emulated one) runs under the planner's plan through the
// plan executor, the host measured once for it (about half a second); CPU jobs
// go straight to the CPU engine.
constexpr int kAutoStagesAccelerators = 4;

TrainerOptions LocalTrainerOptions(const tandem::v1::JobSpec& spec) {
  TrainerOptions options;
  options.job_id = "local";
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : spec.training().threads();
  std::vector<cuda::CudaDeviceInfo> gpus = cuda::QueryCudaDevices();
  options.has_accelerator = !gpus.empty();
  const auto accelerator = spec.placement().accelerator();
  if (accelerator == tandem::v1::ACCELERATOR_KIND_EMULATED ||
      accelerator == tandem::v1::ACCELERATOR_KIND_CUDA ||
      (accelerator == tandem::v1::ACCELERATOR_KIND_UNSPECIFIED && options.has_accelerator) ||
      spec.placement().has_plan()) {
    node::NodeOffer offer = node::DetectNodeOffer(0, std::move(gpus));
    // A local run has as many emulated accelerators as its pipeline asks
    // for, and kAutoStagesAccelerators when it is to choose the stages.
    offer.emulated_accelerators = spec.placement().pipeline().auto_stages()
                                      ? kAutoStagesAccelerators
                                      : std::max(1, spec.placement().pipeline().stages());
    options.make_runner = node::MakeRunnerFactory(std::move(offer));
  }
  return options;
}

// The run as a Job record, as tandemd would report it.
tandem::v1::Job LocalJob(const tandem::v1::JobSpec& spec, const google::protobuf::Timestamp& start,
                         Trainer& trainer, const absl::Status& status) {
  tandem::v1::Job job;
  job.set_id("local");
  *job.mutable_spec() = spec;
  *job.mutable_create_time() = start;
  *job.mutable_start_time() = start;
  job.set_attempts(1);
  *job.mutable_resolved_spec() = trainer.resolved_spec();
  *job.mutable_progress() = trainer.progress();
  *job.mutable_metrics() = trainer.metrics();
  job.set_checkpoint_step(trainer.checkpoint_step());
  job.set_checkpoint_path(trainer.checkpoint_path());
  if (trainer.has_runner()) {
    *job.mutable_plan() = trainer.runner().plan();
    *job.mutable_measured_timeline() = trainer.runner().last_timeline();
  }
  *job.mutable_end_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  job.set_state(status.ok()                                     ? tandem::v1::JOB_STATE_SUCCEEDED
                : status.code() == absl::StatusCode::kCancelled ? tandem::v1::JOB_STATE_CANCELLED
                                                                : tandem::v1::JOB_STATE_FAILED);
  if (!status.ok()) job.set_reason(std::string(status.message()));
  return job;
}

// The closing lines of a text-mode run: outcome, plan and reason.
void PrintSummary(const tandem::v1::Job& job) {
  const auto& m = job.metrics();
  std::printf(
      "%s after %lld steps in %s: loss %.4f, test accuracy %.4f (loss %.4f), %.0f samples/s\n",
      tandem::v1::JobState_Name(job.state()).c_str(), static_cast<long long>(job.progress().step()),
      FormatDuration(m.train_seconds()).c_str(), m.loss(), m.eval_accuracy(), m.eval_loss(),
      m.mean_samples_per_second());
  if (job.plan().layers_size() > 0) {
    const tandem::v1::Plan& plan = job.plan();
    std::printf(
        "plan: %s, micro-batch %d x %d; step time predicted %.2f ms, measured %.2f ms; "
        "peak accelerator memory %.1f of %.1f MiB\n",
        tandem::v1::Strategy_Name(plan.strategy()).c_str(), plan.micro_batch_size(),
        plan.micro_batches(), m.predicted_step_seconds() * 1e3, m.measured_step_seconds() * 1e3,
        m.peak_accelerator_bytes() / 1048576.0,
        job.resolved_spec().resources().accelerator_memory_bytes() / 1048576.0);
  }
  const std::string updates = DescribeUpdates(m.updates());
  if (!updates.empty()) std::printf("updates: %s\n", updates.c_str());
  const std::string scaling = DescribeLossScaling(m);
  if (!scaling.empty()) std::printf("loss scaling: %s\n", scaling.c_str());
  for (const std::string& line : DescribePipeline(m)) {
    std::printf("pipeline: %s\n", line.c_str());
  }
  if (job.state() != tandem::v1::JOB_STATE_SUCCEEDED) {
    std::printf("reason: %s\n", job.reason().c_str());
  }
}

}  // namespace

absl::StatusOr<int> RunTrain(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem train FILE");
  absl::StatusOr<tandem::v1::JobSpec> spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return spec.status();
  const bool json = GetGlobals().json();
  // Progress goes to stderr with --output=json so stdout holds only the Job.
  FILE* out = json ? stderr : stdout;
  ProgressPrinter printer(out, ::isatty(::fileno(out)) != 0);
  TrainerCallbacks callbacks;
  callbacks.on_step = [&](const auto& p) { printer.Step(p); };
  callbacks.on_eval = [&](const auto& e) { printer.Eval(e); };
  callbacks.on_log = [&](auto severity, const std::string& m) { printer.Log(severity, m); };
  callbacks.on_checkpoint = [&](const auto& c) { printer.Checkpoint(c); };

  const auto start = google::protobuf::util::TimeUtil::GetCurrentTime();
  absl::StatusOr<std::unique_ptr<Trainer>> trainer =
      Trainer::Create(*spec, LocalTrainerOptions(*spec), callbacks);
  if (!trainer.ok()) return trainer.status();
  const absl::Status status = (*trainer)->Run();
  printer.Finish();
  const tandem::v1::Job job = LocalJob(*spec, start, **trainer, status);
  if (json) {
    std::printf("%s\n", ToJson(job).c_str());
  } else {
    PrintSummary(job);
  }
  if (!absl::GetFlag(FLAGS_trace_out).empty()) {
    if (absl::Status s = WriteJobTraces(job, absl::GetFlag(FLAGS_trace_out)); !s.ok()) return s;
  }
  return status.ok() ? 0 : 1;
}

}  // namespace tandem::cli
