// The training loop of one job, used in-process by `tandem train` and by tandemd:
// builds the model and data from a JobSpec, runs steps through a StepRunner
// (the CPU engine, or the hybrid executor when a factory is given), evaluates on
// the test split, checkpoints atomically and resumes exactly (the same batches,
// dropout masks and optimizer state as an uninterrupted run), and stops with a
// clear error when the loss stops being finite. Progress flows out through
// callbacks. Run() is driven by one thread; the callbacks run on it.
#ifndef TANDEM_RUNTIME_TRAIN_TRAINER_H_
#define TANDEM_RUNTIME_TRAIN_TRAINER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"
#include "runtime/exec/step_runner.h"
#include "runtime/model/model.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/loss_scaler.h"
#include "tandem/v1/checkpoint.pb.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

using RunnerFactory = std::function<absl::StatusOr<std::unique_ptr<StepRunner>>(
    const Model& model, const tandem::v1::JobSpec& resolved, int64_t max_batch,
    Allocator* host_allocator)>;

struct TrainerOptions {
  std::string job_id;
  // Where checkpoints go; empty = none.
  std::string checkpoint_dir;
  // Continue from the newest valid checkpoint in checkpoint_dir, if any.
  bool resume = true;
  // Maps dataset paths (e.g. confines them to --data_root); null = as written.
  PathResolver resolve_path;
  // What the job reserved for its dataset files (the daemon's estimate at
  // submission); files that now declare more are refused before being read.
  // Unset: nothing was reserved (tandem train on its own machine).
  std::optional<int64_t> data_reserved_bytes;
  // Whether the node has an accelerator (decides an unspecified strategy).
  bool has_accelerator = false;
  // The spec is ResolveJobSpec's output already (the daemon resolves a job
  // once, at submission, and stores it): used as it is, not resolved again.
  bool spec_resolved = false;
  // OpenMP threads for the job's compute; 0 = the process default.
  int threads = 0;
  // Host memory; null = a HostAllocator with resources.host_memory_bytes as budget.
  Allocator* host_allocator = nullptr;
  // Always-on per-layer timing, when set.
  LayerTimingSink* timing_sink = nullptr;
  // Null = the CPU engine.
  RunnerFactory make_runner;
  // A ZeRO-partitioned job's rank 0: each rank's node, for the checkpoint
  // manifests (partitioned_checkpoint.h); filled by make_runner.
  std::shared_ptr<const std::vector<std::string>> rank_nodes;
};

struct TrainerCallbacks {
  std::function<void(const tandem::v1::JobEvent::StepProgress&)> on_step;
  std::function<void(const tandem::v1::JobEvent::EvalResult&)> on_eval;
  std::function<void(tandem::v1::LogSeverity, const std::string&)> on_log;
  std::function<void(const tandem::v1::JobEvent::CheckpointSaved&)> on_checkpoint;
  // Polled at every step boundary; true stops the run after a final checkpoint.
  std::function<bool()> should_stop;
  // After every step, with its wall time and the runner that ran it (its plan,
  // its measured timeline).
  std::function<void(int64_t step, double step_seconds, const StepRunner& runner)> after_step;
  // Polled at every step boundary after should_stop: a factory for the runner
  // to switch to (a new plan), or null to go on. The trainer checkpoints,
  // replaces its runner and loads that checkpoint into the new one, so the
  // switch changes no state and a later resume starts where the switch did.
  std::function<RunnerFactory()> switch_runner;
  // After each switch: OK, or why the new runner could not be made (the run
  // then goes on under the runner it had, made again).
  std::function<void(const absl::Status&)> on_switch;
};

class SwaAverager;

// Evaluation of `runner`'s current model over all of `data`, in batches of
// `batch_size`, in order: mean loss per sample, accuracy, samples (step unset).
absl::StatusOr<tandem::v1::JobEvent::EvalResult> EvaluateSplit(StepRunner& runner,
                                                               const Dataset& data,
                                                               int64_t batch_size);

class Trainer {
 public:
  // Validates and resolves `spec` (unless options.spec_resolved), opens the
  // data, builds the model and the
  // runner, and loads the newest checkpoint when resuming. Errors name the field.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const tandem::v1::JobSpec& spec,
                                                         TrainerOptions options,
                                                         TrainerCallbacks callbacks);
  ~Trainer();

  // Trains to the end. OK when done; CANCELLED when should_stop() asked (after
  // a checkpoint); another error when the job failed (FAILED_PRECONDITION for a
  // diverged loss, RESOURCE_EXHAUSTED for memory, ...).
  absl::Status Run();

  const tandem::v1::JobSpec& resolved_spec() const { return resolved_; }
  const Model& model() const { return *model_; }
  const tandem::v1::JobProgress& progress() const { return progress_; }
  const tandem::v1::JobMetrics& metrics() const { return metrics_; }
  StepRunner& runner() { return *runner_; }
  // False only after a failed runner switch could make neither runner.
  bool has_runner() const { return runner_ != nullptr; }
  // The callbacks given to Create; set before Run (closed-loop planning adds
  // its own once the model is built).
  TrainerCallbacks& callbacks() { return callbacks_; }
  // The always-on timing sink, kept across runner switches.
  void set_timing_sink(LayerTimingSink* sink);
  // Path and step of the newest checkpoint written or loaded ("" / 0 for none).
  const std::string& checkpoint_path() const { return checkpoint_path_; }
  int64_t checkpoint_step() const { return checkpoint_step_; }
  // Full evaluation of the current parameters on the test split.
  absl::StatusOr<tandem::v1::JobEvent::EvalResult> Evaluate();

 private:
  // Rates over the steps since the last step event, and over the whole run.
  struct RunClock {
    double run_start = 0, window_start = 0;
    int64_t window_steps = 0, window_samples = 0, run_steps = 0, run_samples = 0;
    // The window's steps' own wall time (its wall clock also holds
    // evaluations, checkpoints and runner switches).
    double window_step_seconds = 0;
    double run_step_seconds = 0;
    // Steps after the run's first kWarmupSteps, which pay for one-time work
    // (cuDNN algorithm searches, library handles, lazily loaded GPU modules,
    // first-touch pages): on an H100 they made the mean of a 20-step run 5 to
    // 14 times its steady step. measured_step_seconds is their mean.
    int64_t steady_steps = 0;
    double steady_step_seconds = 0;
    // run_steps after which steps count as steady: kWarmupSteps after the
    // start and after each runner switch.
    int64_t steady_after = kWarmupSteps;
  };
  static constexpr int64_t kWarmupSteps = 2;
  Trainer() = default;
  // One optimizer step; FAILED_PRECONDITION when the loss is no longer finite,
  // when the gradients are not (a step skipped without loss scaling), or when
  // the loss scaler gives up.
  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options,
                                       double last_loss);
  // The step's progress and metrics; a step event every log interval.
  void RecordStep(const StepResult& result, const StepOptions& options, int64_t samples,
                  double step_seconds, RunClock& clock);
  // Evaluation and checkpoints due after a step that is not the last.
  absl::Status AfterStep();
  absl::Status SaveCheckpoint();
  // `make`'s runner for this model and spec; null = the CPU engine.
  absl::StatusOr<std::unique_ptr<StepRunner>> MakeRunner(const RunnerFactory& make) const;
  // callbacks_.switch_runner's switch; the clock's steady steps start again.
  absl::Status SwitchRunner(const RunnerFactory& make, RunClock& clock);
  absl::Status LoadNewestCheckpoint();
  // A ZeRO-partitioned rank 0's: the newest committed manifest, its own
  // partition loaded (the others load theirs in SynchronizeStart).
  absl::Status LoadNewestManifest();
  // The position and the loss scaling of a loaded checkpoint, and the runner
  // told of the state its tensors put in host_state().
  // The step, epoch, samples and fraction done into progress_ (also right
  // after a resume, before any step of this run).
  void RecordPosition();
  absl::Status Resume(const tandem::v1::CheckpointHeader& header, const std::string& path);
  tandem::v1::CheckpointHeader CheckpointHeaderNow();
  // The checkpoint's tensors in `state`: the weights, the buffers and (with
  // `moments`) the whole optimizer state.
  std::vector<NamedTensor> StateTensors(const HostStateView& state, bool moments) const;
  // Where the runner says the run starts (StepRunner::SynchronizeStart).
  absl::Status SynchronizeStart();
  // SWA (JobSpec.updates.swa): its start step filled and checked, the average.
  absl::Status SetUpSwa();
  // Folds the weights into the average when this step is due.
  absl::Status FoldSwa();
  // The average beside each checkpoint (swa-<step>.tdm), written and read.
  absl::Status SaveSwa();
  void LoadSwa();
  // The average evaluated (after its batch-norm statistics are recomputed).
  absl::Status EvaluateSwa();
  // metrics_.updates from the runner and the rule, and metrics_.pipeline_stages
  // from a pipeline runner.
  void RecordUpdateStats();
  void Log(tandem::v1::LogSeverity severity, const std::string& message);

  tandem::v1::JobSpec resolved_;
  TrainerOptions options_;
  TrainerCallbacks callbacks_;
  Datasets data_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Allocator> owned_allocator_;
  Allocator* host_allocator_ = nullptr;
  std::unique_ptr<StepRunner> runner_;
  // ZeRO-partitioned ranks: the runner's own pieces, checkpointed by
  // partition; and on rank 0 the manifest it resumed from.
  std::optional<StatePartition> partition_;
  std::optional<tandem::v1::CheckpointManifest> resumed_manifest_;
  std::unique_ptr<BatchLoader> loader_;
  int64_t step_ = 0, total_steps_ = 0, samples_ = 0;
  std::string checkpoint_path_;
  int64_t checkpoint_step_ = 0;
  tandem::v1::JobProgress progress_;
  tandem::v1::JobMetrics metrics_;
  std::unique_ptr<SwaAverager> swa_;
  // PRECISION_FP16 jobs' dynamic loss scale; null for the others.
  std::unique_ptr<LossScaler> loss_scaler_;
  // The job's CPU threads, and the trainer thread's OpenMP threads (the job's,
  // or a worker's share of them under an update rule with workers).
  int job_threads_ = 0;
  int omp_threads_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_TRAINER_H_
