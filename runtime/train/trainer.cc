#include "runtime/train/trainer.h"

#include <dirent.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "runtime/core/clock.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/job_model.h"
#include "runtime/train/partitioned_checkpoint.h"
#include "runtime/train/update_rules.h"
#include "spec/job_spec.h"
#include "spec/precision.h"

namespace tandem {
namespace {

using tandem::v1::JobEvent;
using tandem::v1::LogSeverity;

// Checkpoints kept: the newest and one before it, in case the newest is damaged.
constexpr int kCheckpointsKept = 2;

}  // namespace

absl::StatusOr<JobEvent::EvalResult> EvaluateSplit(StepRunner& runner, const Dataset& data,
                                                   int64_t batch_size) {
  BatchLoader loader(data, batch_size, /*shuffle=*/false, 0);
  EvalResult total;
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    TANDEM_ASSIGN_OR_RETURN(const EvalResult r, runner.EvalBatch(loader.Next()));
    total.loss_sum += r.loss_sum;
    total.correct += r.correct;
    total.positions += r.positions;
    total.samples += r.samples;
  }
  JobEvent::EvalResult result;
  result.set_loss(total.loss_sum / std::max<int64_t>(1, total.samples));
  result.set_accuracy(static_cast<double>(total.correct) / std::max<int64_t>(1, total.positions));
  result.set_samples(total.samples);
  return result;
}

Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const tandem::v1::JobSpec& spec,
                                                         TrainerOptions options,
                                                         TrainerCallbacks callbacks) {
  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = std::move(options);
  t->callbacks_ = std::move(callbacks);
  if (t->options_.spec_resolved) {
    t->resolved_ = spec;
  } else {
    TANDEM_ASSIGN_OR_RETURN(t->resolved_, ResolveJobSpec(spec, t->options_.has_accelerator));
    TANDEM_ASSIGN_OR_RETURN(
        const PrecisionChoice precision,
        ChoosePrecisionHere(t->resolved_.precision(), LocalComputeFor(t->resolved_), "precision"));
    t->resolved_.set_precision(precision.precision);
  }
  const auto& training = t->resolved_.training();
  // The job's threads, fixed before this thread's count changes below. A rule
  // with workers gives each a share, and the trainer's thread takes a
  // worker's share too (WorkerThreads says why); other rules keep them all.
  t->job_threads_ = t->options_.threads > 0 ? t->options_.threads : omp_get_max_threads();
  t->omp_threads_ = WorkerThreads(t->resolved_, t->job_threads_);
  omp_set_num_threads(t->omp_threads_);
  TANDEM_ASSIGN_OR_RETURN(
      t->data_, OpenDatasets(t->resolved_.data(), training.seed(), t->options_.resolve_path,
                             ModelContext(t->resolved_), t->options_.data_reserved_bytes));
  TANDEM_ASSIGN_OR_RETURN(t->model_, Model::Build(t->resolved_.model(), t->data_.train->info(),
                                                  ComputeDType(t->resolved_.precision())));
  *t->resolved_.mutable_model() = WithPresetDefaults(t->resolved_.model(), t->data_.train->info());

  t->host_allocator_ = t->options_.host_allocator;
  if (t->host_allocator_ == nullptr) {
    t->owned_allocator_ =
        std::make_unique<HostAllocator>(t->resolved_.resources().host_memory_bytes());
    t->host_allocator_ = t->owned_allocator_.get();
  }
  TANDEM_ASSIGN_OR_RETURN(t->runner_, t->MakeRunner(t->options_.make_runner));
  t->runner_->set_timing_sink(t->options_.timing_sink);
  t->partition_ = t->runner_->state_partition();
  t->metrics_.set_predicted_step_seconds(t->runner_->plan().prediction().iteration_seconds());
  t->loader_ = std::make_unique<BatchLoader>(*t->data_.train, training.batch_size(),
                                             t->resolved_.data().shuffle(), training.seed());
  t->total_steps_ = TotalSteps(t->resolved_, t->data_.train->size());
  t->progress_.set_total_steps(t->total_steps_);
  if (t->resolved_.precision() == tandem::v1::PRECISION_FP16) {
    t->loss_scaler_ = std::make_unique<LossScaler>(training.loss_scaling());
    t->metrics_.set_loss_scale(t->loss_scaler_->scale());
  }
  TANDEM_RETURN_IF_ERROR(t->SetUpSwa());
  if (!t->options_.checkpoint_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(t->options_.checkpoint_dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create checkpoint directory '",
                                              t->options_.checkpoint_dir, "': ", ec.message()));
    }
    if (t->options_.resume) TANDEM_RETURN_IF_ERROR(t->LoadNewestCheckpoint());
    TANDEM_RETURN_IF_ERROR(t->SynchronizeStart());
  }
  t->Log(tandem::v1::LOG_SEVERITY_INFO,
         absl::StrCat("model ", t->model_->fingerprint().substr(0, 12), ": ",
                      t->model_->num_layers(), " layers, ", t->model_->parameter_count(),
                      " parameters; data ", t->data_.train->Describe()));
  for (const std::string& w : t->runner_->warnings()) t->Log(tandem::v1::LOG_SEVERITY_WARNING, w);
  return t;
}

void Trainer::Log(LogSeverity severity, const std::string& message) {
  if (callbacks_.on_log) callbacks_.on_log(severity, message);
}

absl::Status Trainer::SynchronizeStart() {
  StartPoint p{.step = step_,
               .samples = samples_,
               .epoch = loader_->epoch(),
               .epoch_offset = loader_->offset(),
               .optimizer_step = runner_->host_state().optimizer->step()};
  TANDEM_ASSIGN_OR_RETURN(const bool changed, runner_->SynchronizeStart(&p));
  if (partition_ && p.step > 0) {
    // Every rank starts at the manifest's step; each takes its own pieces of
    // the optimizer state from its partition.
    TANDEM_ASSIGN_OR_RETURN(
        const std::string path,
        LoadOwnPartition(*runner_, *partition_, options_.checkpoint_dir, p.step,
                         model_->fingerprint(), resumed_manifest_ ? &*resumed_manifest_ : nullptr));
    TANDEM_RETURN_IF_ERROR(runner_->StateChangedOnHost());
    if (partition_->rank != 0) {
      checkpoint_path_ = path;
      checkpoint_step_ = p.step;
    }
  }
  if (!changed) return absl::OkStatus();
  step_ = p.step;
  samples_ = p.samples;
  loader_->Seek(p.epoch, p.epoch_offset);
  runner_->host_state().optimizer->set_step(p.optimizer_step);
  RecordPosition();
  if (step_ > 0) {
    Log(tandem::v1::LOG_SEVERITY_INFO,
        absl::StrCat("starting at rank 0's step ", step_, ", with its state"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadNewestCheckpoint() {
  if (partition_) return LoadNewestManifest();
  const std::vector<NamedTensor> tensors = StateTensors(runner_->host_state(), true);
  for (const auto& [step, path] : ListCheckpoints(options_.checkpoint_dir, kCheckpointSuffix)) {
    absl::StatusOr<tandem::v1::CheckpointHeader> header =
        ReadCheckpoint(path, model_->fingerprint(), tensors);
    if (!header.ok()) {
      // A damaged newest checkpoint falls back to the previous one.
      Log(tandem::v1::LOG_SEVERITY_WARNING,
          absl::StrCat("skipping checkpoint: ", header.status().message()));
      if (header.status().code() == absl::StatusCode::kFailedPrecondition) return header.status();
      continue;
    }
    return Resume(*header, path);
  }
  return absl::OkStatus();
}

absl::Status Trainer::LoadNewestManifest() {
  TANDEM_ASSIGN_OR_RETURN(
      std::optional<LoadedManifest> loaded,
      tandem::LoadNewestManifest(
          options_.checkpoint_dir, model_->fingerprint(), *partition_,
          StateTensors(runner_->host_state(), false), [this](const std::string& why) {
            Log(tandem::v1::LOG_SEVERITY_WARNING, absl::StrCat("skipping checkpoint: ", why));
          }));
  if (!loaded) return absl::OkStatus();
  resumed_manifest_ = std::move(loaded->manifest);
  // The partition was read into the runner's host memory; Resume pushes it
  // to where the state lives (an accelerator rank's weights and moments).
  return Resume(loaded->header, loaded->path);
}

void Trainer::RecordPosition() {
  progress_.set_step(step_);
  progress_.set_epoch(step_ / std::max<int64_t>(1, loader_->batches_per_epoch()));
  progress_.set_samples(samples_);
  progress_.set_fraction(
      total_steps_ > 0 ? static_cast<double>(step_) / static_cast<double>(total_steps_) : 0.0);
}

absl::Status Trainer::Resume(const tandem::v1::CheckpointHeader& header, const std::string& path) {
  HostStateView state = runner_->host_state();
  step_ = header.step();
  samples_ = header.samples();
  state.optimizer->set_step(header.optimizer_step());
  if (loss_scaler_ != nullptr && header.loss_scale() > 0) {
    loss_scaler_->Restore(header.loss_scale(), header.loss_scale_good_steps(),
                          header.skipped_steps(), header.loss_scale_consecutive_skips());
    metrics_.set_loss_scale(loss_scaler_->scale());
    metrics_.set_skipped_steps(loss_scaler_->skipped_steps());
  }
  loader_->Seek(header.epoch(), header.epoch_offset());
  TANDEM_RETURN_IF_ERROR(runner_->StateChangedOnHost());
  checkpoint_path_ = path;
  checkpoint_step_ = step_;
  RecordPosition();
  LoadSwa();
  Log(tandem::v1::LOG_SEVERITY_INFO,
      absl::StrCat("resumed from checkpoint at step ", step_, " (", path, ")"));
  return absl::OkStatus();
}

std::vector<NamedTensor> Trainer::StateTensors(const HostStateView& state, bool moments) const {
  std::vector<NamedTensor> tensors = {{"parameters", state.params, model_->parameter_elements()},
                                      {"buffers", state.buffers, model_->buffer_elements()}};
  for (size_t i = 0; moments && i < state.moments.size(); ++i) {
    tensors.push_back(
        {absl::StrCat("optimizer.", i), state.moments[i], model_->parameter_elements()});
  }
  return tensors;
}

tandem::v1::CheckpointHeader Trainer::CheckpointHeaderNow() {
  tandem::v1::CheckpointHeader header;
  header.set_job_id(options_.job_id);
  header.set_model_fingerprint(model_->fingerprint());
  header.set_step(step_);
  header.set_epoch(loader_->epoch());
  header.set_epoch_offset(loader_->offset());
  header.set_samples(samples_);
  header.set_optimizer_step(runner_->host_state().optimizer->step());
  if (loss_scaler_ != nullptr) {
    header.set_loss_scale(loss_scaler_->scale());
    header.set_loss_scale_good_steps(loss_scaler_->good_steps());
    header.set_skipped_steps(loss_scaler_->skipped_steps());
    header.set_loss_scale_consecutive_skips(loss_scaler_->consecutive_skips());
  }
  *header.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  return header;
}

absl::Status Trainer::SaveCheckpoint() {
  if (options_.checkpoint_dir.empty()) return absl::OkStatus();
  SavedPartitions saved;
  TANDEM_RETURN_IF_ERROR(runner_->SyncStateToHost());
  if (partition_) {
    // Each rank writes its own pieces; rank 0 commits the manifest.
    TANDEM_ASSIGN_OR_RETURN(
        saved,
        SavePartitioned(*runner_, *partition_, options_.checkpoint_dir, CheckpointHeaderNow(),
                        StateTensors(runner_->host_state(), false),
                        options_.rank_nodes ? *options_.rank_nodes : std::vector<std::string>{},
                        kCheckpointsKept));
    TANDEM_RETURN_IF_ERROR(SaveSwa());
  } else {
    const std::vector<NamedTensor> tensors = StateTensors(runner_->host_state(), true);
    saved.path = CheckpointPath(options_.checkpoint_dir, step_, kCheckpointSuffix);
    TANDEM_ASSIGN_OR_RETURN(const CheckpointFile file,
                            WriteCheckpoint(saved.path, CheckpointHeaderNow(), tensors));
    saved.bytes = file.bytes;
    TANDEM_RETURN_IF_ERROR(SaveSwa());
    // The newest kCheckpointsKept, none past this step (RemoveCheckpointsAfter).
    RemoveCheckpointsAfter(options_.checkpoint_dir, step_);
    const auto all = ListCheckpoints(options_.checkpoint_dir, kCheckpointSuffix);
    for (size_t i = kCheckpointsKept; i < all.size(); ++i) {
      RemoveCheckpointStep(options_.checkpoint_dir, all[i].first);
    }
  }
  checkpoint_path_ = saved.path;
  checkpoint_step_ = step_;
  if (callbacks_.on_checkpoint) {
    JobEvent::CheckpointSaved event;
    event.set_step(step_);
    event.set_path(saved.path);
    event.set_bytes(saved.bytes);
    callbacks_.on_checkpoint(event);
  }
  return absl::OkStatus();
}

absl::StatusOr<JobEvent::EvalResult> Trainer::Evaluate() {
  JobEvent::EvalResult result;
  result.set_step(step_);
  if (data_.test == nullptr) return result;
  TANDEM_ASSIGN_OR_RETURN(
      result, EvaluateSplit(*runner_, *data_.test, resolved_.training().eval_batch_size()));
  result.set_step(step_);
  metrics_.set_eval_loss(result.loss());
  metrics_.set_eval_accuracy(result.accuracy());
  metrics_.set_eval_step(step_);
  if (callbacks_.on_eval) callbacks_.on_eval(result);
  return result;
}

absl::StatusOr<StepResult> Trainer::TrainStep(const Batch& batch, const StepOptions& options,
                                              double last_loss) {
  absl::StatusOr<StepResult> result = runner_->TrainStep(batch, options);
  if (!result.ok()) {
    return absl::Status(result.status().code(),
                        absl::StrCat("step ", step_ + 1, ": ", result.status().message()));
  }
  // Under loss scaling a step whose fp16 forward overflowed has no finite
  // gradient either: it is skipped like any overflow, and a model that keeps
  // overflowing ends at max_consecutive_skips with the scaler's reason.
  const bool scaled_overflow = loss_scaler_ != nullptr && result->skipped;
  if (!std::isfinite(result->loss) && !scaled_overflow) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "loss became %s at step %d (learning rate %g, previous loss %g): training diverged; "
        "lower optimizer.learning_rate or set optimizer.max_grad_norm",
        std::isnan(result->loss) ? "NaN" : "infinite", step_ + 1, options.learning_rate,
        last_loss));
  }
  if (loss_scaler_ == nullptr) {
    if (result->skipped) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the gradients became non-finite at step %d (learning rate %g, loss %g): training "
          "diverged; lower optimizer.learning_rate",
          step_ + 1, options.learning_rate, result->loss));
    }
    return result;
  }
  if (result->skipped) {
    Log(tandem::v1::LOG_SEVERITY_INFO,
        absl::StrFormat("step %d: the fp16 gradients overflowed at loss scale %g; update "
                        "skipped, the scale halved",
                        step_ + 1, loss_scaler_->scale()));
  }
  TANDEM_RETURN_IF_ERROR(loss_scaler_->Update(result->skipped));
  metrics_.set_loss_scale(loss_scaler_->scale());
  metrics_.set_skipped_steps(loss_scaler_->skipped_steps());
  return result;
}

void Trainer::RecordStep(const StepResult& result, const StepOptions& options, int64_t samples,
                         double step_seconds, RunClock& clock) {
  ++step_;
  samples_ += samples;
  clock.run_samples += samples;
  ++clock.run_steps;
  clock.run_step_seconds += step_seconds;
  if (clock.run_steps > clock.steady_after) {
    ++clock.steady_steps;
    clock.steady_step_seconds += step_seconds;
  }
  ++clock.window_steps;
  clock.window_samples += samples;
  clock.window_step_seconds += step_seconds;

  const double now = WallSeconds();
  metrics_.set_loss(result.loss);
  RecordPosition();
  if (step_ % resolved_.training().log_interval_steps() == 0 || step_ == total_steps_) {
    const double window = std::max(now - clock.window_start, 1e-9);
    const double steps = static_cast<double>(clock.window_steps);
    metrics_.set_samples_per_second(static_cast<double>(clock.window_samples) / window);
    metrics_.set_step_seconds(clock.window_step_seconds / steps);
    // What is left at the window's pace, evaluations and checkpoints included.
    progress_.set_eta_seconds(window / steps * static_cast<double>(total_steps_ - step_));
    RecordUpdateStats();
    if (callbacks_.on_step) {
      JobEvent::StepProgress p;
      p.set_step(step_);
      p.set_total_steps(total_steps_);
      p.set_loss(result.loss);
      p.set_samples_per_second(metrics_.samples_per_second());
      p.set_step_seconds(step_seconds);
      p.set_window_step_seconds(metrics_.step_seconds());
      p.set_learning_rate(options.learning_rate);
      p.set_grad_norm(result.grad_norm);
      if (loss_scaler_ != nullptr) {
        p.set_loss_scale(options.loss_scale);
        p.set_skipped_steps(metrics_.skipped_steps());
      }
      p.set_eta_seconds(progress_.eta_seconds());
      p.set_epoch(progress_.epoch());
      *p.mutable_updates() = metrics_.updates();
      *p.mutable_pipeline_stages() = metrics_.pipeline_stages();
      callbacks_.on_step(p);
    }
    clock.window_start = now;
    clock.window_steps = 0;
    clock.window_samples = 0;
    clock.window_step_seconds = 0;
  }
  metrics_.set_train_seconds(now - clock.run_start);
  metrics_.set_mean_samples_per_second(static_cast<double>(clock.run_samples) /
                                       std::max(now - clock.run_start, 1e-9));
  metrics_.set_measured_step_seconds(
      clock.steady_steps > 0 ? clock.steady_step_seconds / static_cast<double>(clock.steady_steps)
                             : clock.run_step_seconds / static_cast<double>(clock.run_steps));
}

absl::Status Trainer::AfterStep() {
  const auto& training = resolved_.training();
  if (step_ >= total_steps_) return absl::OkStatus();
  if (training.eval_interval_steps() > 0 && step_ % training.eval_interval_steps() == 0) {
    TANDEM_RETURN_IF_ERROR(Evaluate().status());
  }
  if (!training.checkpoint_disabled() && training.checkpoint_interval_steps() > 0 &&
      step_ % training.checkpoint_interval_steps() == 0) {
    TANDEM_RETURN_IF_ERROR(SaveCheckpoint());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StepRunner>> Trainer::MakeRunner(const RunnerFactory& make) const {
  const int64_t max_batch = MaxBatch(resolved_);
  const bool accelerated =
      resolved_.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE &&
      resolved_.placement().strategy() != tandem::v1::STRATEGY_CPU_ONLY;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<StepRunner> rule,
                          MakeUpdateRuleRunner(*model_, resolved_, max_batch, host_allocator_,
                                               job_threads_, accelerated ? make : RunnerFactory()));
  if (rule) return rule;
  if (make) return make(*model_, resolved_, max_batch, host_allocator_);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> cpu,
                          CpuRunner::Create(*model_, resolved_.optimizer(), max_batch,
                                            resolved_.training().seed(), host_allocator_));
  return std::unique_ptr<StepRunner>(std::move(cpu));
}

void Trainer::set_timing_sink(LayerTimingSink* sink) {
  options_.timing_sink = sink;
  runner_->set_timing_sink(sink);
}

absl::Status Trainer::SwitchRunner(const RunnerFactory& make, RunClock& clock) {
  if (options_.checkpoint_dir.empty() || partition_) {
    const absl::Status refused = absl::FailedPreconditionError(
        partition_ ? "a ZeRO-partitioned rank does not switch runners (its ranks would have to "
                     "switch together); going on under the current one"
                   : "switching runners needs a checkpoint directory; going on under the "
                     "current one");
    if (callbacks_.on_switch) callbacks_.on_switch(refused);
    return absl::OkStatus();
  }
  TANDEM_RETURN_IF_ERROR(SaveCheckpoint());
  // The old runner's memory goes back before the new one takes any.
  runner_.reset();
  absl::StatusOr<std::unique_ptr<StepRunner>> next = MakeRunner(make);
  const absl::Status made = next.status();
  if (!next.ok()) {
    Log(tandem::v1::LOG_SEVERITY_WARNING,
        absl::StrCat("cannot switch runners at step ", step_, ": ", made.message(),
                     "; going on under the previous one"));
    next = MakeRunner(options_.make_runner);
    if (!next.ok()) {
      return absl::Status(
          next.status().code(),
          absl::StrCat("cannot switch runners at step ", step_, " (", made.message(),
                       ") nor make the previous one again: ", next.status().message()));
    }
  } else {
    options_.make_runner = make;  // a resume after a failed step makes this one
  }
  runner_ = *std::move(next);
  runner_->set_timing_sink(options_.timing_sink);
  for (const std::string& w : runner_->warnings()) Log(tandem::v1::LOG_SEVERITY_WARNING, w);
  metrics_.set_predicted_step_seconds(runner_->plan().prediction().iteration_seconds());
  // Exactly the state the previous runner left: the checkpoint just written,
  // not the newest readable one (were it unreadable, an older one would
  // rewind the run, and none would leave the new runner at its initial
  // weights while the step count went on).
  TANDEM_ASSIGN_OR_RETURN(const tandem::v1::CheckpointHeader saved,
                          ReadCheckpoint(checkpoint_path_, model_->fingerprint(),
                                         StateTensors(runner_->host_state(), true)));
  TANDEM_RETURN_IF_ERROR(Resume(saved, checkpoint_path_));
  clock.steady_after = clock.run_steps + kWarmupSteps;
  clock.steady_steps = 0;
  clock.steady_step_seconds = 0;
  if (callbacks_.on_switch) callbacks_.on_switch(made);
  return absl::OkStatus();
}

absl::Status Trainer::SetUpSwa() {
  if (!resolved_.updates().has_swa()) return absl::OkStatus();
  auto* swa = resolved_.mutable_updates()->mutable_swa();
  if (swa->start_step() == 0) swa->set_start_step(std::max<int64_t>(1, total_steps_ * 3 / 4));
  if (swa->start_step() > total_steps_) {
    return absl::InvalidArgumentError(absl::StrCat("updates.swa.start_step: ", swa->start_step(),
                                                   " is after the run's last step (", total_steps_,
                                                   " steps): nothing would be averaged"));
  }
  TANDEM_ASSIGN_OR_RETURN(swa_, SwaAverager::Create(model_->parameter_elements(), host_allocator_));
  return absl::OkStatus();
}

absl::Status Trainer::FoldSwa() {
  if (swa_ == nullptr) return absl::OkStatus();
  const auto& swa = resolved_.updates().swa();
  if (step_ < swa.start_step() || (step_ - swa.start_step()) % swa.period() != 0) {
    return absl::OkStatus();
  }
  TANDEM_RETURN_IF_ERROR(runner_->SyncStateToHost());
  swa_->Fold(runner_->host_state().params);
  return absl::OkStatus();
}

absl::Status Trainer::SaveSwa() {
  if (swa_ == nullptr) return absl::OkStatus();
  swa_->Wait();
  if (swa_->models() == 0) return absl::OkStatus();
  tandem::v1::CheckpointHeader header;
  header.set_job_id(options_.job_id);
  header.set_model_fingerprint(model_->fingerprint());
  header.set_step(step_);
  header.set_averaged_models(swa_->models());
  *header.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  return WriteCheckpoint(SwaPath(options_.checkpoint_dir, step_), header,
                         {{"swa.parameters", swa_->average(), model_->parameter_elements()}})
      .status();
}

void Trainer::LoadSwa() {
  if (swa_ == nullptr) return;
  const std::string path = SwaPath(options_.checkpoint_dir, step_);
  if (!std::filesystem::exists(path)) {
    swa_->Wait();
    swa_->Restore(0);
    if (step_ >= resolved_.updates().swa().start_step()) {
      Log(tandem::v1::LOG_SEVERITY_WARNING,
          absl::StrCat("SWA has no average for the checkpoint of step ", step_, " (", path,
                       "); averaging starts again"));
    }
    return;
  }
  swa_->Wait();
  absl::StatusOr<tandem::v1::CheckpointHeader> header =
      ReadCheckpoint(path, model_->fingerprint(),
                     {{"swa.parameters", swa_->average(), model_->parameter_elements()}});
  if (header.ok() && header->step() == step_) {
    swa_->Restore(header->averaged_models());
    return;
  }
  swa_->Restore(0);
  Log(tandem::v1::LOG_SEVERITY_WARNING,
      header.ok() ? absl::StrCat("SWA's average (", path, ") is of step ", header->step(),
                                 ", not the checkpoint's ", step_, "; averaging starts again")
                  : absl::StrCat("SWA's average is unreadable (", header.status().message(),
                                 "); averaging starts again"));
}

absl::Status Trainer::EvaluateSwa() {
  if (swa_ == nullptr) return absl::OkStatus();
  swa_->Wait();
  if (swa_->models() == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(runner_->SyncStateToHost());
  TANDEM_ASSIGN_OR_RETURN(const JobEvent::EvalResult r,
                          swa_->Evaluate(*model_, resolved_, runner_->host_state().buffers,
                                         *data_.train, data_.test.get(), host_allocator_));
  auto* stats = metrics_.mutable_updates();
  stats->set_swa_models(swa_->models());
  stats->set_swa_eval_loss(r.loss());
  stats->set_swa_eval_accuracy(r.accuracy());
  Log(tandem::v1::LOG_SEVERITY_INFO,
      absl::StrFormat("SWA: the average of %d models (from step %d, every %d): accuracy %.4f, "
                      "loss %.4f; the last iterate: accuracy %.4f, loss %.4f",
                      swa_->models(), resolved_.updates().swa().start_step(),
                      resolved_.updates().swa().period(), r.accuracy(), r.loss(),
                      metrics_.eval_accuracy(), metrics_.eval_loss()));
  return absl::OkStatus();
}

void Trainer::RecordUpdateStats() {
  const std::vector<tandem::v1::PipelineStageStats> stages = runner_->pipeline_stats();
  metrics_.clear_pipeline_stages();
  for (const tandem::v1::PipelineStageStats& s : stages) *metrics_.add_pipeline_stages() = s;
  tandem::v1::UpdateStats stats = runner_->update_stats();
  if (stats.rule().empty()) {
    // Synchronous updates: each gradient lands on the weights it was
    // computed on, lag 0.
    stats.set_rule(swa_ != nullptr ? "swa" : "synchronous");
    stats.set_updates(step_);
    if (step_ > 0) stats.add_staleness_counts(step_);
  }
  const auto& old = metrics_.updates();
  if (swa_ != nullptr) {
    stats.set_swa_models(swa_->models());
    stats.set_swa_eval_loss(old.swa_eval_loss());
    stats.set_swa_eval_accuracy(old.swa_eval_accuracy());
  }
  *metrics_.mutable_updates() = stats;
}

absl::Status Trainer::Run() {
  omp_set_num_threads(omp_threads_);
  RunClock clock;
  clock.run_start = clock.window_start = WallSeconds();
  double last_loss = 0;
  while (step_ < total_steps_) {
    if (callbacks_.should_stop && callbacks_.should_stop()) {
      TANDEM_RETURN_IF_ERROR(SaveCheckpoint());
      return absl::CancelledError(absl::StrCat("stopped at step ", step_, " of ", total_steps_));
    }
    if (callbacks_.switch_runner) {
      if (RunnerFactory next = callbacks_.switch_runner()) {
        TANDEM_RETURN_IF_ERROR(SwitchRunner(next, clock));
      }
    }
    const Batch& batch = loader_->Next();
    StepOptions options;
    options.step = step_;
    options.seed = resolved_.training().seed();
    options.learning_rate = runner_->host_state().optimizer->LearningRate(step_, total_steps_);
    if (loss_scaler_ != nullptr) options.loss_scale = static_cast<float>(loss_scaler_->scale());
    const double step_start = WallSeconds();
    TANDEM_ASSIGN_OR_RETURN(const StepResult result, TrainStep(batch, options, last_loss));
    last_loss = result.loss;
    const double step_seconds = WallSeconds() - step_start;
    RecordStep(result, options, batch.size, step_seconds, clock);
    TANDEM_RETURN_IF_ERROR(FoldSwa());
    if (callbacks_.after_step) callbacks_.after_step(step_, step_seconds, *runner_);
    TANDEM_RETURN_IF_ERROR(AfterStep());
  }
  // Every batch in flight finished (asynchronous rules) before anything is
  // read or reported, with or without a test split or checkpoints.
  TANDEM_RETURN_IF_ERROR(runner_->SyncStateToHost());
  TANDEM_RETURN_IF_ERROR(Evaluate().status());
  TANDEM_RETURN_IF_ERROR(EvaluateSwa());
  if (!resolved_.training().checkpoint_disabled()) TANDEM_RETURN_IF_ERROR(SaveCheckpoint());
  RecordUpdateStats();
  metrics_.set_peak_host_bytes(runner_->peak_host_bytes());
  metrics_.set_peak_accelerator_bytes(runner_->peak_accelerator_bytes());
  progress_.set_eta_seconds(0);
  return absl::OkStatus();
}

}  // namespace tandem
