// Jobs from submission to their end: validation, durable acceptance, the queue
// (priority, then submit order), admission by memory against the daemon's host
// and accelerator budgets (so concurrent jobs never oversubscribe), one runner
// thread per running job, cancellation at step boundaries, recovery after a
// crash, and a graceful stop that checkpoints running jobs and re-queues them.
//
// State lives in the JobStore; the latest record of every unfinished job is
// also kept here, with its EventLog, so GetJob and WatchJob see live progress.
// Thread-safe: RPC handlers, the scheduler and runner threads all call in.
#ifndef TANDEM_SERVER_JOB_MANAGER_H_
#define TANDEM_SERVER_JOB_MANAGER_H_

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "node/closed_loop.h"
#include "node/placement.h"
#include "runtime/core/allocator.h"
#include "runtime/dist/rank_step.h"
#include "runtime/profile/job_telemetry.h"
#include "runtime/train/job_model.h"
#include "runtime/train/trainer.h"
#include "server/event_log.h"
#include "server/path_policy.h"
#include "server/server_metrics.h"
#include "server/store/job_store.h"

namespace tandem::server {

// A distributed job's run as its rank 0 sees it (server/cluster/ranks.h makes
// it; docs/distributed.md).
struct DistributedRun {
  // Rank 0's runner: starts the other ranks on their nodes and joins them.
  RunnerFactory factory;
  // Shared with rank 0's runner: a stop of the job stops every rank together.
  std::shared_ptr<StopVote> vote;
  // After the run, whatever its end: stops the ranks still running elsewhere.
  std::function<void()> end;
  // A failed run's status with each other rank's state appended.
  std::function<absl::Status(const absl::Status&)> explain;
  // Each rank's node, rank 0 ("self") first, once the factory has run.
  std::shared_ptr<std::vector<std::string>> nodes;
};

struct JobManagerOptions {
  // Checkpoints go to <state_dir>/jobs/<id>/checkpoints.
  std::string state_dir;
  PathPolicy data_policy;
  int64_t host_memory_budget_bytes = 0;
  int64_t accelerator_memory_budget_bytes = 0;
  bool has_accelerator = false;
  // OpenMP threads of a job that does not say; 0 = all cores.
  int default_threads = 0;
  // Jobs running at once; more wait for a slot (memory permitting). 0 = no limit.
  int max_running_jobs = 0;
  // Submits are refused (RESOURCE_EXHAUSTED) while the state directory's file
  // system has less free space than this, kept for running jobs' records.
  int64_t state_min_free_bytes = 64 << 20;
  // Events each job keeps in the store besides its state changes (the newest
  // ones); 0 = all.
  int64_t events_kept_per_job = 10000;
  // A job recovered at start whose memory could not be estimated (its data
  // not mounted yet, its device not visible yet) waits queued and is
  // estimated again this often, instead of failing.
  absl::Duration estimate_retry_interval = absl::Seconds(30);
  // ... for at most this long from tandemd's start (tandemd's --resume_wait):
  // then it fails with the last reason, so that an error that will not pass
  // (a spec this version refuses, data gone for good) ends the job rather
  // than keeping it queued for the daemon's life.
  absl::Duration resume_wait = absl::Hours(24);
  // The node's hardware. When set, jobs with an accelerator are planned at
  // submission (refused with RESOURCE_EXHAUSTED when no plan fits, the plan
  // recorded in the job) and run through the plan executor. Unset: every job
  // runs on the CPU engine and jobs asking for an accelerator are refused.
  std::optional<node::NodeOffer> node;
  // Distributed jobs (distributed.replicas > 1). `admit_distributed` checks at
  // submission that the cluster has nodes for the ranks; `begin_distributed`
  // makes each run's rank 0. Unset: such jobs are refused (no --peers).
  std::function<absl::Status(const tandem::v1::JobSpec& resolved)> admit_distributed;
  // `checkpoint_dir` is the job's, where a partitioned job's manifests say
  // which node holds each rank's partition.
  std::function<DistributedRun(const tandem::v1::Job& job, const std::string& checkpoint_dir)>
      begin_distributed;
  // Tests: called by Submit once the job's record is stored, before its entry
  // is live.
  std::function<void(const std::string& id)> on_job_stored;
  // Overrides the runner (tests); null = placement's MakeRunnerFactory when
  // `node` is set, else the CPU engine.
  RunnerFactory make_runner;
};

// Memory a job needs, estimated from its model before it runs, in bytes.
struct MemoryEstimate {
  int64_t parameter_bytes = 0;
  // What this rank keeps: 1/N of the whole for a ZeRO-partitioned rank on the
  // CPU engine (docs/distributed.md).
  int64_t optimizer_state_bytes = 0;
  int64_t optimizer_state_total_bytes = 0;
  int64_t activation_bytes = 0;
  int64_t data_bytes = 0;
  // What the update rule adds (workers, replicas, SWA's average).
  int64_t update_rule_bytes = 0;
  // The emulated accelerator's arena: host memory, but not the job's host
  // allocator's.
  int64_t emulated_bytes = 0;
  // All of the above on the host, and the accelerator's capacity for the job.
  int64_t host_bytes = 0;
  int64_t accelerator_bytes = 0;
  std::string Describe() const;
  // What the job's runner may allocate on the host: host_bytes less the
  // dataset's and the emulated accelerator's parts, which are held apart.
  int64_t RunnerHostBytes() const { return host_bytes - data_bytes - emulated_bytes; }
};

class JobManager {
 public:
  JobManager(JobManagerOptions options, JobStore* store, ServerMetrics* metrics);
  ~JobManager();

  // Loads unfinished jobs: QUEUED stay queued; RUNNING (an unclean stop) are
  // re-queued to resume from their last checkpoint. Call once before Start().
  absl::Status Recover();
  // Starts the scheduler.
  void Start();
  // Stops admitting, asks running jobs to checkpoint and stop, re-queues them for
  // the next start, ends every watch stream, and waits for the runners.
  void Shutdown();

  struct Submitted {
    tandem::v1::Job job;
    bool created = false;
  };
  // Validates (INVALID_ARGUMENT naming "spec.<field>"), checks the job fits the
  // budgets (RESOURCE_EXHAUSTED with the numbers), applies request_id
  // idempotency (ALREADY_EXISTS on a different spec), and stores the job durably
  // before returning. UNAVAILABLE while shutting down.
  absl::StatusOr<Submitted> Submit(const tandem::v1::JobSpec& spec, const std::string& request_id);
  absl::StatusOr<tandem::v1::Job> Get(const std::string& id);
  absl::StatusOr<JobPage> List(const JobFilter& filter);
  absl::StatusOr<tandem::v1::Job> Cancel(const std::string& id, const std::string& reason);
  // The event log of a job (opened from the store for jobs not held here).
  absl::StatusOr<std::shared_ptr<EventLog>> Events(const std::string& id);
  JobStore* store() { return store_; }
  // A job's events numbered in [from, to) that are not in the store yet:
  // waiting for the persister, being written now, or held for a retry (a
  // full or locked disk), and state changes the store refused (kept with
  // their job until it takes them). In order, at most `max`. A watcher reads them
  // before it concludes that events below the in-memory log were lost.
  std::vector<tandem::v1::JobEvent> UnstoredEvents(const std::string& id, uint64_t from,
                                                   uint64_t to, int max);

  // Validation and the estimate alone, for PlanModel/ProfileModel and tests.
  struct Resolved {
    tandem::v1::JobSpec spec;
    MemoryEstimate estimate;
    // The plan the job would run under and its step program (both empty on
    // the CPU engine).
    tandem::v1::Plan plan;
    tandem::v1::Schedule program;
    // What the plan's prediction came from (PlanRecord.cost_source).
    std::string cost_source;
    // Why spec.precision is what it is (Job.precision_reason).
    std::string precision_reason;
    // Why spec.distributed.sharding is what it is (Job.distributed_reason).
    std::string distributed_reason;
  };
  // With `plan` false, the plan and program stay empty (nothing is solved).
  absl::StatusOr<Resolved> Resolve(const tandem::v1::JobSpec& spec, bool plan = true) const;
  // Resolve's plan for `r.spec` (its cost source, plan, program, estimate):
  // PlanRanks for a distributed job on accelerators, PlanHere for the
  // others; PlannedFrom sets r.cost_source and gives the cached layer
  // profile it was planned from, if any.
  std::optional<tandem::v1::Profile> PlannedFrom(const JobModel& jm, const node::NodeOffer& offer,
                                                 Resolved& r) const;
  absl::Status PlanRanks(const JobModel& jm, const node::NodeOffer& offer, Resolved& r) const;
  absl::Status PlanHere(const JobModel& jm, const node::NodeOffer& offer, Resolved& r) const;
  // PipelineCorrections on `offer`.
  std::optional<node::PipelineCorrections> CorrectionsHere(const Model& model,
                                                           const tandem::v1::JobSpec& resolved,
                                                           const node::NodeOffer& offer,
                                                           const tandem::v1::Profile* base) const;
  // A distributed job's rank plan timed as one of its ranks runs it
  // (node::TimeAsRank), with the collectives this node's latest job of as
  // many ranks measured (node::CollectiveProfileCache), or free when none
  // has: what its cost source gains ("; as one of N ranks ...").
  // `measured`: the rank's layer profile the plan was solved from, if any.
  std::string CountCollectives(const Model& model, const tandem::v1::JobSpec& resolved,
                               const node::NodeOffer& offer, const tandem::v1::Profile* measured,
                               tandem::v1::Plan& plan) const;
  // `plan`: a distributed job's stored plan (its rank plan), which says what
  // the coordinator's rank keeps on its host.
  absl::StatusOr<MemoryEstimate> Estimate(const tandem::v1::JobSpec& resolved,
                                          const tandem::v1::Plan* plan = nullptr) const;

  // Host memory for work outside jobs (a ProfileModel's measurements), held
  // while the returned handle lives: jobs are admitted against what is left,
  // and the queue is woken when it goes back. RESOURCE_EXHAUSTED at once, with
  // the numbers, when `bytes` do not fit beside what is already reserved.
  // `yield_to_queue` (ProfileModel's and PlanModel's holds): also refused
  // when the queue's next job would start but for such holds, so that a
  // stream of them cannot keep it waiting once the running jobs have made
  // room; while it waits for running jobs they are taken on what is free. A
  // distributed job's rank does not yield.
  absl::StatusOr<std::shared_ptr<void>> HoldHostMemory(int64_t bytes, const std::string& what,
                                                       bool yield_to_queue = false);

  struct Snapshot {
    std::map<tandem::v1::JobState, int64_t> jobs_by_state;
    int64_t queued = 0;
    int64_t reserved_host_bytes = 0;
    int64_t reserved_accelerator_bytes = 0;
    // Summed over running jobs' allocators, by category.
    MemoryStats host_memory;
    bool accepting = true;
    // Why not, when not accepting.
    std::string not_accepting_reason;
  };
  // Read without the job manager's lock (from figures published under it
  // wherever they change), so that GetNode and a metrics scrape answer while
  // a store write holds that lock: an fsync on a slow disk must not make a
  // peer's 2 s health check late. The store's counts are its own reads.
  Snapshot TakeSnapshot();
  // The health watchdog's probe: why jobs are not accepted ("" when they are),
  // through the lock every job RPC takes, so that a probe that does not return
  // means a daemon that cannot answer (a store write stuck on a failing disk).
  std::string ProbeNotAccepting();
  // What the watchdog found when its probe has been stuck past its deadline
  // ("" once probes return): TakeSnapshot reports it as not accepting, so
  // that peers see the node unhealthy at once rather than after late checks.
  void SetUnresponsive(const std::string& reason);
  const JobManagerOptions& options() const { return options_; }

  // The node jobs are planned on now: options().node, or what ReplaceNode
  // gave since (GetNode's refresh_profile). Null when options().node is
  // unset. Jobs submitted after a ReplaceNode are planned on the new offer; a
  // run takes the offer current when it starts (its runner, its plan loop).
  std::shared_ptr<const node::NodeOffer> node() const;
  void ReplaceNode(node::NodeOffer offer);
  // For measuring the node: while the returned handle lives no queued job
  // starts and `bytes` of host memory are held. FAILED_PRECONDITION while a
  // job runs (it would be measured with the node); RESOURCE_EXHAUSTED when the
  // memory does not fit.
  absl::StatusOr<std::shared_ptr<void>> ReserveNodeForMeasuring(int64_t bytes);
  // The layer profile a run of `model` measured on this node for `resolved`
  // (node::LayerProfileCache; a stale or corrupt file is ignored with a log
  // line), for PlanModel.
  std::optional<tandem::v1::Profile> MeasuredLayerProfile(
      const Model& model, const tandem::v1::JobSpec& resolved) const;
  // The corrections an earlier run of `resolved`'s pipeline measured on this
  // node over `base` (the layer profile it is planned from; null: the
  // analytic one), as a submission plans with them (node::PipelineCorrectionCache),
  // for PlanModel.
  std::optional<node::PipelineCorrections> PipelineCorrections(
      const Model& model, const tandem::v1::JobSpec& resolved,
      const tandem::v1::Profile* base) const;

 private:
  struct Entry;
  void SchedulerLoop();
  // Starts every queued job that fits, in queue order; explains the rest.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queued jobs in the order ScheduleLocked considers them.
  std::vector<Entry*> QueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job ScheduleLocked would start next if memory allowed: the first
  // queued job not waiting for a restart or an estimate; null when none, or
  // when no job can start for another reason (a measurement, the run slots,
  // a read-only store).
  const Entry* NextToStartLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether ScheduleLocked passes over a queued job for now, whatever the
  // memory: a distributed job waiting to restart, or one waiting for its
  // estimate.
  static bool WaitsForItsOwnReason(const Entry& e);
  void RunJob(std::shared_ptr<Entry> entry);
  // Logs a warning when the runner did not take the record's stored program.
  void ReportReplacedProgram(const tandem::v1::Job& job, Entry& entry, const StepRunner& runner);
  // A run's pieces: the trainer's options and callbacks for the job, what each
  // step and checkpoint write into the record, and the record at the end.
  TrainerOptions TrainerOptionsFor(const tandem::v1::Job& job, Entry& entry, bool resolved,
                                   const std::shared_ptr<const node::NodeOffer>& offer);
  TrainerCallbacks CallbacksFor(const std::string& id, std::shared_ptr<Entry> entry);
  void RecordStep(Entry& entry, const tandem::v1::JobEvent::StepProgress& p,
                  prometheus::Counter& steps_total) ABSL_LOCKS_EXCLUDED(mu_);
  void RecordCheckpoint(Entry& entry, const tandem::v1::JobEvent::CheckpointSaved& c)
      ABSL_LOCKS_EXCLUDED(mu_);
  // `stopping`: this tandemd is shutting down (a CANCELLED run without a
  // cancel is then its own stop, else a peer's).
  static std::pair<tandem::v1::JobState, std::string> EndOfRun(const Entry& entry,
                                                               const absl::Status& status,
                                                               bool stopping);
  void FinishRun(Entry& entry, Trainer* trainer, const absl::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Feeds the job's always-on telemetry from its runner and serves it.
  void TrackTelemetry(const std::string& id, Entry& entry, Trainer* trainer)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Closed-loop planning of the run (node/closed_loop.h): its checks, log
  // lines and re-plans go to the job's record, events and metrics.
  void StartPlanLoop(std::shared_ptr<Entry> entry, Trainer& trainer,
                     const std::shared_ptr<const node::NodeOffer>& offer) ABSL_LOCKS_EXCLUDED(mu_);
  // Keeps a pipeline's stage corrections (node::PipelineCorrectionCache) for
  // the next such job; `measured` says what they came from.
  void KeepCorrections(const std::string& job_id, const node::PlanLoop& loop,
                       const node::PipelineCorrections& corrections, const std::string& measured)
      ABSL_LOCKS_EXCLUDED(mu_);
  void RecordReplan(Entry& entry, const std::string& job_id, const node::PlanLoop& loop,
                    const node::PlanLoop::Decision& d, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // The re-plan `d` at `step` in the job's record, history and metrics.
  void ApplyReplan(Entry& entry, const node::PlanLoop::Decision& d, int64_t step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `change` to the entry's record under mu_, then the record written without
  // it (WriteRecord); a write the store refuses is logged as the `what` of
  // the job ("checkpoint").
  void ChangeAndWrite(Entry& entry, const char* what, const std::function<void()>& change)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Writes `record`, the entry's record as of `version` (Entry::record_version),
  // with `events`, unless a later version is stored already. Without mu_ or
  // under it (never mu_ after the entry's write lock).
  absl::Status WriteRecord(Entry& entry, const tandem::v1::Job& record, uint64_t version,
                           const std::vector<tandem::v1::JobEvent>& events = {},
                           JobStore::Priority priority = JobStore::Priority::kNormal);
  // Drops a finished job's per-job series from the metrics.
  void ForgetJobSeries(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends a job that is not running (queued) in `state`: its end recorded (or
  // kept to record), its log closed, its series kept among the finished.
  void EndQueuedLocked(Entry& entry, tandem::v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that ended keeps its series among the kFinishedSeriesKept newest.
  void KeepSeriesOfFinished(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The live entry of `stored` (job `id`'s record, read from the store after
  // live_ had no entry for it), once its submission has made it live; null
  // for a job that ended. A just-submitted job's record is committed before
  // its entry is live: without this, a WatchJob in that window closed at once
  // and a CancelJob said it had already ended.
  std::shared_ptr<Entry> ArrivingEntry(const std::string& id, const tandem::v1::Job& stored)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<tandem::v1::Job> CancelLocked(std::shared_ptr<Entry> entry,
                                               const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves a job to `state`, appends the state event and persists both.
  absl::Status Transition(Entry& entry, tandem::v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A state change the store refused: kept with its job, written again by
  // RetryUnrecorded, and served to watchers meanwhile (refused_events_).
  void HoldRefused(Entry& entry, const tandem::v1::JobEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AppendEvent(Entry& entry, tandem::v1::JobEvent event);
  void PersistLoop();
  void FlushEvents();
  // Estimates again the jobs Recover could not estimate; each that now fits
  // is scheduled, each past the budgets fails.
  void RetryEstimates() ABSL_LOCKS_EXCLUDED(mu_);
  // RetryEstimates every estimate_retry_interval until the manager stops.
  void EstimateLoop();
  // A distributed job whose ranks share a node's cores and that sets no
  // training.threads gets its part of them per rank; the reason's addition
  // saying so ("" when unchanged).
  std::string ShareCoresAmongRanks(const node::NodeOffer& offer,
                                   tandem::v1::JobSpec& resolved) const;
  // The event log of a job live in this daemon, its numbers after `last` and
  // reserved in the store before they are handed out (event_log.h); those
  // through `reserved` are already.
  std::shared_ptr<EventLog> LiveLog(const std::string& id, uint64_t last, uint64_t reserved = 0);
  // Writes the records a full or failing disk kept in memory (state changes,
  // a job's end); a job whose end is recorded leaves live_.
  void RetryUnrecorded() ABSL_LOCKS_EXCLUDED(mu_);
  // RESOURCE_EXHAUSTED when the state directory's free space is below
  // --state_min_free_bytes: submits stop while running jobs still have room to
  // record their steps and ends.
  absl::Status CheckStateSpace() const;
  // A distributed job needs the cluster's nodes (options_.admit_distributed);
  // FAILED_PRECONDITION without a cluster. OK for the others.
  absl::Status AdmitDistributed(const tandem::v1::JobSpec& resolved) const;
  // RESOURCE_EXHAUSTED when a job needs more than the node's budgets hold at all.
  absl::Status CheckBudgets(const MemoryEstimate& estimate) const;
  void UpdateJobMetrics(const Entry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies what TakeSnapshot reports (reservations, the queue, running jobs'
  // allocators, accepting_) to published_; called wherever one changes.
  void PublishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobManagerOptions options_;
  JobStore* const store_;
  ServerMetrics* const metrics_;

  absl::Mutex mu_;
  // Measured layer profiles by model and node, under <state_dir>/layer_profiles.
  const node::LayerProfileCache layer_profiles_;
  // Distributed jobs' measured collectives, under <state_dir>/collectives.
  const node::CollectiveProfileCache collective_profiles_;
  // Pipeline jobs' measured stage corrections, under <state_dir>/pipeline_corrections.
  const node::PipelineCorrectionCache pipeline_corrections_;
  mutable absl::Mutex node_mu_;
  std::shared_ptr<const node::NodeOffer> node_ ABSL_GUARDED_BY(node_mu_);
  std::map<std::string, std::shared_ptr<Entry>> live_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_host_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_accelerator_ ABSL_GUARDED_BY(mu_) = 0;
  // The part of reserved_host_ that yielding holds (HoldHostMemory) take.
  int64_t yielding_held_host_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  // ReserveNodeForMeasuring's holds: no job starts while > 0.
  int measuring_ ABSL_GUARDED_BY(mu_) = 0;
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool dirty_ ABSL_GUARDED_BY(mu_) = false;
  // Submits between their record's commit and their entry in live_: a stored
  // job that has not ended and is not live yet is one of theirs
  // (ArrivingEntry).
  int submitting_ ABSL_GUARDED_BY(mu_) = 0;
  // Runner threads with their entries; joined once the entry says it is done.
  // Each running thread with its own done flag (set as its last action).
  std::vector<std::pair<std::shared_ptr<std::atomic<bool>>, std::thread>> runners_
      ABSL_GUARDED_BY(mu_);
  // Finished jobs whose per-job metric series are still exported, oldest first.
  std::deque<std::string> finished_series_ ABSL_GUARDED_BY(mu_);
  std::thread scheduler_;

  // TakeSnapshot's figures. Taken after mu_ where both are held, never before.
  struct Published {
    int64_t reserved_host_bytes = 0;
    int64_t reserved_accelerator_bytes = 0;
    int64_t queued = 0;
    bool accepting = true;
    // Running jobs' allocators; one is taken out (under published_mu_)
    // before it is destroyed.
    std::vector<const HostAllocator*> allocators;
    std::string unresponsive;
  };
  mutable absl::Mutex published_mu_ ABSL_ACQUIRED_AFTER(mu_);
  Published published_ ABSL_GUARDED_BY(published_mu_);

  // One FlushEvents at a time, so that it returns once what was pending when
  // it was called is written or held for a retry.
  absl::Mutex flush_mu_ ABSL_ACQUIRED_BEFORE(persist_mu_);
  // Events waiting to be written by the persister (batched, off the training path).
  absl::Mutex persist_mu_;
  std::vector<tandem::v1::JobEvent> pending_events_ ABSL_GUARDED_BY(persist_mu_);
  // The batch FlushEvents is writing (null between writes): not stored yet,
  // no longer pending.
  std::shared_ptr<std::vector<tandem::v1::JobEvent>> in_flight_events_ ABSL_GUARDED_BY(persist_mu_);
  bool persist_stop_ ABSL_GUARDED_BY(persist_mu_) = false;
  bool event_write_failing_ ABSL_GUARDED_BY(persist_mu_) = false;
  // Each job's state changes the store refused (Entry::unrecorded), for
  // UnstoredEvents, which must not take mu_ (a watcher's lock is taken after
  // mu_ where an event wakes it).
  std::map<std::string, std::vector<tandem::v1::JobEvent>> refused_events_
      ABSL_GUARDED_BY(persist_mu_);
  std::thread persister_;
  std::thread estimator_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_JOB_MANAGER_H_
