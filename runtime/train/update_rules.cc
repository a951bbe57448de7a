#include "runtime/train/update_rules.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/data/loader.h"
#include "runtime/exec/cpu_runner.h"
#include "spec/job_spec.h"

namespace tandem {
namespace {

using tandem::v1::UpdateStats;

#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
// Hogwild's lock-free reads and writes of the shared weights are the
// algorithm, not a bug: ThreadSanitizer ignores this thread's memory accesses
// while one of these is alive (and the thread's OpenMP team is one thread, so
// no other thread touches the weights on its behalf).
class HogwildRaces {
 public:
  HogwildRaces() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~HogwildRaces() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
};
#else
class HogwildRaces {
 public:
  HogwildRaces() {}  // user-provided, so an unused instance draws no warning
};
#endif

absl::StatusOr<Buffer> FloatBuffer(Allocator* allocator, int64_t elements,
                                   MemoryCategory category) {
  return Buffer::Allocate(allocator, std::max<int64_t>(1, elements) * 4, category);
}

void CopyFloats(float* to, const float* from, int64_t n) {
  if (n > 0) std::memcpy(to, from, n * sizeof(float));
}

// A batch queued to a worker, with the position in the job's order of updates
// (the trainer's step, counted by the runner so it survives a resume).
struct WorkItem {
  Batch batch;
  StepOptions options;
  int64_t sequence = 0;
};

// The queue, the worker threads and the counts every asynchronous rule
// shares. Subclasses say what a worker does with a batch (Process).
// Synchronisation is std::mutex and std::condition_variable rather than
// absl::Mutex: Debian's Abseil is not built for ThreadSanitizer, which would
// then see neither its locking nor its condition evaluation on the unlocking
// thread, and the stress under ThreadSanitizer is part of make test.
class AsyncRunner : public StepRunner {
 public:
  ~AsyncRunner() override { Stop(); }

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override;
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override {
    TANDEM_RETURN_IF_ERROR(Drain());
    return evaluator().EvalBatch(batch);
  }
  UpdateStats update_stats() const override;

 protected:
  AsyncRunner(std::string rule, int workers) : rule_(std::move(rule)), workers_(workers) {}
  // Starts the workers, `per_worker` OpenMP threads each.
  void Start(int per_worker);
  // Joins the workers; batches still queued are dropped.
  void Stop();
  // Waits until no batch is queued or running. The first worker error, if any.
  absl::Status Drain();
  // What worker `w` does with `item`: its loss (and gradient norm), or why it
  // failed.
  virtual absl::StatusOr<StepResult> Process(int w, WorkItem& item) = 0;
  // The runner that evaluates the rule's model once drained.
  virtual StepRunner& evaluator() = 0;

  // The next batch's sequence number (after a checkpoint is loaded).
  void set_next_sequence(int64_t sequence) {
    std::lock_guard<std::mutex> l(mu_);
    next_sequence_ = sequence;
  }
  void RecordStaleness(int64_t staleness);
  void AddWaitSeconds(double seconds);
  void CountExchange() { exchanges_.fetch_add(1, std::memory_order_relaxed); }
  // Blocks until `ready` (evaluated under mu_) or the runner fails or stops;
  // false in the latter case.
  bool AwaitOrAbort(const std::function<bool()>& ready);
  // Runs `change` under mu_ and wakes every waiter.
  void Publish(const std::function<void()>& change) {
    {
      std::lock_guard<std::mutex> l(mu_);
      change();
    }
    cv_.notify_all();
  }
  std::mutex& mu() { return mu_; }

  const std::string rule_;
  const int workers_;
  // Each batch's computation waits for the previous batch's update (the
  // parameter server at staleness 0): TrainStep then waits for its own batch
  // and reports that batch's loss, as synchronous training does.
  bool serial_ = false;

 private:
  void WorkerLoop(int w, int threads);

  // Everything below up to exchanges_ is guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WorkItem*> queue_;
  std::vector<std::unique_ptr<WorkItem>> items_;
  std::vector<WorkItem*> free_;
  int in_flight_ = 0;
  int64_t next_sequence_ = 0;
  // Losses finished since the previous TrainStep returned.
  double loss_sum_ = 0, grad_norm_sum_ = 0;
  int64_t finished_ = 0;
  double last_loss_ = 0;
  bool any_finished_ = false;
  absl::Status error_;
  bool stopping_ = false;
  int64_t updates_ = 0;
  std::vector<int64_t> staleness_;
  double wait_seconds_ = 0;
  std::atomic<int64_t> exchanges_{0};
  std::vector<std::thread> threads_;
};

void AsyncRunner::Start(int per_worker) {
  for (int w = 0; w < workers_; ++w) {
    threads_.emplace_back([this, w, per_worker] { WorkerLoop(w, per_worker); });
  }
}

void AsyncRunner::Stop() {
  Publish([this] { stopping_ = true; });
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

bool AsyncRunner::AwaitOrAbort(const std::function<bool()>& ready) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return stopping_ || !error_.ok() || ready(); });
  return !stopping_ && error_.ok();
}

void AsyncRunner::WorkerLoop(int w, int threads) {
  omp_set_num_threads(threads);
  while (true) {
    WorkItem* item;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      item = queue_.front();
      queue_.pop_front();
      // After a failure the batches still queued are dropped, not run: the
      // model must not move on while the trainer stops.
      if (!error_.ok()) {
        --in_flight_;
        free_.push_back(item);
        cv_.notify_all();
        continue;
      }
    }
    absl::StatusOr<StepResult> result = Process(w, *item);
    Publish([&] {
      --in_flight_;
      free_.push_back(item);
      if (!result.ok()) {
        // The trainer names the step it was at; this names the batch's own.
        if (error_.ok()) {
          error_ = absl::Status(result.status().code(),
                                absl::StrCat("the batch of step ", item->sequence + 1, " (", rule_,
                                             " worker ", w, "): ", result.status().message()));
        }
        return;
      }
      ++updates_;
      loss_sum_ += result->loss;
      grad_norm_sum_ += result->grad_norm;
      ++finished_;
      last_loss_ = result->loss;
      any_finished_ = true;
    });
  }
}

absl::StatusOr<StepResult> AsyncRunner::TrainStep(const Batch& batch, const StepOptions& options) {
  std::unique_lock<std::mutex> l(mu_);
  if (!error_.ok()) return error_;
  if (free_.empty()) {
    items_.push_back(std::make_unique<WorkItem>());
    free_.push_back(items_.back().get());
  }
  WorkItem* item = free_.back();
  free_.pop_back();
  item->batch = batch;
  item->options = options;
  item->sequence = next_sequence_++;
  queue_.push_back(item);
  ++in_flight_;
  cv_.notify_all();
  // Back as soon as a worker is free for the next batch (and once at least
  // one batch has finished, so there is a loss to report); when each batch
  // waits for the one before anyway, once this one has finished.
  cv_.wait(l, [this] {
    return !error_.ok() || (serial_ ? in_flight_ == 0 : in_flight_ < workers_ && any_finished_);
  });
  if (!error_.ok()) return error_;
  StepResult result;
  result.samples = batch.size;
  result.loss = finished_ > 0 ? loss_sum_ / static_cast<double>(finished_) : last_loss_;
  result.grad_norm = finished_ > 0 ? grad_norm_sum_ / static_cast<double>(finished_) : 0.0;
  loss_sum_ = 0;
  grad_norm_sum_ = 0;
  finished_ = 0;
  return result;
}

absl::Status AsyncRunner::Drain() {
  std::unique_lock<std::mutex> l(mu_);
  // Every batch finished or dropped, even after a failure: nothing runs on
  // the weights once this returns.
  cv_.wait(l, [this] { return in_flight_ == 0; });
  return error_;
}

void AsyncRunner::RecordStaleness(int64_t staleness) {
  std::lock_guard<std::mutex> l(mu_);
  staleness = std::max<int64_t>(0, staleness);
  if (static_cast<int64_t>(staleness_.size()) <= staleness) staleness_.resize(staleness + 1, 0);
  ++staleness_[staleness];
}

void AsyncRunner::AddWaitSeconds(double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  wait_seconds_ += seconds;
}

UpdateStats AsyncRunner::update_stats() const {
  std::lock_guard<std::mutex> l(mu_);
  UpdateStats s;
  s.set_rule(rule_);
  s.set_updates(updates_);
  int64_t n = 0, sum = 0;
  for (size_t i = 0; i < staleness_.size(); ++i) {
    s.add_staleness_counts(staleness_[i]);
    n += staleness_[i];
    sum += static_cast<int64_t>(i) * staleness_[i];
    if (staleness_[i] > 0) s.set_max_staleness(static_cast<int64_t>(i));
  }
  s.set_mean_staleness(n > 0 ? static_cast<double>(sum) / static_cast<double>(n) : 0.0);
  s.set_wait_seconds(wait_seconds_);
  s.set_exchanges(exchanges_.load(std::memory_order_relaxed));
  return s;
}

// Hogwild: every worker computes on, and updates, the owner's weights and
// optimizer state, without locks.
class HogwildRunner final : public AsyncRunner {
 public:
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const Model& model,
                                                            const tandem::v1::JobSpec& spec,
                                                            int64_t max_batch, Allocator* allocator,
                                                            int threads) {
    std::unique_ptr<HogwildRunner> r(new HogwildRunner(spec.updates().hogwild().workers()));
    TANDEM_ASSIGN_OR_RETURN(r->owner_, CpuRunner::Create(model, spec.optimizer(), max_batch,
                                                         spec.training().seed(), allocator));
    const SharedWeights shared{r->owner_->params(), r->owner_->buffers()};
    for (int w = 0; w < r->workers_; ++w) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> worker,
                              CpuRunner::Create(model, spec.optimizer(), max_batch,
                                                spec.training().seed(), allocator, &shared));
      r->workers_list_.push_back(std::move(worker));
    }
    r->elements_ = model.parameter_elements();
    r->Start(threads);
    return std::unique_ptr<StepRunner>(std::move(r));
  }
  ~HogwildRunner() override { Stop(); }

  absl::Status SyncStateToHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    owner_->host_state().optimizer->set_step(t_.load());
    return absl::OkStatus();
  }
  HostStateView host_state() override { return owner_->host_state(); }
  absl::Status StateChangedOnHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    t_.store(owner_->host_state().optimizer->step());
    return absl::OkStatus();
  }
  int64_t peak_host_bytes() const override { return owner_->peak_host_bytes(); }

 private:
  explicit HogwildRunner(int workers) : AsyncRunner("hogwild", workers) {}
  StepRunner& evaluator() override { return *owner_; }

  absl::StatusOr<StepResult> Process(int w, WorkItem& item) override {
    CpuRunner& worker = *workers_list_[w];
    const int64_t seen = applied_.load();
    StepResult result;
    {
      HogwildRaces races;
      TANDEM_ASSIGN_OR_RETURN(result, worker.ComputeGradients(item.batch, item.options));
      const Optimizer& optimizer = *owner_->host_state().optimizer;
      const StepConstants c = optimizer.ConstantsAt(
          t_.fetch_add(1) + 1, item.options.learning_rate,
          Optimizer::ClipScale(result.grad_norm, optimizer.spec().max_grad_norm()));
      const HostStateView shared = owner_->host_state();
      float* states[2] = {shared.moments.size() > 0 ? shared.moments[0] : nullptr,
                          shared.moments.size() > 1 ? shared.moments[1] : nullptr};
      Optimizer::UpdateSlice(c, shared.params, worker.grads(), states, elements_);
    }
    RecordStaleness(applied_.fetch_add(1) - seen);
    return result;
  }

  std::unique_ptr<CpuRunner> owner_;
  std::vector<std::unique_ptr<CpuRunner>> workers_list_;
  int64_t elements_ = 0;
  // Adam's t of the latest update begun, and updates finished.
  std::atomic<int64_t> t_{0};
  std::atomic<int64_t> applied_{0};
};

// The parameter server: the owner's weights and optimizer state in shards,
// each at a version (the updates applied to it). Workers pull a copy of every
// shard, compute on the copy and push the gradient; pushes apply in sequence
// order, so sequence k becomes version k + 1 of each shard.
class ParameterServerRunner final : public AsyncRunner {
 public:
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const Model& model,
                                                            const tandem::v1::JobSpec& spec,
                                                            int64_t max_batch, Allocator* allocator,
                                                            int threads) {
    const auto& ps = spec.updates().parameter_server();
    std::unique_ptr<ParameterServerRunner> r(new ParameterServerRunner(ps.workers()));
    r->staleness_bound_ = ps.staleness();
    r->serial_ = ps.staleness() == 0;
    r->params_ = model.parameter_elements();
    r->buffer_elements_ = model.buffer_elements();
    TANDEM_ASSIGN_OR_RETURN(r->owner_, CpuRunner::Create(model, spec.optimizer(), max_batch,
                                                         spec.training().seed(), allocator));
    const int shards =
        static_cast<int>(std::min<int64_t>(ps.shards(), std::max<int64_t>(1, r->params_)));
    // Boundaries on multiples of 64 elements: the optimizer kernels' vector
    // loops then cover every shard as they cover the whole model, so an
    // element's update rounds as in synchronous training.
    constexpr int64_t kAlign = 64;
    for (int j = 0; j <= shards; ++j) {
      r->bounds_.push_back(j == shards
                               ? r->params_
                               : std::min(r->params_, r->params_ * j / shards / kAlign * kAlign));
    }
    r->versions_.assign(shards, 0);
    r->shard_mu_ = std::make_unique<std::shared_mutex[]>(shards);
    for (int w = 0; w < r->workers_; ++w) {
      Worker worker;
      TANDEM_ASSIGN_OR_RETURN(worker.params,
                              FloatBuffer(allocator, r->params_, MemoryCategory::kParameters));
      TANDEM_ASSIGN_OR_RETURN(
          worker.buffers, FloatBuffer(allocator, r->buffer_elements_, MemoryCategory::kParameters));
      const SharedWeights local{worker.params.f32(), worker.buffers.f32()};
      TANDEM_ASSIGN_OR_RETURN(worker.runner,
                              CpuRunner::Create(model, spec.optimizer(), max_batch,
                                                spec.training().seed(), allocator, &local));
      r->workers_list_.push_back(std::move(worker));
    }
    r->Start(threads);
    return std::unique_ptr<StepRunner>(std::move(r));
  }
  ~ParameterServerRunner() override { Stop(); }

  absl::Status SyncStateToHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    std::lock_guard<std::mutex> l(mu());
    owner_->host_state().optimizer->set_step(versions_[0]);
    return absl::OkStatus();
  }
  HostStateView host_state() override { return owner_->host_state(); }
  absl::Status StateChangedOnHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    const int64_t version = owner_->host_state().optimizer->step();
    Publish([&] { std::fill(versions_.begin(), versions_.end(), version); });
    set_next_sequence(version);
    return absl::OkStatus();
  }
  int64_t peak_host_bytes() const override { return owner_->peak_host_bytes(); }

 private:
  struct Worker {
    Buffer params, buffers;
    std::unique_ptr<CpuRunner> runner;
  };
  explicit ParameterServerRunner(int workers) : AsyncRunner("parameter_server", workers) {}
  StepRunner& evaluator() override { return *owner_; }
  int shards() const { return static_cast<int>(versions_.size()); }

  // Copies shard j (and, with shard 0, the batch-norm buffers) once it is at
  // least at version `min_version`; the version copied.
  absl::StatusOr<int64_t> Pull(int j, int64_t min_version, Worker& worker) {
    const double start = WallSeconds();
    if (!AwaitOrAbort([&] { return versions_[j] >= min_version; })) {
      return absl::CancelledError("the parameter server stopped");
    }
    AddWaitSeconds(WallSeconds() - start);
    std::shared_lock<std::shared_mutex> shard(shard_mu_[j]);
    const HostStateView server = owner_->host_state();
    CopyFloats(worker.params.f32() + bounds_[j], server.params + bounds_[j],
               bounds_[j + 1] - bounds_[j]);
    if (j == 0) CopyFloats(worker.buffers.f32(), server.buffers, buffer_elements_);
    std::lock_guard<std::mutex> l(mu());
    return versions_[j];
  }

  // Applies the worker's gradient to shard j as version k + 1, after k.
  absl::Status Push(int j, int64_t k, const StepConstants& c, Worker& worker) {
    const double start = WallSeconds();
    if (!AwaitOrAbort([&] { return versions_[j] >= k; })) {
      return absl::CancelledError("the parameter server stopped");
    }
    AddWaitSeconds(WallSeconds() - start);
    std::unique_lock<std::shared_mutex> shard(shard_mu_[j]);
    {
      std::lock_guard<std::mutex> l(mu());
      if (versions_[j] != k) {
        return absl::InternalError(absl::StrCat("parameter server shard ", j, " is at version ",
                                                versions_[j], ", past batch ", k,
                                                "'s: its update would be lost"));
      }
    }
    const HostStateView server = owner_->host_state();
    const int64_t b = bounds_[j];
    float* states[2] = {server.moments.size() > 0 ? server.moments[0] + b : nullptr,
                        server.moments.size() > 1 ? server.moments[1] + b : nullptr};
    Optimizer::UpdateSlice(c, server.params + b, worker.runner->grads() + b, states,
                           bounds_[j + 1] - b);
    // The running statistics the batch produced, as synchronous training keeps
    // them. With staleness > 0 the worker's copy started from an older
    // version, so this drops the moves of the batches in between: batch
    // norm's statistics lag as the weights may (docs/update-rules.md).
    if (j == 0) CopyFloats(server.buffers, worker.buffers.f32(), buffer_elements_);
    Publish([&] { versions_[j] = k + 1; });
    return absl::OkStatus();
  }

  absl::StatusOr<StepResult> Process(int w, WorkItem& item) override {
    Worker& worker = workers_list_[w];
    const int64_t k = item.sequence;
    int64_t pulled = k;
    for (int j = 0; j < shards(); ++j) {
      TANDEM_ASSIGN_OR_RETURN(const int64_t v, Pull(j, k - staleness_bound_, worker));
      pulled = std::min(pulled, v);
    }
    TANDEM_ASSIGN_OR_RETURN(const StepResult result,
                            worker.runner->ComputeGradients(item.batch, item.options));
    const Optimizer& optimizer = *owner_->host_state().optimizer;
    const StepConstants c = optimizer.ConstantsAt(
        k + 1, item.options.learning_rate,
        Optimizer::ClipScale(result.grad_norm, optimizer.spec().max_grad_norm()));
    for (int j = 0; j < shards(); ++j) TANDEM_RETURN_IF_ERROR(Push(j, k, c, worker));
    RecordStaleness(k - pulled);
    return result;
  }

  std::unique_ptr<CpuRunner> owner_;
  std::vector<Worker> workers_list_;
  int64_t staleness_bound_ = 0, params_ = 0, buffer_elements_ = 0;
  std::vector<int64_t> bounds_;
  // Guarded by mu(); changed only while the shard's mutex is held as writer.
  std::vector<int64_t> versions_;
  std::unique_ptr<std::shared_mutex[]> shard_mu_;
};

// Asynchronous EASGD: replicas with their own weights and optimizers, pulled
// toward (and pulling) the centre every `period` of their own steps.
class EasgdRunner final : public AsyncRunner {
 public:
  static absl::StatusOr<std::unique_ptr<StepRunner>> Create(const Model& model,
                                                            const tandem::v1::JobSpec& spec,
                                                            int64_t max_batch, Allocator* allocator,
                                                            int threads,
                                                            const RunnerFactory& accelerated) {
    const auto& e = spec.updates().easgd();
    std::unique_ptr<EasgdRunner> r(new EasgdRunner(e.replicas()));
    r->alpha_ = e.alpha();
    r->period_ = e.period();
    r->params_ = model.parameter_elements();
    r->buffer_elements_ = model.buffer_elements();
    TANDEM_ASSIGN_OR_RETURN(r->centre_params_,
                            FloatBuffer(allocator, r->params_, MemoryCategory::kParameters));
    TANDEM_ASSIGN_OR_RETURN(r->centre_buffers_, FloatBuffer(allocator, r->buffer_elements_,
                                                            MemoryCategory::kParameters));
    const SharedWeights centre{r->centre_params_.f32(), r->centre_buffers_.f32()};
    TANDEM_ASSIGN_OR_RETURN(
        r->centre_, CpuRunner::Create(model, spec.optimizer(), max_batch, spec.training().seed(),
                                      allocator, &centre));
    for (int i = 0; i < r->workers_; ++i) {
      std::unique_ptr<StepRunner> replica;
      // One replica per accelerator: the node's one takes replica 1.
      if (i == 1 && accelerated) {
        TANDEM_ASSIGN_OR_RETURN(replica, accelerated(model, spec, max_batch, allocator));
      } else {
        TANDEM_ASSIGN_OR_RETURN(replica, CpuRunner::Create(model, spec.optimizer(), max_batch,
                                                           spec.training().seed(), allocator));
      }
      r->replicas_.push_back(std::move(replica));
    }
    r->local_steps_.assign(r->workers_, 0);
    // Every replica and the centre start from replica 0's initial weights.
    HostStateView first = r->replicas_[0]->host_state();
    CopyFloats(r->centre_params_.f32(), first.params, r->params_);
    CopyFloats(r->centre_buffers_.f32(), first.buffers, r->buffer_elements_);
    TANDEM_RETURN_IF_ERROR(r->CopyToReplicas(/*moments=*/false));
    r->Start(threads);
    return std::unique_ptr<StepRunner>(std::move(r));
  }
  ~EasgdRunner() override { Stop(); }

  absl::Status SyncStateToHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    return replicas_[0]->SyncStateToHost();
  }
  // The centre, with replica 0's optimizer state.
  HostStateView host_state() override {
    HostStateView v = replicas_[0]->host_state();
    v.params = centre_params_.f32();
    v.buffers = centre_buffers_.f32();
    return v;
  }
  // A loaded checkpoint: every replica restarts at the centre with replica
  // 0's optimizer state.
  absl::Status StateChangedOnHost() override {
    TANDEM_RETURN_IF_ERROR(Drain());
    // Each replica's exchange period starts again from the loaded centre.
    std::fill(local_steps_.begin(), local_steps_.end(), 0);
    return CopyToReplicas(/*moments=*/true);
  }
  int64_t peak_host_bytes() const override { return centre_->peak_host_bytes(); }
  int64_t peak_accelerator_bytes() const override {
    int64_t peak = 0;
    for (const auto& r : replicas_) peak += r->peak_accelerator_bytes();
    return peak;
  }

 private:
  explicit EasgdRunner(int replicas) : AsyncRunner("easgd", replicas) {}
  StepRunner& evaluator() override { return *centre_; }

  absl::Status CopyToReplicas(bool moments) {
    const HostStateView from = replicas_[0]->host_state();
    for (size_t i = 0; i < replicas_.size(); ++i) {
      HostStateView to = replicas_[i]->host_state();
      CopyFloats(to.params, centre_params_.f32(), params_);
      CopyFloats(to.buffers, centre_buffers_.f32(), buffer_elements_);
      if (moments && i > 0) {
        for (size_t m = 0; m < to.moments.size() && m < from.moments.size(); ++m) {
          CopyFloats(to.moments[m], from.moments[m], params_);
        }
        to.optimizer->set_step(from.optimizer->step());
      }
      TANDEM_RETURN_IF_ERROR(replicas_[i]->StateChangedOnHost());
    }
    return absl::OkStatus();
  }

  // The elastic exchange of replica w with the centre.
  absl::Status Exchange(StepRunner& replica) {
    TANDEM_RETURN_IF_ERROR(replica.SyncStateToHost());
    HostStateView x = replica.host_state();
    {
      std::lock_guard<std::mutex> l(centre_mu_);
      Elastic(x.params, centre_params_.f32(), params_);
      Elastic(x.buffers, centre_buffers_.f32(), buffer_elements_);
    }
    CountExchange();
    return replica.StateChangedOnHost();
  }

  void Elastic(float* x, float* centre, int64_t n) const {
    const float alpha = alpha_;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float d = alpha * (x[i] - centre[i]);
      x[i] -= d;
      centre[i] += d;
    }
  }

  absl::StatusOr<StepResult> Process(int w, WorkItem& item) override {
    StepRunner& replica = *replicas_[w];
    TANDEM_ASSIGN_OR_RETURN(const StepResult result, replica.TrainStep(item.batch, item.options));
    if (++local_steps_[w] % period_ == 0) TANDEM_RETURN_IF_ERROR(Exchange(replica));
    return result;
  }

  float alpha_ = 0.1f;
  int64_t period_ = 1, params_ = 0, buffer_elements_ = 0;
  Buffer centre_params_, centre_buffers_;
  std::mutex centre_mu_;
  std::unique_ptr<CpuRunner> centre_;
  std::vector<std::unique_ptr<StepRunner>> replicas_;
  // Each touched by its worker only.
  std::vector<int64_t> local_steps_;
};

}  // namespace

int64_t UpdateRuleHostBytes(const Model& model, const tandem::v1::JobSpec& resolved,
                            int64_t max_batch) {
  const int64_t params = model.parameter_elements() * 4, buffers = model.buffer_elements() * 4;
  int64_t max_output = model.data().sample_shape.elements() * 4 * max_batch;
  for (int l = 0; l < model.num_layers(); ++l) {
    max_output = std::max(max_output, model.layer(l).OutputBytes(max_batch));
  }
  // A CPU engine's allocations (weights, gradients, buffers, per-layer
  // outputs and saved tensors, two gradient buffers, the workspace), each
  // 64-byte aligned.
  const int64_t engine = 2 * params + buffers + model.ActivationBytes(max_batch) + 2 * max_output +
                         model.MaxWorkspaceBytes(max_batch) + 64 * (2 * model.num_layers() + 8);
  int states = 2;
  if (resolved.optimizer().kind() == tandem::v1::OPTIMIZER_KIND_SGD) {
    states = resolved.optimizer().momentum() > 0 ? 1 : 0;
  }
  const auto& u = resolved.updates();
  switch (u.rule_case()) {
    case tandem::v1::UpdateSpec::kHogwild:
      return u.hogwild().workers() * engine;
    case tandem::v1::UpdateSpec::kParameterServer:
      return u.parameter_server().workers() * (engine + params + buffers);
    case tandem::v1::UpdateSpec::kEasgd:
      return (u.easgd().replicas() - 1) * (engine + states * params) + (params + buffers) + engine;
    case tandem::v1::UpdateSpec::kSwa:
      return 2 * params + (params + buffers) + engine;
    default:
      return 0;
  }
}

int WorkerThreads(const tandem::v1::JobSpec& resolved, int threads) {
  if (threads <= 0) threads = omp_get_max_threads();
  const auto& u = resolved.updates();
  const int workers = u.has_hogwild()            ? u.hogwild().workers()
                      : u.has_parameter_server() ? u.parameter_server().workers()
                      : u.has_easgd()            ? u.easgd().replicas()
                                                 : 1;
  return std::max(1, threads / std::max(1, workers));
}

absl::StatusOr<std::unique_ptr<StepRunner>> MakeUpdateRuleRunner(
    const Model& model, const tandem::v1::JobSpec& resolved, int64_t max_batch,
    Allocator* host_allocator, int threads, const RunnerFactory& accelerated) {
  threads = WorkerThreads(resolved, threads);
  switch (resolved.updates().rule_case()) {
    case tandem::v1::UpdateSpec::kHogwild:
      return HogwildRunner::Create(model, resolved, max_batch, host_allocator, threads);
    case tandem::v1::UpdateSpec::kParameterServer:
      return ParameterServerRunner::Create(model, resolved, max_batch, host_allocator, threads);
    case tandem::v1::UpdateSpec::kEasgd:
      return EasgdRunner::Create(model, resolved, max_batch, host_allocator, threads, accelerated);
    default:
      return std::unique_ptr<StepRunner>();
  }
}

absl::StatusOr<std::unique_ptr<SwaAverager>> SwaAverager::Create(int64_t elements,
                                                                 Allocator* allocator) {
  std::unique_ptr<SwaAverager> s(new SwaAverager());
  s->elements_ = elements;
  TANDEM_ASSIGN_OR_RETURN(s->average_,
                          FloatBuffer(allocator, elements, MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(s->snapshot_,
                          FloatBuffer(allocator, elements, MemoryCategory::kParameters));
  return s;
}

SwaAverager::~SwaAverager() { Wait(); }

void SwaAverager::Wait() {
  if (folder_.joinable()) folder_.join();
}

void SwaAverager::Fold(const float* params) {
  Wait();
  CopyFloats(snapshot_.f32(), params, elements_);
  // Counted here, on the caller's thread, which reads it (found by
  // ThreadSanitizer when the fold counted it).
  const int64_t before = models_++;
  folder_ = std::thread([this, before] {
    const float* x = snapshot_.f32();
    float* avg = average_.f32();
    const int64_t n = elements_;
    if (before == 0) {
      CopyFloats(avg, x, n);
    } else {
      const float w = 1.0f / static_cast<float>(before + 1);
      for (int64_t i = 0; i < n; ++i) avg[i] += (x[i] - avg[i]) * w;
    }
  });
}

absl::StatusOr<tandem::v1::JobEvent::EvalResult> SwaAverager::Evaluate(
    const Model& model, const tandem::v1::JobSpec& resolved, const float* buffers,
    const Dataset& train, const Dataset* test, Allocator* allocator) {
  Wait();
  TANDEM_ASSIGN_OR_RETURN(Buffer params,
                          FloatBuffer(allocator, elements_, MemoryCategory::kParameters));
  TANDEM_ASSIGN_OR_RETURN(
      Buffer stats, FloatBuffer(allocator, model.buffer_elements(), MemoryCategory::kParameters));
  CopyFloats(params.f32(), average_.f32(), elements_);
  CopyFloats(stats.f32(), buffers, model.buffer_elements());
  const SharedWeights shared{params.f32(), stats.f32()};
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> runner,
                          CpuRunner::Create(model, resolved.optimizer(), MaxBatch(resolved),
                                            resolved.training().seed(), allocator, &shared));
  if (model.buffer_elements() > 0) {
    // Batch n (from 1) moves the statistics by 1/n: their plain average.
    BatchLoader loader(train, resolved.training().batch_size(), /*shuffle=*/false, 0);
    StepOptions options;
    options.seed = resolved.training().seed();
    for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      options.step = b;
      options.running_stats_momentum = 1.0f / static_cast<float>(b + 1);
      TANDEM_RETURN_IF_ERROR(runner->TrainingForward(loader.Next(), options));
    }
  }
  if (test == nullptr) return tandem::v1::JobEvent::EvalResult();
  return EvaluateSplit(*runner, *test, resolved.training().eval_batch_size());
}

}  // namespace tandem
