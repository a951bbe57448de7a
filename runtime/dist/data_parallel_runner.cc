#include "runtime/dist/data_parallel_runner.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/optim/kernels.h"

namespace tandem {

// A run of consecutive layers' gradients, reduced by one collective.
struct DataParallelRunner::Bucket {
  // Lowest layer in the bucket: its gradients are final once backward has
  // passed that layer.
  int first_layer = 0;
  int64_t offset = 0;
  int64_t count = 0;
  // kPartitioned: the bucket's split into one piece per rank, this rank's
  // piece's start within the bucket, and where its optimizer state starts.
  std::vector<int64_t> pieces;
  int64_t piece_start = 0;
  int64_t state_offset = 0;
};

// The communication thread. The trainer's thread hands it buckets as backward
// finishes them (Ready); it runs their collectives in that order, which is the
// same on every rank; Finish waits for those handed over.
class DataParallelRunner::Reducer {
 public:
  Reducer(DataParallelRunner* runner) : runner_(runner), thread_([this] { Loop(); }) {}
  ~Reducer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    handed_ = done_ = 0;
    comm_seconds_ = 0;
    status_ = absl::OkStatus();
  }
  // Backward has finished layer `layer`: hand over every bucket now complete.
  void LayerDone(int layer) {
    const auto& buckets = runner_->buckets_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (handed_ < static_cast<int>(buckets.size()) && buckets[handed_].first_layer >= layer) {
        queue_.push_back(handed_++);
      }
    }
    cv_.notify_all();
  }
  // Waits for every bucket handed over; returns the first error, the seconds
  // spent in collectives, and the seconds waited here.
  absl::Status Finish(double* comm_seconds, double* waited) {
    const double start = WallSeconds();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ == handed_; });
    *waited = WallSeconds() - start;
    *comm_seconds = comm_seconds_;
    return status_;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      const int b = queue_.front();
      queue_.pop_front();
      const bool failed = !status_.ok();
      lock.unlock();
      absl::Status status;
      const double start = WallSeconds();
      // After a failure the rest are skipped: the peers' collectives time out.
      if (!failed) status = runner_->ReduceBucket(runner_->buckets_[b]);
      const double took = WallSeconds() - start;
      lock.lock();
      comm_seconds_ += took;
      if (status_.ok() && !status.ok()) status_ = status;
      ++done_;
      cv_.notify_all();
    }
  }

  DataParallelRunner* const runner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  int handed_ = 0, done_ = 0;
  double comm_seconds_ = 0;
  absl::Status status_;
  bool stop_ = false;
  std::thread thread_;
};

DataParallelRunner::DataParallelRunner(const Model& model, Allocator* allocator, Communicator* comm,
                                       const DataParallelOptions& options)
    : model_(model), allocator_(allocator), comm_(comm), options_(options) {}

DataParallelRunner::~DataParallelRunner() = default;

absl::StatusOr<std::unique_ptr<DataParallelRunner>> DataParallelRunner::Create(
    const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t global_batch,
    uint64_t init_seed, Allocator* allocator, Communicator* comm,
    const DataParallelOptions& options) {
  const int n = comm->size();
  if (global_batch < n) {
    return absl::InvalidArgumentError(absl::StrCat("training.batch_size ", global_batch, " gives ",
                                                   n,
                                                   " data-parallel ranks less than a sample each"));
  }
  if (options.bucket_bytes < 0) {
    return absl::InvalidArgumentError("distributed.bucket_bytes: must not be negative");
  }
  std::unique_ptr<DataParallelRunner> r(new DataParallelRunner(model, allocator, comm, options));
  r->global_batch_ = global_batch;
  const int64_t max_share = (global_batch + n - 1) / n;
  TANDEM_ASSIGN_OR_RETURN(r->engine_,
                          CpuRunner::CreateGradientEngine(model, max_share, init_seed, allocator));
  TANDEM_RETURN_IF_ERROR(r->BuildBuckets());
  int64_t owned = model.parameter_elements();
  if (options.sharding == OptimizerSharding::kPartitioned) {
    owned = 0;
    for (const Bucket& b : r->buckets_) owned += b.pieces[comm->rank()];
  }
  TANDEM_ASSIGN_OR_RETURN(r->optimizer_, Optimizer::Create(optimizer, owned, allocator));
  r->reducer_ = std::make_unique<Reducer>(r.get());
  return r;
}

absl::StatusOr<std::unique_ptr<DataParallelRunner>> DataParallelRunner::Create(
    const Model& model, const tandem::v1::OptimizerSpec& optimizer, int64_t global_batch,
    uint64_t init_seed, Allocator* allocator, std::unique_ptr<Communicator> comm,
    const DataParallelOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<DataParallelRunner> r,
      Create(model, optimizer, global_batch, init_seed, allocator, comm.get(), options));
  r->owned_comm_ = std::move(comm);
  return r;
}

tandem::v1::DistributedStats DataParallelRunner::distributed_stats() const {
  tandem::v1::DistributedStats d;
  d.set_ranks(comm_->size());
  d.set_sharding(options_.sharding == OptimizerSharding::kPartitioned
                     ? tandem::v1::OPTIMIZER_SHARDING_PARTITIONED
                     : tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  d.set_buckets(stats_.buckets);
  d.set_collective_bytes(stats_.total.bytes);
  d.set_collective_seconds(stats_.total.seconds);
  d.set_step_gradient_seconds(stats_.step_comm_seconds);
  d.set_step_waited_seconds(stats_.step_exposed_seconds);
  d.set_step_other_seconds(stats_.step_other_seconds);
  d.set_optimizer_elements(optimizer_->elements());
  // The CPU engine computes with its fp32 weights: every rank keeps them whole.
  d.set_master_weight_elements(model_.parameter_elements());
  return d;
}

absl::Status DataParallelRunner::BuildBuckets() {
  const int n = comm_->size();
  const int64_t cap = options_.bucket_bytes / 4;
  const bool partitioned = options_.sharding == OptimizerSharding::kPartitioned;
  // A partitioned bucket needs a piece for every rank.
  const int64_t floor = partitioned ? n : 1;
  for (int l = model_.num_layers() - 1; l >= 0; --l) {
    if (model_.param_slice(l) == 0) continue;
    const bool extend = !buckets_.empty() && buckets_.back().count < std::max(cap, floor);
    if (!extend) buckets_.push_back(Bucket());
    Bucket& b = buckets_.back();
    b.first_layer = l;
    b.offset = model_.param_offset(l);
    b.count += model_.param_slice(l);
  }
  // The last bucket (the first layers) may be short of a piece per rank: it
  // joins the one before.
  if (buckets_.size() > 1 && buckets_.back().count < floor) {
    Bucket last = buckets_.back();
    buckets_.pop_back();
    buckets_.back().first_layer = last.first_layer;
    buckets_.back().offset = last.offset;
    buckets_.back().count += last.count;
  }
  if (buckets_.empty() || buckets_.back().count < floor) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", model_.parameter_elements(),
                                                   " parameters, fewer than ", n,
                                                   " ranks can partition"));
  }
  int64_t state = 0;
  for (Bucket& b : buckets_) {
    if (!partitioned) continue;
    for (int r = 0; r < n; ++r) {
      b.pieces.push_back(b.count / n + (r < b.count % n ? 1 : 0));
      if (r < comm_->rank()) b.piece_start += b.pieces.back();
    }
    b.state_offset = state;
    state += b.pieces[comm_->rank()];
  }
  stats_.buckets = static_cast<int>(buckets_.size());
  return absl::OkStatus();
}

absl::Status DataParallelRunner::ReduceBucket(const Bucket& bucket) {
  float* grads = engine_->grads() + bucket.offset;
  if (options_.sharding == OptimizerSharding::kPartitioned) {
    return comm_->ReduceScatterSum(grads, bucket.pieces);
  }
  return comm_->AllReduceSum(grads, bucket.count);
}

absl::StatusOr<StepResult> DataParallelRunner::TrainStep(const Batch& batch,
                                                         const StepOptions& options) {
  if (batch.size > global_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  share_start_ = TakeShare(model_, batch, comm_->rank(), comm_->size(), &share_);
  StepOptions share_options = options;
  share_options.sample_offset = share_start_;
  share_options.global_batch = batch.size;
  share_options.on_layer_gradients = [this](int l) { reducer_->LayerDone(l); };
  reducer_->Begin();
  StepResult share_result;
  if (share_.size > 0) {
    TANDEM_ASSIGN_OR_RETURN(share_result, engine_->ComputeGradients(share_, share_options));
  } else {
    // A short last batch can leave this rank nothing: it still takes part.
    std::memset(engine_->grads(), 0, model_.parameter_elements() * sizeof(float));
    reducer_->LayerDone(0);
  }
  double waited = 0;
  TANDEM_RETURN_IF_ERROR(reducer_->Finish(&stats_.step_comm_seconds, &waited));
  stats_.step_exposed_seconds = waited;
  const double other_start = WallSeconds();

  TANDEM_ASSIGN_OR_RETURN(const double loss_sum,
                          AgreeStepEnd(comm_, share_result.loss * static_cast<double>(share_.size),
                                       options.step, options_.stop_vote.get()));
  StepResult result;
  result.samples = batch.size;
  result.loss = loss_sum / static_cast<double>(batch.size);
  const float max_norm = optimizer_->spec().max_grad_norm();
  if (max_norm > 0) {
    TANDEM_ASSIGN_OR_RETURN(result.grad_norm, GlobalGradNorm());
  }
  const double update_start = WallSeconds();
  UpdateOwnedSlices(options.learning_rate, Optimizer::ClipScale(result.grad_norm, max_norm));
  const double update_end = WallSeconds();
  if (timing_sink_) timing_sink_->Record(-1, Phase::kUpdate, update_end - update_start);
  if (options_.sharding == OptimizerSharding::kPartitioned) {
    for (const Bucket& b : buckets_) {
      TANDEM_RETURN_IF_ERROR(comm_->AllGather(engine_->params() + b.offset, b.pieces));
    }
  }
  TANDEM_RETURN_IF_ERROR(AverageBuffers());
  // The collectives after the gradients' (loss and norm, all-gather,
  // buffers), not the update between them, which is compute.
  stats_.step_other_seconds = (update_start - other_start) + (WallSeconds() - update_end);
  stats_.total = comm_->stats();
  return result;
}

absl::StatusOr<double> DataParallelRunner::GlobalGradNorm() {
  const float* grads = engine_->grads();
  if (options_.sharding == OptimizerSharding::kReplicated) {
    return std::sqrt(optim::SumOfSquares(grads, model_.parameter_elements()));
  }
  double sum = 0;
  for (const Bucket& b : buckets_) {
    sum += optim::SumOfSquares(grads + b.offset + b.piece_start, b.pieces[comm_->rank()]);
  }
  TANDEM_RETURN_IF_ERROR(comm_->AllReduceSum(&sum, 1));
  return std::sqrt(sum);
}

void DataParallelRunner::UpdateOwnedSlices(float learning_rate, float grad_scale) {
  float* params = engine_->params();
  const float* grads = engine_->grads();
  if (options_.sharding == OptimizerSharding::kReplicated) {
    optimizer_->Step(params, grads, learning_rate, grad_scale);
    return;
  }
  const StepConstants& c = optimizer_->BeginStep(learning_rate, grad_scale);
  std::vector<float*> states(optimizer_->state_count());
  for (const Bucket& b : buckets_) {
    for (size_t i = 0; i < states.size(); ++i) states[i] = optimizer_->state(i) + b.state_offset;
    const int64_t at = b.offset + b.piece_start;
    Optimizer::UpdateSlice(c, params + at, grads + at, states.data(), b.pieces[comm_->rank()]);
  }
}

absl::Status DataParallelRunner::AverageBuffers() {
  const int64_t n = model_.buffer_elements();
  if (n == 0 || comm_->size() == 1) return absl::OkStatus();
  float* buffers = engine_->buffers();
  TANDEM_RETURN_IF_ERROR(comm_->AllReduceSum(buffers, n));
  const float inv = 1.0f / static_cast<float>(comm_->size());
  for (int64_t i = 0; i < n; ++i) buffers[i] *= inv;
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> DataParallelRunner::EvalBatch(const Batch& batch) {
  if (batch.size > global_batch_ || batch.size <= 0) {
    return absl::InvalidArgumentError("batch larger than the runner was sized for");
  }
  share_start_ = TakeShare(model_, batch, comm_->rank(), comm_->size(), &share_);
  EvalResult share;
  if (share_.size > 0) {
    TANDEM_ASSIGN_OR_RETURN(share, engine_->EvalBatch(share_));
  }
  return SumEvaluation(comm_, share);
}

absl::StatusOr<bool> DataParallelRunner::SynchronizeStart(StartPoint* point) {
  if (comm_->size() == 1) return false;
  TANDEM_ASSIGN_OR_RETURN(const bool moved, BroadcastStartPoint(comm_, point));
  const int64_t p = model_.parameter_elements();
  TANDEM_RETURN_IF_ERROR(comm_->Broadcast(engine_->params(), p, 0));
  TANDEM_RETURN_IF_ERROR(comm_->Broadcast(engine_->buffers(), model_.buffer_elements(), 0));
  if (options_.sharding == OptimizerSharding::kReplicated) {
    for (int i = 0; i < optimizer_->state_count(); ++i) {
      TANDEM_RETURN_IF_ERROR(comm_->Broadcast(optimizer_->state(i), p, 0));
    }
  }
  return moved;
}

absl::Status DataParallelRunner::GatherOptimizerState() {
  if (options_.sharding == OptimizerSharding::kReplicated) return absl::OkStatus();
  full_moments_.resize(optimizer_->state_count());
  for (int i = 0; i < optimizer_->state_count(); ++i) {
    std::vector<float>& full = full_moments_[i];
    full.assign(model_.parameter_elements(), 0.0f);
    for (const Bucket& b : buckets_) {
      std::memcpy(full.data() + b.offset + b.piece_start, optimizer_->state(i) + b.state_offset,
                  b.pieces[comm_->rank()] * sizeof(float));
      TANDEM_RETURN_IF_ERROR(comm_->AllGather(full.data() + b.offset, b.pieces));
    }
  }
  return absl::OkStatus();
}

HostStateView DataParallelRunner::host_state() {
  HostStateView v;
  v.params = engine_->params();
  v.buffers = engine_->buffers();
  v.optimizer = optimizer_.get();
  for (int i = 0; i < optimizer_->state_count(); ++i) {
    if (options_.sharding == OptimizerSharding::kReplicated) {
      v.moments.push_back(optimizer_->state(i));
    } else if (i < static_cast<int>(full_moments_.size())) {
      v.moments.push_back(full_moments_[i].data());
    }
  }
  return v;
}

absl::Status DataParallelRunner::StateChangedOnHost() {
  // Every rank loaded the same checkpoint: it takes its own pieces back.
  if (options_.sharding == OptimizerSharding::kReplicated) return absl::OkStatus();
  for (int i = 0; i < optimizer_->state_count() && i < static_cast<int>(full_moments_.size());
       ++i) {
    for (const Bucket& b : buckets_) {
      std::memcpy(optimizer_->state(i) + b.state_offset,
                  full_moments_[i].data() + b.offset + b.piece_start,
                  b.pieces[comm_->rank()] * sizeof(float));
    }
  }
  return absl::OkStatus();
}

int64_t DataParallelRunner::peak_host_bytes() const { return allocator_->stats().peak_total_bytes; }

std::optional<StatePartition> DataParallelRunner::state_partition() {
  if (options_.sharding != OptimizerSharding::kPartitioned) return std::nullopt;
  StatePartition part;
  part.rank = comm_->rank();
  part.ranks = comm_->size();
  part.elements = optimizer_->elements();
  std::vector<std::string> cuts;
  for (const Bucket& b : buckets_) {
    cuts.push_back(absl::StrCat(b.offset, "+", absl::StrJoin(b.pieces, ",")));
  }
  part.layout = absl::StrCat("zero ranks=", comm_->size(), " buckets=", absl::StrJoin(cuts, ";"));
  for (int i = 0; i < optimizer_->state_count(); ++i) part.moments.push_back(optimizer_->state(i));
  return part;
}

absl::StatusOr<std::vector<double>> DataParallelRunner::GatherFromRanks(
    const std::vector<double>& mine) {
  return tandem::GatherFromRanks(comm_, mine);
}

}  // namespace tandem
