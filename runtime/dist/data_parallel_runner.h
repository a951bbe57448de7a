// One rank of a data-parallel job on the CPU engine. Every rank sees the same
// global batch (the same seed gives every rank the same sample order) and
// trains on its share: samples [r B / N, (r + 1) B / N). Its gradients are
// reduced in DDP-style buckets: consecutive layers, last layer first, each
// bucket's collective started on a communication thread as soon as backward
// has finished its layers, so communication overlaps the rest of backward.
// The global batch's loss and gradient are exactly one replica's, up to the
// order of floating-point sums; so is dropout (masks are drawn per global
// sample). Batch norm normalises over each share, as DDP without
// SyncBatchNorm does; the running statistics are averaged over the ranks after
// every step, so every rank holds the same model.
//
// Two ways to keep the optimizer state (docs/distributed.md):
// - kReplicated: each bucket is all-reduced; every rank keeps all the fp32
//   weights and optimizer state and applies the same update (DDP).
// - kPartitioned: ZeRO with offload. Each bucket is split into N pieces and
//   reduce-scattered, so rank r receives only the summed gradient of piece r
//   of every bucket; it keeps the optimizer state of those pieces alone (1/N of
//   it, on the host), updates their weights, and all-gathers them back. Same
//   bytes on the wire as an all-reduce; 1/N of the optimizer state per rank.
#ifndef TANDEM_RUNTIME_DIST_DATA_PARALLEL_RUNNER_H_
#define TANDEM_RUNTIME_DIST_DATA_PARALLEL_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/dist/communicator.h"
#include "runtime/dist/rank_step.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/exec/step_runner.h"

namespace tandem {

enum class OptimizerSharding { kReplicated, kPartitioned };

struct DataParallelOptions {
  OptimizerSharding sharding = OptimizerSharding::kReplicated;
  // Bucket size, in bytes of fp32 gradient (PyTorch DDP's default: 25 MiB).
  // A bucket closes once it holds at least this much; 0 puts every layer with
  // parameters in a bucket of its own.
  int64_t bucket_bytes = int64_t{25} << 20;
  // Shared with the rank's trainer callbacks; null = no vote.
  std::shared_ptr<StopVote> stop_vote;
};

// One rank's communication in its latest step and in total.
struct DataParallelStats {
  int buckets = 0;
  // Seconds the rank's communication thread spent in the step's gradient
  // collectives, and of those the seconds the step waited on after its own
  // backward had finished (communication not hidden behind backward).
  double step_comm_seconds = 0;
  double step_exposed_seconds = 0;
  // Seconds in the all-gather of updated weights (kPartitioned) and the
  // small collectives (loss, norm, batch-norm statistics).
  double step_other_seconds = 0;
  // Totals since the runner started, from the communicator.
  CollectiveStats total;
};

class DataParallelRunner final : public StepRunner {
 public:
  // `comm` (this rank's; it must outlive the runner) sets the rank and the
  // rank count. Every rank must pass the same model, optimizer, global batch,
  // seed and options. The weights start from `init_seed` on every rank.
  static absl::StatusOr<std::unique_ptr<DataParallelRunner>> Create(
      const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t global_batch,
      uint64_t init_seed, Allocator* allocator, Communicator* comm,
      const DataParallelOptions& options);
  // The same, owning `comm`.
  static absl::StatusOr<std::unique_ptr<DataParallelRunner>> Create(
      const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t global_batch,
      uint64_t init_seed, Allocator* allocator, std::unique_ptr<Communicator> comm,
      const DataParallelOptions& options);
  ~DataParallelRunner() override;

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  // Each rank evaluates its share; the sums are all-reduced, so every rank
  // returns the whole batch's figures.
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override;
  // Rank 0's position, weights and buffers (its checkpoint's, when it
  // resumed) to every rank, and kReplicated its optimizer state: a run
  // restarted after a lost rank goes on from rank 0's checkpoint whatever the
  // others hold. kPartitioned ranks keep their own pieces (each loads its
  // partition of the checkpoint: trainer.h).
  absl::StatusOr<bool> SynchronizeStart(StartPoint* point) override;
  // Nothing to do: the weights and buffers in host_state() are always current.
  // kPartitioned: host_state() has no moments (the trainer checkpoints a
  // rank's own pieces: state_partition()), and nothing gathers them, so no
  // rank ever holds more than its 1/N of the state (what tandemd reserves).
  absl::Status SyncStateToHost() override { return absl::OkStatus(); }
  // kPartitioned, for tests and tools: all-gathers the optimizer state into
  // full-length copies (allocated here, outside the rank's allocator) that
  // host_state() then shows.
  absl::Status GatherOptimizerState();
  HostStateView host_state() override;
  absl::Status StateChangedOnHost() override;
  int64_t peak_host_bytes() const override;
  // kPartitioned: this rank's pieces (optimizer_elements() floats per moment),
  // cut by the buckets' split over the ranks.
  std::optional<StatePartition> state_partition() override;
  absl::StatusOr<std::vector<double>> GatherFromRanks(const std::vector<double>& mine) override;

  const DataParallelStats& stats() const { return stats_; }
  int rank() const { return comm_->rank(); }
  int ranks() const { return comm_->size(); }
  // For the job record (rank 0's) and the per-rank metrics.
  tandem::v1::DistributedStats distributed_stats() const override;
  // Floats of optimizer state per moment this rank keeps.
  int64_t optimizer_elements() const { return optimizer_->elements(); }

 private:
  struct Bucket;
  class Reducer;
  DataParallelRunner(const Model& model, Allocator* allocator, Communicator* comm,
                     const DataParallelOptions& options);
  absl::Status BuildBuckets();
  // The bucket's collective (on the reducer's thread).
  absl::Status ReduceBucket(const Bucket& bucket);
  absl::StatusOr<double> GlobalGradNorm();
  void UpdateOwnedSlices(float learning_rate, float grad_scale);
  absl::Status AverageBuffers();

  const Model& model_;
  Allocator* const allocator_;
  Communicator* comm_;
  std::unique_ptr<Communicator> owned_comm_;
  const DataParallelOptions options_;
  int64_t global_batch_ = 0;
  ModelState weights_;
  std::unique_ptr<CpuRunner> engine_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<Reducer> reducer_;
  Batch share_;
  int64_t share_start_ = 0;
  // kPartitioned: full-length moments for checkpoints, made by SyncStateToHost.
  std::vector<std::vector<float>> full_moments_;
  DataParallelStats stats_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_DATA_PARALLEL_RUNNER_H_
