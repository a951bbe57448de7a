// One rank of a data-parallel job that runs a plan (plan_executor.h) on its
// node: an accelerator plan (gpu_only, zero_offload, reuse_distance, streamed
// layers, micro-batches) on the node's accelerator and host together, or
// cpu_only. Every rank sees the same global batch and trains on its share
// (samples [r B / N, (r + 1) B / N)), so the ranks together are one replica of
// the job: the same losses, up to the order of floating-point sums.
//
// The rank's step program is its plan lowered for N ranks (schedule/lower.h,
// DATA-PARALLEL RANKS): each gradient bucket is summed where its updates read
// it, as soon as its layers' gradients are final there, on the executor's
// NETWORK stream while backward goes on. Host buckets (layers updated on the
// host: ZeRO-Offload's CPU updates, CoTrain's reuse-distance updates) go
// through Gloo in host memory; accelerator buckets through the accelerator's
// collective path (GradientCollective): on the emulated accelerator, staged
// through host memory and Gloo.
//
// The per-step agreement (loss, stop vote, step check), evaluation and the
// start broadcast run on a second communicator between the same ranks (its own
// connections), so they never interleave with a bucket still being summed on
// the NETWORK stream. (A second Gloo context made from the first through
// Gloo's ContextFactory slowed the first one's all-reduces about twentyfold
// on loopback, even after it was destroyed: hence two rendezvous.)
//
// Optimizer state is replicated (DDP: every rank applies the same update), or,
// with DataParallelOptions::sharding kPartitioned, the host's part of it is
// ZeRO-partitioned as ZeRO-Offload does on many GPUs (schedule/lower.h): each
// host bucket is reduce-scattered, every rank updates its piece of it on its
// host with that piece's optimizer state alone, and the ranks all-gather the
// updated weights before they go back to their accelerators. The state of
// layers the accelerator updates stays replicated. Checkpoints are then
// partitioned (state_partition()), as the CPU engine's ranks' are.
// Batch-norm running statistics are rank 0's at the start and then each
// rank's own (DDP without SyncBatchNorm); checkpoints keep rank 0's.
#ifndef TANDEM_RUNTIME_DIST_PLAN_RANK_H_
#define TANDEM_RUNTIME_DIST_PLAN_RANK_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/core/mutex.h"
#include "runtime/dist/communicator.h"
#include "runtime/dist/data_parallel_runner.h"
#include "runtime/exec/gradient_collective.h"
#include "runtime/exec/plan_executor.h"

namespace tandem {

// Sums a bucket's ranges of an accelerator's memory over the ranks, in place,
// and returns when they are summed (GradientCollective::AllReduceDevice's
// contract): NCCL's on a CUDA rank (nccl_gradients.h).
using DeviceAllReduce = std::function<absl::Status(
    Accelerator* accelerator, const std::vector<GradientCollective::Range>& ranges)>;

// GradientCollective over a Communicator: host ranges summed in place; device
// ranges summed by `device` when given (NCCL), else copied to a host staging
// buffer, summed as one message and copied back (the emulated accelerator's
// path).
class StagedGradientCollective final : public GradientCollective {
 public:
  explicit StagedGradientCollective(Communicator* comm, DeviceAllReduce device = nullptr)
      : comm_(comm), device_(std::move(device)) {}
  int rank() const override { return comm_->rank(); }
  int ranks() const override { return comm_->size(); }
  absl::Status AllReduceHost(float* data, int64_t n) override;
  absl::Status AllReduceDevice(Accelerator* accelerator, const std::vector<Range>& ranges) override;
  absl::Status ReduceScatterHost(float* data, const std::vector<int64_t>& pieces) override;
  absl::Status AllGatherHost(float* data, const std::vector<int64_t>& pieces) override;
  absl::Status AllGatherHost(uint16_t* data, const std::vector<int64_t>& pieces) override;
  absl::Status SumOverRanks(double* data, int64_t n) override;
  // What the collectives moved so far (any thread), and the part of it
  // that reduced gradients (all-reduces and reduce-scatters: not the weight
  // gathers and the norm's sums).
  CollectiveStats stats() const;
  CollectiveStats reduction_stats() const;

 private:
  // Runs one collective of `comm_` and publishes its figures (`reduction`:
  // in reduction_stats too).
  template <typename F>
  absl::Status Counted(bool reduction, F collective);

  Communicator* const comm_;
  const DeviceAllReduce device_;
  std::vector<float> staging_;
  mutable Mutex mu_;
  CollectiveStats stats_ ABSL_GUARDED_BY(mu_);
  CollectiveStats reductions_ ABSL_GUARDED_BY(mu_);
};

class PlanRankRunner final : public StepRunner {
 public:
  // `options` are the rank's executor's: its plan for a share of the global
  // batch (at most ceil(global_batch / N) samples: options.max_batch), the
  // job's optimizer and init seed. `comm` sets the rank and the rank count;
  // `control` is a second communicator of the same ranks (another prefix).
  // Every rank must pass the same model, plan, optimizer, seed, global batch
  // and `dp`. INVALID_ARGUMENT for what it cannot run (hetero_dp, a global
  // batch smaller than the ranks, a partitioned bucket smaller than the
  // ranks). `accelerator`,
  // when given, is the one options.accelerator points at: the runner keeps it
  // until its executor is gone. `device_all_reduce`, when given, sums the
  // accelerator's buckets (NCCL on a CUDA rank) instead of staging them
  // through host memory.
  static absl::StatusOr<std::unique_ptr<PlanRankRunner>> Create(
      const Model& model, ExecutorOptions options, int64_t global_batch,
      std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> control,
      const DataParallelOptions& dp, std::unique_ptr<Accelerator> accelerator = nullptr,
      DeviceAllReduce device_all_reduce = nullptr);
  ~PlanRankRunner() override;

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override;
  // Rank 0's position, weights, buffers and optimizer state to every rank.
  absl::StatusOr<bool> SynchronizeStart(StartPoint* point) override;
  absl::Status SyncStateToHost() override { return executor_->SyncStateToHost(); }
  HostStateView host_state() override { return executor_->host_state(); }
  absl::Status StateChangedOnHost() override { return executor_->StateChangedOnHost(); }
  int64_t peak_host_bytes() const override { return executor_->peak_host_bytes(); }
  int64_t peak_accelerator_bytes() const override { return executor_->peak_accelerator_bytes(); }
  tandem::v1::Plan plan() const override { return executor_->plan(); }
  tandem::v1::Schedule program() const override { return executor_->program(); }
  tandem::v1::Timeline last_timeline() const override { return executor_->last_timeline(); }
  std::optional<StatePartition> state_partition() override { return executor_->state_partition(); }
  absl::StatusOr<std::vector<double>> GatherFromRanks(const std::vector<double>& mine) override {
    return tandem::GatherFromRanks(control_.get(), mine);
  }
  std::vector<std::string> warnings() const override { return executor_->warnings(); }
  void set_timing_sink(LayerTimingSink* sink) override;

  int rank() const { return comm_->rank(); }
  int ranks() const { return comm_->size(); }
  // The step program's collectives since the run started (the gradient
  // buckets' reductions, a partitioned rank's weight gathers, the norm's
  // sums).
  CollectiveStats gradient_stats() const { return collective_.stats(); }
  // As DataParallelRunner's.
  tandem::v1::DistributedStats distributed_stats() const override;

 private:
  PlanRankRunner(const Model& model, std::unique_ptr<Communicator> comm,
                 const DataParallelOptions& dp, DeviceAllReduce device_all_reduce);

  const Model& model_;
  // Gradient buckets, on the executor's NETWORK worker.
  std::unique_ptr<Communicator> comm_;
  // Everything on the trainer's thread.
  std::unique_ptr<Communicator> control_;
  StagedGradientCollective collective_;
  const DataParallelOptions dp_;
  std::unique_ptr<Accelerator> accelerator_;
  int64_t global_batch_ = 0;
  int buckets_ = 0;
  std::unique_ptr<PlanExecutor> executor_;
  Batch share_;
  // Gradient-collective seconds at the end of the previous step, and the
  // latest step's figures.
  double step_gradient_seconds_ = 0, step_waited_seconds_ = 0, step_other_seconds_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_PLAN_RANK_H_
