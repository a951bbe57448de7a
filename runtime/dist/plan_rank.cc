#include "runtime/dist/plan_rank.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"

namespace tandem {

namespace {

void Add(CollectiveStats& to, int64_t calls, int64_t bytes, double seconds) {
  to.calls += calls;
  to.bytes += bytes;
  to.seconds += seconds;
}

}  // namespace

template <typename F>
absl::Status StagedGradientCollective::Counted(bool reduction, F collective) {
  // comm_'s own figures are written on this thread alone; the difference is
  // published for readers on others.
  const CollectiveStats before = comm_->stats();
  absl::Status status = collective();
  const CollectiveStats& after = comm_->stats();
  MutexLock lock(&mu_);
  const int64_t calls = after.calls - before.calls, bytes = after.bytes - before.bytes;
  const double seconds = after.seconds - before.seconds;
  Add(stats_, calls, bytes, seconds);
  if (reduction) Add(reductions_, calls, bytes, seconds);
  return status;
}

absl::Status StagedGradientCollective::AllReduceHost(float* data, int64_t n) {
  return Counted(true, [&] { return comm_->AllReduceSum(data, n); });
}

absl::Status StagedGradientCollective::ReduceScatterHost(float* data,
                                                         const std::vector<int64_t>& pieces) {
  return Counted(true, [&] { return comm_->ReduceScatterSum(data, pieces); });
}

absl::Status StagedGradientCollective::AllGatherHost(float* data,
                                                     const std::vector<int64_t>& pieces) {
  return Counted(false, [&] { return comm_->AllGather(data, pieces); });
}

absl::Status StagedGradientCollective::AllGatherHost(uint16_t* data,
                                                     const std::vector<int64_t>& pieces) {
  return Counted(false, [&] { return comm_->AllGather(data, pieces); });
}

absl::Status StagedGradientCollective::SumOverRanks(double* data, int64_t n) {
  return Counted(false, [&] { return comm_->AllReduceSum(data, n); });
}

absl::Status StagedGradientCollective::AllReduceDevice(Accelerator* accelerator,
                                                       const std::vector<Range>& ranges) {
  int64_t total = 0;
  for (const Range& r : ranges) total += r.n;
  if (device_) {
    // Counted as a ring all-reduce moves them: 2 (N-1)/N of the bytes.
    const double start = WallSeconds();
    absl::Status status = device_(accelerator, ranges);
    const int n = comm_->size();
    const double seconds = WallSeconds() - start;
    const int64_t bytes = 2 * (n - 1) * total * 4 / n;  // a ring all-reduce's, per rank
    MutexLock lock(&mu_);
    Add(stats_, 1, bytes, seconds);
    Add(reductions_, 1, bytes, seconds);
    return status;
  }
  if (static_cast<int64_t>(staging_.size()) < total) staging_.resize(total);
  int64_t at = 0;
  for (const Range& r : ranges) {
    TANDEM_RETURN_IF_ERROR(accelerator->CopyToHost(staging_.data() + at, r.data, r.n * 4));
    at += r.n;
  }
  TANDEM_RETURN_IF_ERROR(
      Counted(true, [&] { return comm_->AllReduceSum(staging_.data(), total); }));
  at = 0;
  for (const Range& r : ranges) {
    TANDEM_RETURN_IF_ERROR(accelerator->CopyToDevice(r.data, staging_.data() + at, r.n * 4));
    at += r.n;
  }
  return absl::OkStatus();
}

CollectiveStats StagedGradientCollective::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

CollectiveStats StagedGradientCollective::reduction_stats() const {
  MutexLock lock(&mu_);
  return reductions_;
}

PlanRankRunner::PlanRankRunner(const Model& model, std::unique_ptr<Communicator> comm,
                               const DataParallelOptions& dp, DeviceAllReduce device_all_reduce)
    : model_(model),
      comm_(std::move(comm)),
      collective_(comm_.get(), std::move(device_all_reduce)),
      dp_(dp) {}

// The executor (and its NETWORK worker) stops before the communicators and
// the accelerator go.
PlanRankRunner::~PlanRankRunner() { executor_.reset(); }

absl::StatusOr<std::unique_ptr<PlanRankRunner>> PlanRankRunner::Create(
    const Model& model, ExecutorOptions options, int64_t global_batch,
    std::unique_ptr<Communicator> comm, std::unique_ptr<Communicator> control,
    const DataParallelOptions& dp, std::unique_ptr<Accelerator> accelerator,
    DeviceAllReduce device_all_reduce) {
  const int n = comm->size();
  if (control == nullptr || control->size() != n || control->rank() != comm->rank()) {
    return absl::InvalidArgumentError("the control communicator is not of the same ranks");
  }
  if (options.plan.strategy() == tandem::v1::STRATEGY_HETERO_DP) {
    return absl::InvalidArgumentError(
        "plan.strategy: hetero_dp already splits the batch between the host and the "
        "accelerator; it does not run as a data-parallel rank");
  }
  if (global_batch < n) {
    return absl::InvalidArgumentError(absl::StrCat("training.batch_size ", global_batch, " gives ",
                                                   n,
                                                   " data-parallel ranks less than a sample each"));
  }
  if (dp.bucket_bytes < 0) {
    return absl::InvalidArgumentError("distributed.bucket_bytes: must not be negative");
  }
  std::unique_ptr<PlanRankRunner> r(
      new PlanRankRunner(model, std::move(comm), dp, std::move(device_all_reduce)));
  r->global_batch_ = global_batch;
  r->accelerator_ = std::move(accelerator);
  r->control_ = std::move(control);
  options.collective = &r->collective_;
  options.bucket_bytes = dp.bucket_bytes;
  options.partition_host_state = dp.sharding == OptimizerSharding::kPartitioned;
  options.max_batch = std::max<int64_t>(options.max_batch, (global_batch + n - 1) / n);
  // A stored program is one replica's; the rank lowers its own.
  options.schedule.Clear();
  TANDEM_ASSIGN_OR_RETURN(r->executor_, PlanExecutor::Create(model, std::move(options)));
  for (const schedule::Op& op : r->executor_->schedule().ops) {
    if (op.kind == schedule::OpKind::kAllReduce || op.kind == schedule::OpKind::kReduceScatter) {
      ++r->buckets_;
    }
  }
  return r;
}

void PlanRankRunner::set_timing_sink(LayerTimingSink* sink) {
  StepRunner::set_timing_sink(sink);
  executor_->set_timing_sink(sink);
}

absl::StatusOr<StepResult> PlanRankRunner::TrainStep(const Batch& batch,
                                                     const StepOptions& options) {
  if (batch.size > global_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  const int64_t start = TakeShare(model_, batch, comm_->rank(), comm_->size(), &share_);
  if (share_.size == 0) {
    // The executor has no step without samples, and every rank must take part
    // in every bucket's all-reduce.
    return absl::FailedPreconditionError(absl::StrCat(
        "a batch of ", batch.size, " samples leaves rank ", comm_->rank(), " of ", comm_->size(),
        " none: ranks running a plan need a sample each from every batch, the epoch's last "
        "(dataset size mod training.batch_size) included"));
  }
  StepOptions share_options = options;
  share_options.sample_offset = start;
  share_options.global_batch = batch.size;
  // This step's collectives alone (not a checkpoint's gathers between steps).
  const CollectiveStats all_before = collective_.stats();
  const CollectiveStats reductions_before = collective_.reduction_stats();
  TANDEM_ASSIGN_OR_RETURN(const StepResult share, executor_->TrainStep(share_, share_options));
  // The agreement completes once every rank's compute of this step has (the
  // buckets go on summing on the NETWORK stream meanwhile): the time here is
  // this rank's wait on the slowest.
  const double wait_start = WallSeconds();
  TANDEM_ASSIGN_OR_RETURN(
      const double loss_sum,
      AgreeStepEnd(control_.get(), share.loss * static_cast<double>(share_.size), options.step,
                   dp_.stop_vote.get()));
  step_waited_seconds_ = WallSeconds() - wait_start;
  // Gradient reductions, and the rest (weight gathers, the norm's sum).
  const double reduced = collective_.reduction_stats().seconds - reductions_before.seconds;
  step_gradient_seconds_ = reduced;
  step_other_seconds_ = collective_.stats().seconds - all_before.seconds - reduced;
  StepResult result;
  result.samples = batch.size;
  result.loss = loss_sum / static_cast<double>(batch.size);
  // The norm the executor clipped with is of the summed gradient: every rank's.
  result.grad_norm = share.grad_norm;
  return result;
}

absl::StatusOr<EvalResult> PlanRankRunner::EvalBatch(const Batch& batch) {
  if (batch.size <= 0) return absl::InvalidArgumentError("an empty batch");
  TakeShare(model_, batch, comm_->rank(), comm_->size(), &share_);
  EvalResult share;
  if (share_.size > 0) {
    TANDEM_ASSIGN_OR_RETURN(share, executor_->EvalBatch(share_));
  }
  return SumEvaluation(control_.get(), share);
}

absl::StatusOr<bool> PlanRankRunner::SynchronizeStart(StartPoint* point) {
  if (comm_->size() == 1) return false;
  TANDEM_ASSIGN_OR_RETURN(const bool moved, BroadcastStartPoint(control_.get(), point));
  TANDEM_RETURN_IF_ERROR(executor_->SyncStateToHost());
  const HostStateView state = executor_->host_state();
  const int64_t p = model_.parameter_elements();
  TANDEM_RETURN_IF_ERROR(control_->Broadcast(state.params, p, 0));
  TANDEM_RETURN_IF_ERROR(control_->Broadcast(state.buffers, model_.buffer_elements(), 0));
  for (float* moment : state.moments) TANDEM_RETURN_IF_ERROR(control_->Broadcast(moment, p, 0));
  TANDEM_RETURN_IF_ERROR(executor_->StateChangedOnHost());
  return moved;
}

tandem::v1::DistributedStats PlanRankRunner::distributed_stats() const {
  const CollectiveStats gradients = collective_.stats();
  const CollectiveStats& control = control_->stats();
  tandem::v1::DistributedStats d;
  d.set_ranks(comm_->size());
  const bool partitioned = dp_.sharding == OptimizerSharding::kPartitioned;
  d.set_sharding(partitioned ? tandem::v1::OPTIMIZER_SHARDING_PARTITIONED
                             : tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  d.set_buckets(buckets_);
  d.set_collective_bytes(gradients.bytes + control.bytes);
  d.set_collective_seconds(gradients.seconds + control.seconds);
  d.set_step_gradient_seconds(step_gradient_seconds_);
  d.set_step_waited_seconds(step_waited_seconds_);
  d.set_step_other_seconds(step_other_seconds_);
  // Partitioned: this rank's pieces of the host's state and the whole state
  // of the layers its accelerator updates.
  d.set_optimizer_elements(executor_->host_state_elements());
  d.set_master_weight_elements(executor_->master_weight_elements());
  return d;
}

}  // namespace tandem
