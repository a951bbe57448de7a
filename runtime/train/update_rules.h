// Update rules other than synchronous training (JobSpec.updates; the messages'
// comments define them). Hogwild, EASGD and the parameter server are runners
// the trainer drives like any other, one batch per TrainStep: the batch is
// queued to whichever worker is free, and TrainStep returns as soon as one can
// take the next, with the mean loss of the batches finished since the previous
// call. Workers therefore run concurrently with each other and with the data
// loader; the runner waits for them all (drains) before anything reads its
// state: evaluation, a checkpoint, a plan switch. SWA is not a runner but a
// host-side average the trainer keeps next to any runner (SwaAverager).
//
// Threads: each worker is one thread running its own CPU engine (or, for EASGD
// replicas past the first, the job's hybrid runner) with threads / workers
// OpenMP threads. Hogwild's workers read and write the shared weights and
// optimizer state without any lock: those races are the algorithm. Under
// ThreadSanitizer they are excluded by annotation, and only they: each
// worker's gradient computation and update run inside the sanitizer's
// ignore-reads/writes region (HogwildRaces below); the queue, the counters and
// the drain stay checked.
#ifndef TANDEM_RUNTIME_TRAIN_UPDATE_RULES_H_
#define TANDEM_RUNTIME_TRAIN_UPDATE_RULES_H_

#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "runtime/exec/step_runner.h"
#include "runtime/model/model.h"
#include "runtime/train/trainer.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// OpenMP threads of each worker of `resolved`'s rule when the job has
// `threads` (0: the process default): threads / workers, at least 1; all of
// them for rules without workers. The trainer's own thread runs with as many:
// the layers cache oneDNN primitives made for the thread count of the thread
// that first asks (sizing, evaluation), and a primitive run with another
// count partitions its reductions differently, which would cost the
// parameter server at staleness 0 its bit-for-bit match with synchronous
// training on that many threads.
int WorkerThreads(const tandem::v1::JobSpec& resolved, int threads);

// Host bytes `resolved.updates()`'s rule needs beyond one runner of the model
// (what tandemd's admission reserves for it): each Hogwild or parameter-server
// worker's gradients, activations and, for the server's workers, weight
// copies; EASGD's other replicas (their optimizer state too), its centre and
// the centre's evaluator; SWA's average, its snapshot and the evaluation of
// the average at the end. 0 for synchronous training.
int64_t UpdateRuleHostBytes(const Model& model, const tandem::v1::JobSpec& resolved,
                            int64_t max_batch);

// The runner for `resolved.updates()`'s rule, or null for rules the trainer
// runs with its ordinary runner (synchronous, SWA). `accelerated` makes EASGD's
// replica 1, the node's accelerator's (null: every replica on the CPU engine;
// replicas past 1 always are). `threads`
// is the job's CPU threads, shared out among the workers (WorkerThreads).
absl::StatusOr<std::unique_ptr<StepRunner>> MakeUpdateRuleRunner(
    const Model& model, const tandem::v1::JobSpec& resolved, int64_t max_batch,
    Allocator* host_allocator, int threads, const RunnerFactory& accelerated);

// SWA's running average of the weights, folded on a background thread while
// the next step runs. Not thread-safe: one caller (the trainer).
class SwaAverager {
 public:
  // `elements` parameters; the average starts empty.
  static absl::StatusOr<std::unique_ptr<SwaAverager>> Create(int64_t elements,
                                                             Allocator* allocator);
  ~SwaAverager();

  // Copies `params` and folds the copy into the average in the background:
  // average += (params - average) / (models + 1). `params` may change as soon
  // as this returns.
  void Fold(const float* params);
  // Waits for the fold in flight, if any.
  void Wait();

  // The models folded, the one in flight included; the average holds them
  // all after Wait().
  float* average() const { return average_.f32(); }
  int64_t models() const { return models_; }
  // A checkpoint's average (a resumed job's).
  void Restore(int64_t models) { models_ = models; }

  // Evaluates the average: a CPU engine on a copy of it whose batch-norm
  // running statistics are recomputed over one pass of `train` (the plain
  // average of each batch's statistics), then run over `test`. `buffers` are
  // the last iterate's (kept for layers without batch norm).
  absl::StatusOr<tandem::v1::JobEvent::EvalResult> Evaluate(
      const Model& model, const tandem::v1::JobSpec& resolved, const float* buffers,
      const Dataset& train, const Dataset* test, Allocator* allocator);

 private:
  SwaAverager() = default;
  int64_t elements_ = 0;
  Buffer average_, snapshot_;
  int64_t models_ = 0;
  // The fold in flight (a thread per fold: one per averaging period).
  std::thread folder_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_UPDATE_RULES_H_
