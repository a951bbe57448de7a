#include "server/job_manager.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "planner/planner.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/train/job_model.h"
#include "runtime/train/update_rules.h"
#include "spec/job_spec.h"
#include "spec/precision.h"

namespace tandem::server {

using google::protobuf::util::TimeUtil;
using tandem::v1::Job;
using tandem::v1::JobEvent;
using tandem::v1::JobState;

namespace {

constexpr int kMaxRequestIdLength = 128;
// Per-job metric series of finished jobs kept for dashboards; older ones go.
constexpr size_t kFinishedSeriesKept = 50;
// tandem_job_update_lagged_updates: a series per lag below this, the rest in
// one labelled "64+".
constexpr int kMaxLagLabel = 64;
// The phases of tandem_job_pipeline_stage_seconds: what is set is what goes.
constexpr const char* kPipelinePhases[] = {"busy",      "bubble",       "copy",
                                           "peer_copy", "weight_fetch", "update"};
// UpdateStats.rule's values (job.proto), the labels of tandem_job_update_rule_info.
constexpr const char* kUpdateRules[] = {"synchronous", "hogwild",          "easgd",
                                        "swa",         "parameter_server", "pipedream"};

bool IsTerminal(JobState s) {
  return s == tandem::v1::JOB_STATE_SUCCEEDED || s == tandem::v1::JOB_STATE_FAILED ||
         s == tandem::v1::JOB_STATE_CANCELLED;
}

const char* StateLabel(JobState s) {
  switch (s) {
    case tandem::v1::JOB_STATE_QUEUED:
      return "queued";
    case tandem::v1::JOB_STATE_RUNNING:
      return "running";
    case tandem::v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case tandem::v1::JOB_STATE_FAILED:
      return "failed";
    case tandem::v1::JOB_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unspecified";
  }
}

// Prefixes a spec-relative field path with "spec." and makes every
// data problem an INVALID_ARGUMENT about its field.
absl::Status AsSpecError(const absl::Status& s) {
  if (s.ok()) return s;
  absl::StatusCode code = s.code();
  if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kDataLoss) {
    code = absl::StatusCode::kInvalidArgument;
  }
  if (code != absl::StatusCode::kInvalidArgument) return s;
  return absl::Status(code, absl::StrCat("spec.", s.message()));
}

absl::Status ValidateRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: at most ", kMaxRequestIdLength, " characters, got ", id.size()));
  }
  for (char c : id) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == ':' ||
          c == '-')) {
      return absl::InvalidArgumentError("request_id: only [A-Za-z0-9._:-] are allowed");
    }
  }
  return absl::OkStatus();
}

bool SameSpec(const tandem::v1::JobSpec& a, const tandem::v1::JobSpec& b) {
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// The largest step program a job record keeps (Job.schedule).
constexpr size_t kMaxStoredProgramBytes = size_t{1} << 20;
// Plans a job record keeps in its history: the first and the latest.
constexpr int kPlanHistoryKept = 16;

// A plan as its job's history keeps it: without its predicted timeline.
tandem::v1::PlanRecord PlanRecordOf(const tandem::v1::Plan& plan, std::string cost_source,
                                    int64_t from_step) {
  tandem::v1::PlanRecord record;
  *record.mutable_plan() = plan;
  record.mutable_plan()->clear_timeline();
  record.set_cost_source(std::move(cost_source));
  record.set_predicted_step_seconds(plan.prediction().iteration_seconds());
  record.set_from_step(from_step);
  return record;
}

// tandem_replans_total's `reason` label.
const char* ReplanLabel(tandem::v1::ReplanReason reason) {
  switch (reason) {
    case tandem::v1::REPLAN_REASON_STEP_TIME:
      return "step_time";
    case tandem::v1::REPLAN_REASON_RESOURCE_BUSY:
      return "resource_busy";
    default:
      return "slower";
  }
}

// The optimizer state, in bytes, of `states` moments that one of `n` ranks
// keeps of `cut` weights in `cut_layers` layers cut into pieces (of each
// bucket 1/N and a float more at most, a bucket per layer at most) and of
// `whole` weights it keeps whole.
int64_t PartitionedStateBytes(int states, int64_t n, int64_t cut, int64_t cut_layers,
                              int64_t whole) {
  return states * ((cut + n - 1) / n + cut_layers + whole) * int64_t{4};
}

// The optimizer state a ZeRO-partitioned rank running `plan` (not hetero_dp)
// keeps on its host, in bytes: its pieces of the layers the plan updates
// there and the whole state of the others (PlanExecutor's compact host
// moments); `whole` where the plan is not one of those.
int64_t PlanRankStateBytes(const Model& m, const tandem::v1::Plan& plan, int states, int64_t n,
                           int64_t whole) {
  if (plan.strategy() == tandem::v1::STRATEGY_HETERO_DP || plan.pipeline_size() > 0 ||
      plan.layers_size() != m.num_layers()) {
    return whole;
  }
  int64_t host = 0, host_layers = 0, other = 0;
  for (int l = 0; l < m.num_layers(); ++l) {
    if (plan.layers(l).update() == tandem::v1::PLACEMENT_HOST) {
      host += m.param_slice(l);
      ++host_layers;
    } else {
      other += m.param_slice(l);
    }
  }
  return std::min(whole, PartitionedStateBytes(states, n, host, host_layers, other));
}

// The host's fp32 master weights and gradients and running statistics, in
// bytes, and in bf16 on an accelerator the executor's working copies: a bf16
// copy of the weights and a bf16 gradient, 4 bytes a weight (unless `plan`,
// when known, updates nothing on the host). A ZeRO-partitioned rank of a bf16
// plan keeps its pieces of the masters, cut as its moments (PlanExecutor).
int64_t HostWeightBytes(const Model& m, const tandem::v1::JobSpec& resolved,
                        const tandem::v1::Plan* plan, bool partitioned) {
  const int64_t P = m.parameter_elements();
  const bool working_copies =
      resolved.precision() == tandem::v1::PRECISION_BF16 &&
      resolved.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE &&
      (plan == nullptr || KeepsWorkingCopies(m, *plan));
  int64_t masters = P * 4;
  if (partitioned && working_copies && plan != nullptr) {
    masters = PlanRankStateBytes(m, *plan, 1, resolved.distributed().replicas(), masters);
  }
  return masters + P * 4 + (working_copies ? P * 4 : 0) + m.buffer_elements() * 4;
}

}  // namespace

std::string MemoryEstimate::Describe() const {
  return absl::StrCat(
      "parameters and gradients ", FormatBytes(parameter_bytes, 1), ", optimizer state ",
      FormatBytes(optimizer_state_bytes, 1),
      optimizer_state_bytes < optimizer_state_total_bytes
          ? absl::StrCat(" (this rank's pieces of ", FormatBytes(optimizer_state_total_bytes, 1),
                         ")")
          : "",
      ", activations ", FormatBytes(activation_bytes, 1), ", data ", FormatBytes(data_bytes, 1),
      update_rule_bytes > 0 ? absl::StrCat(", update rule ", FormatBytes(update_rule_bytes, 1))
                            : "");
}

struct JobManager::Entry {
  Job job;
  std::shared_ptr<EventLog> log;
  MemoryEstimate estimate;
  std::atomic<bool> stop{false};
  // A distributed run's stop vote, while it runs: a cancel or a shutdown
  // requests it at once, which also ends a rendezvous still waiting.
  std::shared_ptr<StopVote> vote;
  bool cancel_requested = false;
  std::string cancel_reason;
  bool running = false;
  // State-change events the store refused (a full disk): written again with
  // the job's record by RetryUnrecorded; the job stays live until then.
  std::vector<JobEvent> unrecorded;
  std::unique_ptr<HostAllocator> allocator;
  // The always-on telemetry of the current run (null before it starts): held
  // here so the sink the runner feeds outlives the run, whatever the metrics
  // collector forgets meanwhile.
  std::shared_ptr<profile::JobTelemetry> telemetry;
  int64_t seq = 0;
  // Distributed jobs: when the current run of rank losses began (a run that
  // trains a step ends it), and no restart before `not_before`.
  absl::Time fault_since = absl::InfiniteFuture();
  absl::Time not_before = absl::InfinitePast();
  // Recovery could not estimate its memory (why): it waits, queued, for
  // RetryEstimates instead of being scheduled, until `estimate_deadline`.
  std::string estimate_error;
  absl::Time estimate_deadline = absl::InfiniteFuture();
  // The record's writes (WriteRecord) land in the order their copies were
  // taken: each copy to write takes the next version under mu_, and one
  // older than the version stored is not written (the newer copy holds its
  // change). Checkpoints and re-plans write without mu_, so that reads and
  // other jobs' steps do not wait on the disk; state changes and cancels
  // write under it.
  uint64_t record_version = 0;   // under mu_
  absl::Mutex write_mu;          // after mu_ where both are held
  uint64_t written_version = 0;  // under write_mu
};

JobManager::JobManager(JobManagerOptions options, JobStore* store, ServerMetrics* metrics)
    : options_(std::move(options)),
      store_(store),
      metrics_(metrics),
      layer_profiles_(options_.state_dir.empty() ? "" : options_.state_dir + "/layer_profiles"),
      collective_profiles_(options_.state_dir.empty() ? "" : options_.state_dir + "/collectives"),
      pipeline_corrections_(
          options_.state_dir.empty() ? "" : options_.state_dir + "/pipeline_corrections"),
      node_(options_.node ? std::make_shared<const node::NodeOffer>(*options_.node) : nullptr) {
  persister_ = std::thread([this] { PersistLoop(); });
  // Its own thread: an estimate reads data files, which may hang on the very
  // mount that is not back yet, and must not hold up the events' flushing.
  estimator_ = std::thread([this] { EstimateLoop(); });
  metrics_->device_memory_budget.Add({{"device", "cpu"}}).Set(options_.host_memory_budget_bytes);
  // Every terminal state's counter exists from the start at 0, so increase()
  // and rate() see the first failure (a series born at 1 shows no increase).
  for (JobState s : {tandem::v1::JOB_STATE_SUCCEEDED, tandem::v1::JOB_STATE_FAILED,
                     tandem::v1::JOB_STATE_CANCELLED}) {
    metrics_->jobs_finished.Add({{"state", StateLabel(s)}});
  }
}

JobManager::~JobManager() {
  Shutdown();
  {
    absl::MutexLock lock(&persist_mu_);
    persist_stop_ = true;
  }
  if (persister_.joinable()) persister_.join();
  if (estimator_.joinable()) estimator_.join();
}

namespace {

// Memory of a built model at the spec's batch sizes.
// `rank_plan`: a distributed job's plan for its ranks (node::RankPlan), when
// it has one and its spec pins none.
absl::StatusOr<MemoryEstimate> EstimateModel(const tandem::v1::JobSpec& resolved,
                                             const JobModel& jm, const node::NodeOffer* node,
                                             const tandem::v1::Plan* rank_plan = nullptr) {
  const Model& m = *jm.model;
  // A data-parallel rank computes on its share of each batch (RankBatch).
  const int ranks = std::max(1, resolved.distributed().replicas());
  const int64_t max_batch = (MaxBatch(resolved) + ranks - 1) / ranks;
  MemoryEstimate e;
  int states = 2;
  if (resolved.optimizer().kind() == tandem::v1::OPTIMIZER_KIND_SGD) {
    states = resolved.optimizer().momentum() > 0 ? 1 : 0;
  }
  e.optimizer_state_bytes = e.optimizer_state_total_bytes = states * m.parameter_elements() * 4;
  const tandem::v1::DistributedSpec& d = resolved.distributed();
  const bool partitioned =
      d.replicas() > 1 && d.sharding() == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED;
  // The plan the job runs, where known: pinned in its spec (a distributed
  // run's ranks have it there, server/cluster/ranks.cc), or the rank plan the
  // coordinator solved at submission, the job's plan.
  const tandem::v1::Plan* plan = resolved.placement().has_plan() ? &resolved.placement().plan()
                                 : rank_plan != nullptr && node::IsRankPlan(m, resolved, *rank_plan)
                                     ? rank_plan
                                     : nullptr;
  if (partitioned && resolved.placement().accelerator() == tandem::v1::ACCELERATOR_KIND_NONE) {
    // A CPU-engine rank allocates its pieces of every layer's state alone.
    e.optimizer_state_bytes =
        PartitionedStateBytes(states, d.replicas(), m.parameter_elements(), m.num_layers(), 0);
  } else if (partitioned && plan != nullptr) {
    // A rank running a plan keeps the whole state of the layers its
    // accelerator updates: known once the plan is. Without it the rank
    // reserves the whole.
    e.optimizer_state_bytes =
        PlanRankStateBytes(m, *plan, states, d.replicas(), e.optimizer_state_total_bytes);
  }
  e.parameter_bytes = HostWeightBytes(m, resolved, plan, partitioned);
  int64_t max_output = m.data().sample_shape.elements() * 4 * max_batch;
  for (int l = 0; l < m.num_layers(); ++l)
    max_output = std::max(max_output, m.layer(l).OutputBytes(max_batch));
  e.activation_bytes =
      m.ActivationBytes(max_batch) + 2 * max_output + m.MaxWorkspaceBytes(max_batch);
  e.data_bytes = jm.data.memory_bytes;
  // Allocations are 64-byte aligned, one per layer buffer: a small margin.
  const int64_t margin = 64 * 4 * m.num_layers() + (1 << 20);
  e.update_rule_bytes = UpdateRuleHostBytes(m, resolved, max_batch);
  e.host_bytes = e.parameter_bytes + e.optimizer_state_bytes + e.activation_bytes + e.data_bytes +
                 e.update_rule_bytes + margin;
  // A job may reserve more than it needs, never less: the reservation is what
  // admission counts and what the job's allocator allows, so a smaller figure
  // would let a job past the node's budget and then fail (or, were the limit
  // not enforced, use memory nobody reserved).
  const int64_t asked = resolved.resources().host_memory_bytes();
  if (asked > 0 && asked < e.host_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("resources.host_memory_bytes: ", FormatBytes(asked, 1), " is less than the ",
                     FormatBytes(e.host_bytes, 1), " this job needs (", e.Describe(),
                     "); leave it 0 to reserve what the job needs"));
  }
  if (asked > 0) e.host_bytes = asked;
  const auto kind = resolved.placement().accelerator();
  if (kind != tandem::v1::ACCELERATOR_KIND_NONE) {
    if (!node) {
      return absl::FailedPreconditionError(
          "placement.accelerator: this tandemd runs every job on the CPU engine; use "
          "ACCELERATOR_KIND_NONE");
    }
    TANDEM_ASSIGN_OR_RETURN(const int64_t capacity, node::AcceleratorCapacity(resolved, *node));
    if (kind == tandem::v1::ACCELERATOR_KIND_EMULATED) {
      // A pipeline's stages are an emulated accelerator each, in host memory.
      e.emulated_bytes = capacity * std::max(1, resolved.placement().pipeline().stages());
      e.host_bytes += e.emulated_bytes;
    } else {
      e.accelerator_bytes = capacity;
    }
  }
  return e;
}

}  // namespace

absl::StatusOr<std::shared_ptr<void>> JobManager::HoldHostMemory(int64_t bytes,
                                                                 const std::string& what,
                                                                 bool yield_to_queue) {
  absl::MutexLock lock(&mu_);
  const int64_t budget = options_.host_memory_budget_bytes;
  if (const Entry* next = yield_to_queue && budget > 0 ? NextToStartLocked() : nullptr) {
    const int64_t need = next->estimate.host_bytes;
    const int64_t accelerator = next->estimate.accelerator_bytes;
    const bool accelerator_fits =
        accelerator == 0 ||
        accelerator <= options_.accelerator_memory_budget_bytes - reserved_accelerator_;
    // It would start but for yielding holds, and this one would keep it out.
    if (accelerator_fits && need <= budget - (reserved_host_ - yielding_held_host_) &&
        bytes > budget - reserved_host_ - need) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", FormatBytes(bytes, 1), " of host memory, which queued job ",
          next->job.id(), " starts with (it needs ", FormatBytes(need, 1),
          ") once the profile and plan holds now held end; try again when it has started"));
    }
  }
  if (budget > 0 && bytes > budget - reserved_host_) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, " needs ", FormatBytes(bytes, 1), " of host memory; ",
                     FormatBytes(std::max<int64_t>(0, budget - reserved_host_), 1), " of the ",
                     FormatBytes(budget, 1), " budget (--host_memory_budget) is free now (",
                     FormatBytes(reserved_host_, 1), " reserved); try again when jobs end"));
  }
  reserved_host_ += bytes;
  if (yield_to_queue) yielding_held_host_ += bytes;
  PublishLocked();
  return std::shared_ptr<void>(nullptr, [this, bytes, yield_to_queue](void*) {
    absl::MutexLock lock(&mu_);
    reserved_host_ -= bytes;
    if (yield_to_queue) yielding_held_host_ -= bytes;
    PublishLocked();
    dirty_ = true;
  });
}

namespace {

// Whether `plan`, timed as a rank, peaks within its accelerator budget.
bool FitsAsRank(const tandem::v1::Plan& plan) {
  const int64_t budget = plan.accelerator_memory_budget_bytes();
  return budget <= 0 || plan.prediction().accelerator_peak_bytes() <= budget;
}

// Whether any layer of `plan` streams its optimizer state in for its update.
bool StreamsState(const tandem::v1::Plan& plan) {
  for (const auto& l : plan.layers()) {
    if (l.stream_optimizer_state()) return true;
  }
  return false;
}

// Why a distributed job's sharding is what it is (Job.distributed_reason;
// empty for one replica).
std::string DistributedReason(const tandem::v1::JobSpec& spec, const tandem::v1::JobSpec& resolved,
                              const MemoryEstimate& estimate) {
  if (resolved.distributed().replicas() <= 1) return "";
  if (spec.distributed().sharding() != tandem::v1::OPTIMIZER_SHARDING_AUTO) return "asked for";
  if (resolved.distributed().sharding() != tandem::v1::OPTIMIZER_SHARDING_PARTITIONED) {
    return "the default (auto): plain SGD keeps no optimizer state to partition, so every rank "
           "updates all the weights after one all-reduce";
  }
  const bool device = resolved.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE;
  // A bf16 plan rank also keeps pieces of the fp32 masters and gathers bf16
  // working copies (PlanExecutor).
  const bool masters = device && resolved.precision() == tandem::v1::PRECISION_BF16;
  return absl::StrCat(
      "the default (auto): the optimizer keeps ",
      FormatBytes(estimate.optimizer_state_total_bytes, 1),
      " of state; partitioned, each rank keeps 1/", resolved.distributed().replicas(),
      device ? " of the part its plan keeps on the host (the state of layers its accelerator "
               "updates stays whole on every rank)"
             : " of it",
      masters ? ", and of those layers' fp32 master weights; their reduce-scatter plus an "
                "all-gather of bf16 copies move 3/4 of the bytes of their replicated all-reduce"
              : ", and a reduce-scatter plus an all-gather move the same bytes as the "
                "replicated all-reduce");
}

}  // namespace

std::string JobManager::ShareCoresAmongRanks(const node::NodeOffer& offer,
                                             tandem::v1::JobSpec& resolved) const {
  const int ranks = node::RanksSharingHost(resolved, offer);
  if (ranks <= 1 || resolved.training().threads() > 0) return "";
  // Each of the ranks on one node runs on its part of the job's cores
  // (--job_threads, else all), not all of them each.
  const int cores =
      options_.default_threads > 0 ? options_.default_threads : std::max(1, offer.host.threads());
  const int each = node::ThreadsPerRank(options_.default_threads, offer.host.threads(), ranks);
  resolved.mutable_training()->set_threads(each);
  return absl::StrCat("; its ", ranks, " ranks on one node share ", cores, " core",
                      cores == 1 ? "" : "s", ": ", each, " thread", each == 1 ? "" : "s",
                      " each (training.threads)");
}

std::string JobManager::CountCollectives(const Model& model, const tandem::v1::JobSpec& resolved,
                                         const node::NodeOffer& offer,
                                         const tandem::v1::Profile* measured,
                                         tandem::v1::Plan& plan) const {
  const int ranks = resolved.distributed().replicas();
  const std::optional<tandem::v1::CollectiveProfile> fits =
      collective_profiles_.Load(resolved, offer);
  // Without figures the collectives are free: the rank's own program still
  // times its updates after their buckets' sums.
  absl::StatusOr<tandem::v1::Plan> timed = node::TimeAsRank(
      model, resolved, offer, plan,
      node::RankSimulation(resolved, fits.value_or(tandem::v1::CollectiveProfile())), measured);
  if (!timed.ok()) return absl::StrCat("; as one device: ", timed.status().message());
  plan = *std::move(timed);
  if (!fits) {
    return absl::StrCat("; as one of ", ranks, " ranks, its collectives not counted: no job of ",
                        ranks,
                        " ranks has measured them here yet (the plan check times them "
                        "from its first window)");
  }
  return absl::StrCat("; as one of ", ranks, " ranks, its collectives as job ", fits->job_id(),
                      "'s rank 0 measured them: ", node::DescribeCollectives(*fits));
}

absl::StatusOr<JobManager::Resolved> JobManager::Resolve(const tandem::v1::JobSpec& spec,
                                                         bool plan) const {
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(spec, options_.has_accelerator);
  if (!resolved.ok()) return AsSpecError(resolved.status());
  TANDEM_ASSIGN_OR_RETURN(
      const PrecisionChoice precision,
      ChoosePrecisionHere(resolved->precision(), LocalComputeFor(*resolved), "spec.precision"));
  resolved->set_precision(precision.precision);
  const PathPolicy& policy = options_.data_policy;
  absl::StatusOr<JobModel> jm = BuildJobModel(
      *resolved,
      [&policy](const std::string& field, const std::string& path) {
        return policy.Resolve(field, path);
      },
      ComputeDType(resolved->precision()));
  if (!jm.ok()) return AsSpecError(jm.status());
  *resolved->mutable_model() = WithPresetDefaults(resolved->model(), jm->data);
  const std::shared_ptr<const node::NodeOffer> offer = node();
  const std::string sharing = offer ? ShareCoresAmongRanks(*offer, *resolved) : "";
  node::ResolveUnsetThreads(options_.default_threads, *resolved);
  absl::StatusOr<MemoryEstimate> estimate = EstimateModel(*resolved, *jm, offer.get());
  if (!estimate.ok()) return AsSpecError(estimate.status());
  Resolved r{*resolved, *estimate, tandem::v1::Plan()};
  r.precision_reason = precision.reason;
  r.distributed_reason = DistributedReason(spec, *resolved, *estimate) + sharing;
  if (!plan || !offer) return r;
  if (resolved->distributed().replicas() > 1 &&
      resolved->placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE) {
    TANDEM_RETURN_IF_ERROR(PlanRanks(*jm, *offer, r));
  } else {
    TANDEM_RETURN_IF_ERROR(PlanHere(*jm, *offer, r));
  }
  return r;
}

std::optional<tandem::v1::Profile> JobManager::PlannedFrom(const JobModel& jm,
                                                           const node::NodeOffer& offer,
                                                           Resolved& r) const {
  // This model (a distributed job: a rank of it) measured on this node
  // before: planned from what was measured.
  std::optional<tandem::v1::Profile> measured =
      r.spec.placement().has_plan() ? std::nullopt : layer_profiles_.Load(*jm.model, r.spec, offer);
  r.cost_source = measured ? node::MeasuredCostSource(*measured) : node::AnalyticCostSource(offer);
  return measured;
}

absl::Status JobManager::PlanRanks(const JobModel& jm, const node::NodeOffer& offer,
                                   Resolved& r) const {
  // A distributed job's ranks run the rank plan, for their share of each
  // batch; its step program is each rank's own (with its collectives). The
  // coordinator's rank reserves what that plan keeps on its host.
  const std::optional<tandem::v1::Profile> measured = PlannedFrom(jm, offer, r);
  const tandem::v1::Profile* from = measured ? &*measured : nullptr;
  const int ranks = r.spec.distributed().replicas();
  absl::StatusOr<tandem::v1::Plan> solved =
      node::RankPlan(*jm.model, r.spec, offer, ranks, nullptr, from);
  if (!solved.ok()) return AsSpecError(solved.status());
  r.plan = *std::move(solved);
  std::string timed = CountCollectives(*jm.model, r.spec, offer, from, r.plan);
  // The rank plan is solved as one device's, which does not see that a
  // partitioned rank's host updates take 1/N of the time, nor the
  // collectives: one that streams optimizer state is timed as a rank against
  // the two-place plan, and the faster runs.
  if (StreamsState(r.plan) && !r.spec.placement().has_plan()) {
    tandem::v1::JobSpec two_place = r.spec;
    two_place.mutable_placement()->set_no_streamed_optimizer_state(true);
    absl::StatusOr<tandem::v1::Plan> other =
        node::RankPlan(*jm.model, two_place, offer, ranks, nullptr, from);
    if (other.ok() && other->feasible()) {
      const std::string other_timed = CountCollectives(*jm.model, r.spec, offer, from, *other);
      const double streaming = r.plan.prediction().iteration_seconds();
      const double without = other->prediction().iteration_seconds();
      // As a rank every gradient waits for its bucket's sum: a plan whose
      // rank peak is over its budget does not fit, whatever its time.
      const bool fits = FitsAsRank(r.plan), other_fits = FitsAsRank(*other);
      if (planner::SecondRankPlanWins(fits, streaming, other_fits, without)) {
        r.plan = *std::move(other);
        timed = other_timed;
      }
      absl::StrAppend(&timed, absl::StrFormat("; as a rank, streaming optimizer state %.2f ms, "
                                              "updating on the host or resident alone %.2f ms",
                                              streaming * 1e3, without * 1e3));
    }
  }
  absl::StrAppend(&r.cost_source, timed);
  absl::StatusOr<MemoryEstimate> ranked = EstimateModel(r.spec, jm, &offer, &r.plan);
  if (!ranked.ok()) return AsSpecError(ranked.status());
  r.estimate = *std::move(ranked);
  return absl::OkStatus();
}

absl::Status JobManager::PlanHere(const JobModel& jm, const node::NodeOffer& offer,
                                  Resolved& r) const {
  const std::optional<tandem::v1::Profile> measured = PlannedFrom(jm, offer, r);
  const tandem::v1::Profile* from = measured ? &*measured : nullptr;
  // A pipeline of this model here before: its stages as they measured.
  const std::optional<node::PipelineCorrections> corrections =
      r.spec.placement().has_plan() ? std::nullopt
                                    : CorrectionsHere(*jm.model, r.spec, offer, from);
  if (corrections) absl::StrAppend(&r.cost_source, "; ", corrections->note);
  absl::StatusOr<tandem::v1::Plan> solved =
      node::PlanJob(*jm.model, r.spec, offer, from, corrections ? &*corrections : nullptr);
  if (!solved.ok()) return AsSpecError(solved.status());
  r.plan = *std::move(solved);
  // auto_stages: the stored spec says what was chosen.
  absl::StatusOr<tandem::v1::JobSpec> chosen = node::ChosenStages(r.spec, r.plan);
  if (!chosen.ok()) return AsSpecError(chosen.status());
  if (chosen->placement().pipeline().stages() != r.spec.placement().pipeline().stages()) {
    absl::StatusOr<MemoryEstimate> staged = EstimateModel(*chosen, jm, &offer);
    if (!staged.ok()) return AsSpecError(staged.status());
    r.estimate = *std::move(staged);
  }
  r.spec = *std::move(chosen);
  absl::StatusOr<tandem::v1::Schedule> program = node::StepProgram(*jm.model, r.spec, r.plan);
  if (!program.ok()) return AsSpecError(program.status());
  // A program for thousands of micro-batches would outgrow the record's
  // readers (GetJob under gRPC's default 4 MiB): the run lowers it instead.
  if (program->ByteSizeLong() <= kMaxStoredProgramBytes) r.program = *std::move(program);
  return absl::OkStatus();
}

absl::StatusOr<MemoryEstimate> JobManager::Estimate(const tandem::v1::JobSpec& resolved,
                                                    const tandem::v1::Plan* plan) const {
  const PathPolicy& policy = options_.data_policy;
  // Built as the run builds it: a bf16 model's layers need more workspace.
  TANDEM_ASSIGN_OR_RETURN(JobModel jm, BuildJobModel(
                                           resolved,
                                           [&policy](const std::string& f, const std::string& p) {
                                             return policy.Resolve(f, p);
                                           },
                                           ComputeDType(resolved.precision())));
  return EstimateModel(resolved, jm, node().get(), plan);
}

std::shared_ptr<const node::NodeOffer> JobManager::node() const {
  absl::MutexLock lock(&node_mu_);
  return node_;
}

void JobManager::ReplaceNode(node::NodeOffer offer) {
  auto next = std::make_shared<const node::NodeOffer>(std::move(offer));
  absl::MutexLock lock(&node_mu_);
  node_ = std::move(next);
}

absl::StatusOr<std::shared_ptr<void>> JobManager::ReserveNodeForMeasuring(int64_t bytes) {
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<void> memory,
                          HoldHostMemory(bytes, "measuring the node profile"));
  absl::MutexLock lock(&mu_);
  if (running_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(running_, " job", running_ == 1 ? " is" : "s are",
                     " running and would be measured with the node; try again when none runs"));
  }
  ++measuring_;
  return std::shared_ptr<void>(nullptr, [this, memory = std::move(memory)](void*) {
    absl::MutexLock lock(&mu_);
    --measuring_;
    dirty_ = true;  // the queue may start jobs again
  });
}

std::optional<node::PipelineCorrections> JobManager::CorrectionsHere(
    const Model& model, const tandem::v1::JobSpec& resolved, const node::NodeOffer& offer,
    const tandem::v1::Profile* base) const {
  const std::optional<tandem::v1::PipelineCorrectionProfile> corrected =
      pipeline_corrections_.Load(model, resolved, offer, base);
  if (!corrected) return std::nullopt;
  return node::CorrectionsOf(*corrected);
}

std::optional<node::PipelineCorrections> JobManager::PipelineCorrections(
    const Model& model, const tandem::v1::JobSpec& resolved,
    const tandem::v1::Profile* base) const {
  const std::shared_ptr<const node::NodeOffer> offer = node();
  if (!offer || resolved.distributed().replicas() > 1) return std::nullopt;
  return CorrectionsHere(model, resolved, *offer, base);
}

std::optional<tandem::v1::Profile> JobManager::MeasuredLayerProfile(
    const Model& model, const tandem::v1::JobSpec& resolved) const {
  const std::shared_ptr<const node::NodeOffer> offer = node();
  // PlanModel plans the whole batch on one device: a rank's profile (its
  // share of the batch and the cores) is not for that.
  if (!offer || resolved.distributed().replicas() > 1) return std::nullopt;
  return layer_profiles_.Load(model, resolved, *offer);
}

absl::Status JobManager::AdmitDistributed(const tandem::v1::JobSpec& resolved) const {
  if (resolved.distributed().replicas() <= 1) return absl::OkStatus();
  if (!options_.admit_distributed) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.distributed.replicas: ", resolved.distributed().replicas(),
                     " ranks need a cluster of tandemd daemons, and this one has no --peers "
                     "or --peers_dns"));
  }
  return options_.admit_distributed(resolved);
}

namespace {

// A submitted job's first record: queued, with what submission resolved.
Job NewJobRecord(const tandem::v1::JobSpec& spec, const std::string& request_id,
                 const JobManager::Resolved& r) {
  Job job;
  job.set_request_id(request_id);
  *job.mutable_spec() = spec;
  *job.mutable_resolved_spec() = r.spec;
  job.set_precision_reason(r.precision_reason);
  job.set_distributed_reason(r.distributed_reason);
  job.set_state(tandem::v1::JOB_STATE_QUEUED);
  job.set_reason("queued");
  *job.mutable_plan() = r.plan;
  *job.mutable_schedule() = r.program;
  job.mutable_metrics()->set_predicted_step_seconds(r.plan.prediction().iteration_seconds());
  if (r.plan.layers_size() > 0) *job.add_plan_history() = PlanRecordOf(r.plan, r.cost_source, 0);
  *job.mutable_create_time() = TimeUtil::GetCurrentTime();
  *job.mutable_update_time() = job.create_time();
  const tandem::v1::TrainingSpec& training = r.spec.training();
  job.mutable_progress()->set_total_steps(
      training.duration_case() == tandem::v1::TrainingSpec::kSteps ? training.steps() : 0);
  return job;
}

}  // namespace

absl::StatusOr<JobManager::Submitted> JobManager::Submit(const tandem::v1::JobSpec& spec,
                                                         const std::string& request_id) {
  {
    absl::MutexLock lock(&mu_);
    if (!accepting_)
      return absl::UnavailableError("tandemd is shutting down and accepts no new jobs");
  }
  TANDEM_RETURN_IF_ERROR(ValidateRequestId(request_id));
  auto existing = [&]() -> absl::StatusOr<std::optional<Submitted>> {
    if (request_id.empty()) return std::optional<Submitted>();
    TANDEM_ASSIGN_OR_RETURN(std::optional<Job> found, store_->FindByRequestId(request_id));
    if (!found) return std::optional<Submitted>();
    if (!SameSpec(found->spec(), spec)) {
      return absl::AlreadyExistsError(absl::StrCat("request_id '", request_id, "' was used for ",
                                                   found->id(), " with a different spec"));
    }
    absl::StatusOr<Job> live = Get(found->id());
    return std::optional<Submitted>(Submitted{live.ok() ? *live : *found, false});
  };
  TANDEM_ASSIGN_OR_RETURN(std::optional<Submitted> previous, existing());
  if (previous) return *previous;

  // Before any work: a store that cannot take the job refuses it at once.
  TANDEM_RETURN_IF_ERROR(CheckStateSpace());
  if (!store_->read_only().ok()) return store_->read_only();
  TANDEM_ASSIGN_OR_RETURN(const Resolved r, Resolve(spec));
  const tandem::v1::JobSpec& resolved = r.spec;
  const MemoryEstimate& estimate = r.estimate;
  TANDEM_RETURN_IF_ERROR(CheckBudgets(estimate));
  TANDEM_RETURN_IF_ERROR(AdmitDistributed(resolved));

  const Job job = NewJobRecord(spec, request_id, r);
  JobEvent queued;
  queued.set_sequence(1);
  *queued.mutable_time() = job.create_time();
  queued.mutable_state_change()->set_to(tandem::v1::JOB_STATE_QUEUED);
  queued.mutable_state_change()->set_reason("submitted");
  // The first block of event numbers is reserved with the record, in its
  // write (event_log.h): a submission costs one commit.
  {
    absl::MutexLock lock(&mu_);
    ++submitting_;
  }
  absl::StatusOr<Job> stored = store_->InsertJob(job, {queued}, EventLog::kReserveBlock);
  if (!stored.ok()) {
    {
      absl::MutexLock lock(&mu_);
      --submitting_;
    }
    if (stored.status().code() == absl::StatusCode::kAlreadyExists) {
      // A concurrent submit with the same request id won the race.
      TANDEM_ASSIGN_OR_RETURN(previous, existing());
      if (previous) return *previous;
    }
    return stored.status();
  }
  if (options_.on_job_stored) options_.on_job_stored(stored->id());

  auto entry = std::make_shared<Entry>();
  entry->job = *stored;
  entry->seq = JobStore::SequenceOf(stored->id());
  entry->estimate = estimate;
  entry->log = LiveLog(stored->id(), 0, EventLog::kReserveBlock);
  queued.set_job_id(stored->id());
  entry->log->Append(queued);
  absl::MutexLock lock(&mu_);
  live_[stored->id()] = entry;
  --submitting_;
  PublishLocked();
  // Stored while the daemon began to stop: acknowledged (it runs after the
  // restart), and its log closed as the others were, so that a watcher is
  // told to watch again rather than wait for the forced end.
  if (stopping_) entry->log->Close(/*shutting_down=*/true);
  dirty_ = true;
  return Submitted{entry->job, true};
}

absl::StatusOr<Job> JobManager::Get(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(id);
    if (it != live_.end()) return it->second->job;
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<Job> job, store_->GetJob(id));
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return *job;
}

absl::StatusOr<JobPage> JobManager::List(const JobFilter& filter) {
  TANDEM_ASSIGN_OR_RETURN(JobPage page, store_->ListJobs(filter));
  absl::MutexLock lock(&mu_);
  for (Job& job : page.jobs) {
    auto it = live_.find(job.id());
    if (it != live_.end()) job = it->second->job;
  }
  return page;
}

absl::StatusOr<std::shared_ptr<EventLog>> JobManager::Events(const std::string& id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(id);
    if (it != live_.end()) return it->second->log;
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<Job> job, store_->GetJob(id));
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (std::shared_ptr<Entry> arriving = ArrivingEntry(id, *job)) return arriving->log;
  FlushEvents();
  TANDEM_ASSIGN_OR_RETURN(const uint64_t last, store_->LastEventSequence(id));
  // A finished job's log: everything is on disk, nothing more will come.
  auto log = std::make_shared<EventLog>(id, last);
  log->Close();
  return log;
}

absl::StatusOr<Job> JobManager::Cancel(const std::string& id, const std::string& reason) {
  if (reason.size() > 1024) return absl::InvalidArgumentError("reason: at most 1024 characters");
  {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(id);
    if (it != live_.end()) return CancelLocked(it->second, reason);
  }
  absl::StatusOr<std::optional<Job>> job = store_->GetJob(id);
  if (!job.ok()) return job.status();
  if (!*job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (std::shared_ptr<Entry> arriving = ArrivingEntry(id, **job)) {
    absl::MutexLock lock(&mu_);
    return CancelLocked(std::move(arriving), reason);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("job ", id, " already ended in ", tandem::v1::JobState_Name((*job)->state())));
}

std::shared_ptr<JobManager::Entry> JobManager::ArrivingEntry(const std::string& id,
                                                             const Job& stored) {
  if (IsTerminal(stored.state())) return nullptr;
  absl::MutexLock lock(&mu_);
  auto arrived = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return live_.count(id) > 0 || submitting_ == 0;
  };
  // Its submit makes it live within microseconds of the commit; the bound is
  // for a store that answers a record no submit is about to make live.
  mu_.AwaitWithTimeout(absl::Condition(&arrived), absl::Seconds(10));
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

absl::StatusOr<Job> JobManager::CancelLocked(std::shared_ptr<Entry> shared,
                                             const std::string& reason) {
  Entry& entry = *shared;
  if (IsTerminal(entry.job.state())) {
    // Ended, its end not yet recorded (a full disk): live only until it is.
    return absl::FailedPreconditionError(
        absl::StrCat("job ", entry.job.id(), " already ended in ",
                     tandem::v1::JobState_Name(entry.job.state())));
  }
  const std::string why =
      reason.empty() ? "cancelled by request" : absl::StrCat("cancelled: ", reason);
  // Stored before anything changes or is acknowledged: a store that cannot
  // take it refuses the cancel with the job as it was, and a crash after it
  // never resumes a job whose cancel the client was told of (Recover ends it).
  const bool queued = entry.job.state() == tandem::v1::JOB_STATE_QUEUED;
  Job requested = entry.job;
  requested.set_cancel_requested(why);
  if (!queued) requested.set_reason("cancelling at the next step boundary");
  TANDEM_RETURN_IF_ERROR(WriteRecord(entry, requested, ++entry.record_version));
  entry.job = std::move(requested);
  if (queued) {
    EndQueuedLocked(entry, tandem::v1::JOB_STATE_CANCELLED, why);
    return entry.job;
  }
  entry.cancel_requested = true;
  entry.cancel_reason = why;
  entry.stop = true;
  if (entry.vote) entry.vote->Request();
  return entry.job;
}

absl::Status JobManager::Transition(Entry& entry, JobState state, const std::string& reason) {
  JobEvent event;
  event.mutable_state_change()->set_from(entry.job.state());
  event.mutable_state_change()->set_to(state);
  event.mutable_state_change()->set_reason(reason);
  event = entry.log->Append(event);
  entry.job.set_state(state);
  entry.job.set_reason(reason);
  entry.job.set_last_event_sequence(event.sequence());
  *entry.job.mutable_update_time() = event.time();
  if (state == tandem::v1::JOB_STATE_RUNNING) *entry.job.mutable_start_time() = event.time();
  if (IsTerminal(state)) {
    *entry.job.mutable_end_time() = event.time();
    metrics_->jobs_finished.Add({{"state", StateLabel(state)}}).Increment();
  }
  PublishLocked();  // before the store write, which may take a while
  if (!entry.unrecorded.empty()) {
    // Earlier changes are still waiting: keep the order.
    HoldRefused(entry, event);
    return absl::UnavailableError("an earlier state change is not recorded yet");
  }
  // A job's end may take the store's reserve on a full disk (job_store.h).
  const absl::Status s = WriteRecord(
      entry, entry.job, ++entry.record_version, {event},
      IsTerminal(state) ? JobStore::Priority::kMayUseReserve : JobStore::Priority::kNormal);
  // Kept in memory, served from there, and written when the store takes it.
  if (!s.ok()) HoldRefused(entry, event);
  return s;
}

void JobManager::HoldRefused(Entry& entry, const JobEvent& event) {
  entry.unrecorded.push_back(event);
  absl::MutexLock lock(&persist_mu_);
  refused_events_[entry.job.id()].push_back(event);
}

void JobManager::RetryUnrecorded() {
  absl::MutexLock lock(&mu_);
  for (auto it = live_.begin(); it != live_.end();) {
    Entry& e = *it->second;
    const JobStore::Priority priority = IsTerminal(e.job.state())
                                            ? JobStore::Priority::kMayUseReserve
                                            : JobStore::Priority::kNormal;
    if (e.unrecorded.empty() ||
        !WriteRecord(e, e.job, ++e.record_version, e.unrecorded, priority).ok()) {
      ++it;
      continue;
    }
    std::fprintf(stderr, "tandemd: recorded %zu delayed state change(s) of %s (now %s)\n",
                 e.unrecorded.size(), e.job.id().c_str(), StateLabel(e.job.state()));
    e.unrecorded.clear();
    {
      absl::MutexLock held(&persist_mu_);
      refused_events_.erase(e.job.id());
    }
    if (IsTerminal(e.job.state()) && !e.running) {
      it = live_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status JobManager::CheckBudgets(const MemoryEstimate& estimate) const {
  if (options_.host_memory_budget_bytes > 0 &&
      estimate.host_bytes > options_.host_memory_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job needs ", FormatBytes(estimate.host_bytes, 1), " of host memory (",
                     estimate.Describe(), ") but this node's host budget is ",
                     FormatBytes(options_.host_memory_budget_bytes, 1), " (--host_memory_budget)"));
  }
  if (estimate.accelerator_bytes > 0 &&
      estimate.accelerator_bytes > options_.accelerator_memory_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job needs ", FormatBytes(estimate.accelerator_bytes, 1),
                     " of accelerator memory but the budget is ",
                     FormatBytes(options_.accelerator_memory_budget_bytes, 1),
                     " (--accelerator_memory_budget)"));
  }
  return absl::OkStatus();
}

absl::Status JobManager::CheckStateSpace() const {
  struct statvfs fs;
  if (options_.state_min_free_bytes <= 0 || statvfs(options_.state_dir.c_str(), &fs) != 0) {
    return absl::OkStatus();
  }
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
  if (free_bytes >= options_.state_min_free_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the state directory ", options_.state_dir, " has ", FormatBytes(free_bytes, 1),
      " free, less than the ", FormatBytes(options_.state_min_free_bytes, 1),
      " kept for running jobs' records (--state_min_free_bytes); submit again once space is "
      "freed"));
}

std::shared_ptr<EventLog> JobManager::LiveLog(const std::string& id, uint64_t last,
                                              uint64_t reserved) {
  return std::make_shared<EventLog>(
      id, last, EventLog::kMaxInMemory,
      [store = store_, id](uint64_t through) {
        const absl::Status s = store->ReserveEventSequences(id, through);
        if (!s.ok()) {
          std::fprintf(stderr,
                       "tandemd: cannot reserve event numbers of %s up to %llu (%s); after a "
                       "crash now, a watcher resuming from its next number may miss events\n",
                       id.c_str(), static_cast<unsigned long long>(through), s.ToString().c_str());
        }
      },
      reserved);
}

std::vector<JobEvent> JobManager::UnstoredEvents(const std::string& id, uint64_t from, uint64_t to,
                                                 int max) {
  if (max <= 0) return {};
  // The `max` lowest-numbered matches, chosen without copying the others (up
  // to 100,000 events are held on a full disk; training appends meanwhile).
  auto later = [](const JobEvent* a, const JobEvent* b) { return a->sequence() < b->sequence(); };
  std::vector<const JobEvent*> lowest;  // a max-heap by sequence
  std::vector<JobEvent> out;
  absl::MutexLock lock(&persist_mu_);
  auto take = [&](const std::vector<JobEvent>& events) {
    for (const JobEvent& e : events) {
      if (e.job_id() != id || e.sequence() < from || e.sequence() >= to) continue;
      if (lowest.size() == static_cast<size_t>(max)) {
        if (e.sequence() >= lowest.front()->sequence()) continue;
        std::pop_heap(lowest.begin(), lowest.end(), later);
        lowest.pop_back();
      }
      lowest.push_back(&e);
      std::push_heap(lowest.begin(), lowest.end(), later);
    }
  };
  if (in_flight_events_ != nullptr) take(*in_flight_events_);
  take(pending_events_);
  // State changes the store refused, held apart (HoldRefused).
  if (auto it = refused_events_.find(id); it != refused_events_.end()) take(it->second);
  std::sort_heap(lowest.begin(), lowest.end(), later);
  out.reserve(lowest.size());
  for (const JobEvent* e : lowest) out.push_back(*e);
  return out;
}

void JobManager::AppendEvent(Entry& entry, JobEvent event) {
  event = entry.log->Append(std::move(event));
  absl::MutexLock lock(&persist_mu_);
  pending_events_.push_back(std::move(event));
}

void JobManager::RetryEstimates() {
  std::vector<std::pair<std::shared_ptr<Entry>, Job>> waiting;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : live_) {
      if (!e->estimate_error.empty() && e->job.state() == tandem::v1::JOB_STATE_QUEUED) {
        waiting.emplace_back(e, e->job);
      }
    }
  }
  for (auto& [entry, job] : waiting) {
    // Outside the lock: it reads the job's data files' headers.
    absl::StatusOr<MemoryEstimate> estimate = Estimate(job.resolved_spec(), &job.plan());
    absl::MutexLock lock(&mu_);
    if (entry->job.state() != tandem::v1::JOB_STATE_QUEUED) continue;  // cancelled meanwhile
    if (!estimate.ok()) {
      entry->estimate_error = std::string(estimate.status().message());
      if (absl::Now() >= entry->estimate_deadline) {
        EndQueuedLocked(
            *entry, tandem::v1::JOB_STATE_FAILED,
            absl::StrCat("cannot resume after restart: ", entry->estimate_error,
                         "; gave up after trying for ", absl::FormatDuration(options_.resume_wait),
                         " (tandemd --resume_wait)"));
        entry->estimate_error.clear();
      }
      continue;
    }
    if (const absl::Status fits = CheckBudgets(*estimate); !fits.ok()) {
      entry->estimate_error.clear();
      EndQueuedLocked(*entry, tandem::v1::JOB_STATE_FAILED,
                      absl::StrCat("cannot resume after restart: ", fits.message()));
      continue;
    }
    entry->estimate = *estimate;
    entry->estimate_error.clear();
    entry->job.set_reason("queued: its memory could be estimated again");
    dirty_ = true;
  }
}

void JobManager::EstimateLoop() {
  while (true) {
    {
      absl::MutexLock lock(&persist_mu_);
      if (persist_mu_.AwaitWithTimeout(absl::Condition(&persist_stop_),
                                       options_.estimate_retry_interval)) {
        return;
      }
    }
    RetryEstimates();
  }
}

void JobManager::PersistLoop() {
  while (true) {
    bool stop;
    {
      absl::MutexLock lock(&persist_mu_);
      persist_mu_.AwaitWithTimeout(absl::Condition(&persist_stop_), absl::Milliseconds(200));
      stop = persist_stop_;
    }
    FlushEvents();
    RetryUnrecorded();
    if (!store_->has_reserve() && store_->RestoreReserve()) {
      std::fprintf(stderr, "tandemd: the job store's reserve is in place again\n");
    }
    if (stop) return;
  }
}

void JobManager::FlushEvents() {
  absl::MutexLock flushing(&flush_mu_);
  // Written without persist_mu_ (training appends meanwhile); UnstoredEvents
  // reads the same batch, which nobody changes until it is done.
  std::shared_ptr<std::vector<JobEvent>> in_flight;
  {
    absl::MutexLock lock(&persist_mu_);
    if (pending_events_.empty()) return;
    in_flight = std::make_shared<std::vector<JobEvent>>();
    in_flight->swap(pending_events_);
    in_flight_events_ = in_flight;
  }
  const absl::Status s = store_->AppendEvents(*in_flight, options_.events_kept_per_job);
  absl::MutexLock lock(&persist_mu_);
  in_flight_events_.reset();
  if (s.ok()) {
    if (event_write_failing_) std::fprintf(stderr, "tandemd: job events are persisted again\n");
    event_write_failing_ = false;
    return;
  }
  // Kept for the next round (a full disk may be freed), up to a bound past
  // which the oldest are given up: the state changes and the job records,
  // written separately, are what must not be lost.
  constexpr size_t kMaxHeldEvents = 100000;
  // Nobody else holds the batch now (UnstoredEvents copies under the lock).
  std::vector<JobEvent> batch = std::move(*in_flight);
  batch.insert(batch.end(), pending_events_.begin(), pending_events_.end());
  size_t dropped = 0;
  if (batch.size() > kMaxHeldEvents) {
    dropped = batch.size() - kMaxHeldEvents;
    batch.erase(batch.begin(), batch.begin() + dropped);
  }
  pending_events_.swap(batch);
  if (!event_write_failing_ || dropped > 0) {
    std::fprintf(stderr,
                 "tandemd: cannot persist job events (%s); holding %zu to retry, %zu given up\n",
                 s.ToString().c_str(), pending_events_.size(), dropped);
  }
  event_write_failing_ = true;
}

absl::Status JobManager::Recover() {
  TANDEM_ASSIGN_OR_RETURN(std::vector<Job> jobs, store_->LoadUnfinished());
  for (Job& job : jobs) {
    auto entry = std::make_shared<Entry>();
    entry->seq = JobStore::SequenceOf(job.id());
    // Past every number handed out before the restart: a watcher that saw
    // events the store never got resumes after them, not inside new ones.
    TANDEM_ASSIGN_OR_RETURN(const uint64_t stored, store_->LastEventSequence(job.id()));
    TANDEM_ASSIGN_OR_RETURN(const uint64_t reserved, store_->ReservedEventSequence(job.id()));
    entry->log = LiveLog(job.id(), std::max(stored, reserved));
    absl::StatusOr<MemoryEstimate> estimate = Estimate(job.resolved_spec(), &job.plan());
    entry->job = std::move(job);
    absl::MutexLock lock(&mu_);
    // A change the store cannot take now (a full disk, a read-only store) is
    // kept with the entry and written later: recovery never stops the daemon.
    auto transition = [&](JobState state, const std::string& reason) {
      const absl::Status s = Transition(*entry, state, reason);
      if (!s.ok()) {
        std::fprintf(stderr, "tandemd: recovery: cannot record that %s is %s yet: %s\n",
                     entry->job.id().c_str(), StateLabel(state), s.ToString().c_str());
      }
    };
    if (!entry->job.cancel_requested().empty()) {
      // Cancelled while it ran, before tandemd went down. Ended as a queued
      // job ends: its log closes (its watchers end) whether or not the store
      // takes the end now, and it stays live until it does.
      live_[entry->job.id()] = entry;
      EndQueuedLocked(*entry, tandem::v1::JOB_STATE_CANCELLED, entry->job.cancel_requested());
      continue;
    }
    if (!estimate.ok()) {
      // Often passing (a data mount or a device not there yet): the job waits
      // queued and is estimated again (RetryEstimates), never failed for it.
      entry->estimate_error = std::string(estimate.status().message());
      entry->estimate_deadline = absl::Now() + options_.resume_wait;
      const std::string why = absl::StrCat(
          "cannot resume yet: ", entry->estimate_error, "; tandemd tries again every ",
          absl::FormatDuration(options_.estimate_retry_interval), " until ",
          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", entry->estimate_deadline, absl::UTCTimeZone()),
          " (--resume_wait from this start of tandemd), then fails it (cancel the job to give up "
          "sooner)");
      if (entry->job.state() == tandem::v1::JOB_STATE_RUNNING) {
        transition(tandem::v1::JOB_STATE_QUEUED, why);
      } else {
        entry->job.set_reason(why);
      }
      live_[entry->job.id()] = entry;
      continue;
    }
    // A job larger than this daemon's budgets (it restarted with smaller
    // ones) could never be scheduled, and would hold every job behind it.
    const absl::Status fits = CheckBudgets(*estimate);
    if (!fits.ok()) {
      live_[entry->job.id()] = entry;
      EndQueuedLocked(*entry, tandem::v1::JOB_STATE_FAILED,
                      absl::StrCat("cannot resume after restart: ", fits.message()));
      continue;
    }
    entry->estimate = *estimate;
    if (entry->job.state() == tandem::v1::JOB_STATE_RUNNING) {
      transition(tandem::v1::JOB_STATE_QUEUED,
                 absl::StrCat(
                     "tandemd restarted while the job ran; it resumes from its checkpoint at step ",
                     entry->job.checkpoint_step()));
    }
    live_[entry->job.id()] = entry;
    dirty_ = true;
  }
  absl::MutexLock lock(&mu_);
  PublishLocked();
  return absl::OkStatus();
}

void JobManager::Start() {
  scheduler_ = std::thread([this] { SchedulerLoop(); });
}

void JobManager::SchedulerLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](JobManager* m) ABSL_NO_THREAD_SAFETY_ANALYSIS { return m->dirty_ || m->stopping_; },
            this),
        absl::Seconds(1));
    if (stopping_) return;
    dirty_ = false;
    ScheduleLocked();
    // Join runner threads that finished.
    std::vector<std::thread> done;
    for (auto it = runners_.begin(); it != runners_.end();) {
      if (it->first->load()) {
        done.push_back(std::move(it->second));
        it = runners_.erase(it);
      } else {
        ++it;
      }
    }
    mu_.Unlock();
    for (std::thread& t : done) t.join();
    mu_.Lock();
  }
}

std::vector<JobManager::Entry*> JobManager::QueueLocked() {
  std::vector<Entry*> queue;
  for (auto& [id, e] : live_) {
    if (e->job.state() == tandem::v1::JOB_STATE_QUEUED) queue.push_back(e.get());
  }
  std::sort(queue.begin(), queue.end(), [](const Entry* a, const Entry* b) {
    const int pa = a->job.spec().priority(), pb = b->job.spec().priority();
    return pa != pb ? pa > pb : a->seq < b->seq;
  });
  return queue;
}

bool JobManager::WaitsForItsOwnReason(const Entry& e) {
  return e.not_before > absl::Now()     // a distributed job waiting to restart
         || !e.estimate_error.empty();  // waiting for RetryEstimates
}

const JobManager::Entry* JobManager::NextToStartLocked() {
  if (measuring_ > 0 || !store_->read_only().ok()) return nullptr;
  if (options_.max_running_jobs > 0 && running_ >= options_.max_running_jobs) return nullptr;
  for (const Entry* e : QueueLocked()) {
    if (!WaitsForItsOwnReason(*e)) return e;
  }
  return nullptr;
}

void JobManager::ScheduleLocked() {
  if (measuring_ > 0) return;  // the node is being measured: jobs wait
  const Entry* blocked = nullptr;
  for (Entry* e : QueueLocked()) {
    if (WaitsForItsOwnReason(*e)) continue;
    if (!store_->read_only().ok()) {
      // A run could record neither its start, its checkpoints nor its end.
      e->job.set_reason(absl::StrCat("waiting: ", store_->read_only().message()));
      continue;
    }
    if (blocked != nullptr) {
      e->job.set_reason(absl::StrCat("waiting behind ", blocked->job.id(), " (priority ",
                                     blocked->job.spec().priority(), ")"));
      continue;
    }
    if (options_.max_running_jobs > 0 && running_ >= options_.max_running_jobs) {
      e->job.set_reason(absl::StrCat("waiting for a run slot (", running_, " of ",
                                     options_.max_running_jobs, " jobs running)"));
      blocked = e;
      continue;
    }
    const int64_t host_free = options_.host_memory_budget_bytes - reserved_host_;
    const int64_t accel_free = options_.accelerator_memory_budget_bytes - reserved_accelerator_;
    if (options_.host_memory_budget_bytes > 0 && e->estimate.host_bytes > host_free) {
      e->job.set_reason(absl::StrCat(
          "waiting for ", FormatBytes(e->estimate.host_bytes - host_free, 1), " of host memory (",
          FormatBytes(reserved_host_, 1), " of ", FormatBytes(options_.host_memory_budget_bytes, 1),
          " reserved by running jobs)"));
      blocked = e;
      continue;
    }
    if (e->estimate.accelerator_bytes > 0 && e->estimate.accelerator_bytes > accel_free) {
      e->job.set_reason(absl::StrCat("waiting for ",
                                     FormatBytes(e->estimate.accelerator_bytes - accel_free, 1),
                                     " of accelerator memory"));
      blocked = e;
      continue;
    }
    // Admit.
    reserved_host_ += e->estimate.host_bytes;
    reserved_accelerator_ += e->estimate.accelerator_bytes;
    e->job.set_reserved_host_bytes(e->estimate.host_bytes);
    e->job.set_reserved_accelerator_bytes(e->estimate.accelerator_bytes);
    e->job.set_attempts(e->job.attempts() + 1);
    e->running = true;
    ++running_;
    e->stop = false;
    const absl::Status s = Transition(*e, tandem::v1::JOB_STATE_RUNNING,
                                      e->job.attempts() > 1 ? "resumed" : "started");
    if (!s.ok()) {
      std::fprintf(stderr, "tandemd: cannot record the start of %s: %s\n", e->job.id().c_str(),
                   s.ToString().c_str());
    }
    std::shared_ptr<Entry> shared = live_[e->job.id()];
    // Each run's own flag, set by its thread as its last action so that it
    // can be joined: a re-queued job's next run never shares its old one.
    auto done = std::make_shared<std::atomic<bool>>(false);
    runners_.emplace_back(done, std::thread([this, shared, done] {
                            RunJob(shared);
                            *done = true;
                          }));
  }
  metrics_->queue_length.Add({}).Set(0);
  int64_t queued = 0;
  for (auto& [id, e] : live_) queued += e->job.state() == tandem::v1::JOB_STATE_QUEUED;
  metrics_->queue_length.Add({}).Set(static_cast<double>(queued));
}

void JobManager::UpdateJobMetrics(const Entry& entry) {
  const prometheus::Labels labels = {{"job_id", entry.job.id()}};
  const auto& m = entry.job.metrics();
  metrics_->job_loss.Add(labels).Set(m.loss());
  metrics_->job_samples_per_second.Add(labels).Set(m.samples_per_second());
  metrics_->job_step_seconds.Add(labels).Set(m.step_seconds());
  metrics_->job_progress.Add(labels).Set(entry.job.progress().fraction());
  if (m.eval_step() > 0) metrics_->job_eval_accuracy.Add(labels).Set(m.eval_accuracy());
  if (m.predicted_step_seconds() > 0) {
    metrics_->job_predicted_step_seconds.Add(labels).Set(m.predicted_step_seconds());
  }
  if (m.loss_scale() > 0) {
    metrics_->job_loss_scale.Add(labels).Set(m.loss_scale());
    metrics_->job_skipped_steps.Add(labels).Set(static_cast<double>(m.skipped_steps()));
  }
  const auto& u = m.updates();
  if (!u.rule().empty()) {
    metrics_->job_update_rule.Add({{"job_id", entry.job.id()}, {"rule", u.rule()}}).Set(1);
    metrics_->job_update_staleness.Add({{"job_id", entry.job.id()}, {"stat", "mean"}})
        .Set(u.mean_staleness());
    metrics_->job_update_staleness.Add({{"job_id", entry.job.id()}, {"stat", "max"}})
        .Set(static_cast<double>(u.max_staleness()));
    // One series a lag up to kMaxLagLabel; larger lags (a descheduled
    // Hogwild worker's are unbounded) share the last, "64+".
    double beyond = 0;
    for (int lag = 0; lag < u.staleness_counts_size(); ++lag) {
      if (lag >= kMaxLagLabel) {
        beyond += static_cast<double>(u.staleness_counts(lag));
        continue;
      }
      metrics_->job_update_lagged.Add({{"job_id", entry.job.id()}, {"lag", absl::StrCat(lag)}})
          .Set(static_cast<double>(u.staleness_counts(lag)));
    }
    if (u.staleness_counts_size() > kMaxLagLabel) {
      metrics_->job_update_lagged
          .Add({{"job_id", entry.job.id()}, {"lag", absl::StrCat(kMaxLagLabel, "+")}})
          .Set(beyond);
    }
    metrics_->job_update_wait_seconds.Add(labels).Set(u.wait_seconds());
    metrics_->job_update_exchanges.Add(labels).Set(static_cast<double>(u.exchanges()));
  }
  if (m.has_distributed() && m.distributed().ranks() > 1) {
    const tandem::v1::DistributedStats& d = m.distributed();
    metrics_->job_ranks.Add(labels).Set(d.ranks());
    SetCollectiveSeries(metrics_->job_collective_bytes, metrics_->job_collective_seconds, labels,
                        d);
  }
  for (const tandem::v1::PipelineStageStats& st : m.pipeline_stages()) {
    const std::string stage = absl::StrCat(st.stage());
    auto seconds = [&](const char* phase, double v) {
      metrics_->job_pipeline_stage_seconds
          .Add({{"job_id", entry.job.id()}, {"stage", stage}, {"phase", phase}})
          .Set(v);
    };
    const double values[] = {st.busy_seconds(),         st.bubble_seconds(),
                             st.copy_seconds(),         st.peer_copy_seconds(),
                             st.weight_fetch_seconds(), st.update_seconds()};
    static_assert(std::size(values) == std::size(kPipelinePhases));
    for (size_t i = 0; i < std::size(values); ++i) seconds(kPipelinePhases[i], values[i]);
    metrics_->job_pipeline_stage_bytes
        .Add({{"job_id", entry.job.id()}, {"stage", stage}, {"kind", "peak"}})
        .Set(static_cast<double>(st.peak_bytes()));
    metrics_->job_pipeline_stage_bytes
        .Add({{"job_id", entry.job.id()}, {"stage", stage}, {"kind", "predicted"}})
        .Set(static_cast<double>(st.predicted_bytes()));
  }
}

void JobManager::RunJob(std::shared_ptr<Entry> entry) {
  Job job;
  {
    absl::MutexLock lock(&mu_);
    job = entry->job;
    entry->allocator = std::make_unique<HostAllocator>(entry->estimate.RunnerHostBytes());
    PublishLocked();
  }
  // The spec, plan and model of submission: resolved and planned then, not again.
  const bool resolved =
      job.resolved_spec().model().model_case() != tandem::v1::ModelSpec::MODEL_NOT_SET;
  absl::Status status;
  std::unique_ptr<Trainer> trainer;
  // The node as it is when the run starts, for its runner and its plan loop
  // alike (a refresh may replace it meanwhile).
  const std::shared_ptr<const node::NodeOffer> offer = node();
  TrainerOptions trainer_options = TrainerOptionsFor(job, *entry, resolved, offer);
  TrainerCallbacks callbacks = CallbacksFor(job.id(), entry);
  std::optional<DistributedRun> distributed;
  if (job.resolved_spec().distributed().replicas() > 1 && options_.begin_distributed) {
    distributed = options_.begin_distributed(job, trainer_options.checkpoint_dir);
    {
      absl::MutexLock lock(&mu_);
      entry->vote = distributed->vote;
      if (entry->stop.load()) entry->vote->Request();  // cancelled meanwhile
    }
    trainer_options.make_runner = distributed->factory;
    trainer_options.rank_nodes = distributed->nodes;
    // A stop (cancel, shutdown) is voted on, so that every rank stops at the
    // same step with the same final checkpoint: they request the vote.
    callbacks.should_stop = [vote = distributed->vote] { return vote->agreed(); };
    callbacks.after_step = [this, entry, nodes = distributed->nodes](int64_t, double,
                                                                     const StepRunner& runner) {
      tandem::v1::DistributedStats d = runner.distributed_stats();
      if (d.ranks() == 0) return;
      for (const std::string& n : *nodes) d.add_nodes(n);
      absl::MutexLock lock(&mu_);
      *entry->job.mutable_metrics()->mutable_distributed() = std::move(d);
      entry->fault_since = absl::InfiniteFuture();  // the ranks train again
      UpdateJobMetrics(*entry);
    };
  }
  {
    absl::StatusOr<std::unique_ptr<Trainer>> created =
        Trainer::Create(resolved ? job.resolved_spec() : job.spec(), trainer_options, callbacks);
    if (created.ok()) {
      trainer = std::move(*created);
      ReportReplacedProgram(job, *entry, trainer->runner());
      TrackTelemetry(job.id(), *entry, trainer.get());
      StartPlanLoop(entry, *trainer, offer);
      status = trainer->Run();
    } else {
      status = created.status();
    }
  }
  if (distributed) {
    // A lost rank shows on rank 0 as a failed collective: say which.
    if (!status.ok() && status.code() != absl::StatusCode::kCancelled && distributed->explain) {
      status = distributed->explain(status);
    }
    if (distributed->end) distributed->end();
  }
  FlushEvents();
  absl::MutexLock lock(&mu_);
  entry->vote.reset();
  FinishRun(*entry, trainer.get(), status);
  // The trainer's buffers belong to the job's allocator: free them first, and
  // both before the scheduler may hand the memory to another job.
  trainer.reset();
  {
    // Out of the published figures before it goes: snapshots read it
    // without mu_.
    const std::unique_ptr<HostAllocator> allocator = std::move(entry->allocator);
    PublishLocked();
  }
  dirty_ = true;
}

void JobManager::ReportReplacedProgram(const Job& job, Entry& entry, const StepRunner& runner) {
  const bool same_plan = runner.plan().SerializeAsString() == job.plan().SerializeAsString();
  if (job.schedule().ops_size() == 0 || !same_plan ||
      runner.program().SerializeAsString() == job.schedule().SerializeAsString()) {
    return;  // no stored program, a new plan (and so a new program), or it runs
  }
  JobEvent e;
  e.mutable_log()->set_severity(tandem::v1::LOG_SEVERITY_WARNING);
  e.mutable_log()->set_message(
      "the stored step program is not this plan's lowering (damaged, or stored by another "
      "tandemd version): the plan was lowered again, and the record will keep the program "
      "that ran");
  AppendEvent(entry, e);
}

TrainerOptions JobManager::TrainerOptionsFor(const Job& job, Entry& entry, bool resolved,
                                             const std::shared_ptr<const node::NodeOffer>& offer) {
  TrainerOptions options;
  options.job_id = job.id();
  options.checkpoint_dir = absl::StrCat(options_.state_dir, "/jobs/", job.id(), "/checkpoints");
  options.resume = true;
  const PathPolicy& policy = options_.data_policy;
  options.resolve_path = [&policy](const std::string& f, const std::string& p) {
    return policy.Resolve(f, p);
  };
  options.data_reserved_bytes = entry.estimate.data_bytes;
  options.has_accelerator = options_.has_accelerator;
  options.threads = job.resolved_spec().training().threads() > 0
                        ? job.resolved_spec().training().threads()
                        : options_.default_threads;
  options.host_allocator = entry.allocator.get();
  options.spec_resolved = resolved;
  options.make_runner = options_.make_runner;
  if (!options.make_runner && offer) {
    options.make_runner = node::MakeRunnerFactory(
        *offer, resolved ? std::optional<tandem::v1::Plan>(job.plan()) : std::nullopt,
        resolved ? job.schedule() : tandem::v1::Schedule());
  }
  return options;
}

TrainerCallbacks JobManager::CallbacksFor(const std::string& id, std::shared_ptr<Entry> entry) {
  const prometheus::Labels labels = {{"job_id", id}};
  prometheus::Histogram* step_duration =
      &metrics_->job_step_duration.Add(labels, metrics_->job_step_duration_buckets);
  prometheus::Counter* steps_total = &metrics_->job_steps.Add(labels);
  TrainerCallbacks callbacks;
  callbacks.on_step = [this, entry, step_duration, steps_total](const JobEvent::StepProgress& p) {
    JobEvent e;
    *e.mutable_step() = p;
    AppendEvent(*entry, e);
    step_duration->Observe(p.step_seconds());
    RecordStep(*entry, p, *steps_total);
  };
  callbacks.on_eval = [this, entry](const JobEvent::EvalResult& r) {
    JobEvent e;
    *e.mutable_eval() = r;
    AppendEvent(*entry, e);
    absl::MutexLock lock(&mu_);
    entry->job.mutable_metrics()->set_eval_loss(r.loss());
    entry->job.mutable_metrics()->set_eval_accuracy(r.accuracy());
    entry->job.mutable_metrics()->set_eval_step(r.step());
    UpdateJobMetrics(*entry);
  };
  callbacks.on_log = [this, entry](tandem::v1::LogSeverity severity, const std::string& message) {
    JobEvent e;
    e.mutable_log()->set_severity(severity);
    e.mutable_log()->set_message(message);
    AppendEvent(*entry, e);
  };
  callbacks.on_checkpoint = [this, entry](const JobEvent::CheckpointSaved& c) {
    JobEvent e;
    *e.mutable_checkpoint() = c;
    AppendEvent(*entry, e);
    FlushEvents();
    RecordCheckpoint(*entry, c);
  };
  callbacks.should_stop = [entry] { return entry->stop.load(); };
  return callbacks;
}

void JobManager::RecordStep(Entry& entry, const JobEvent::StepProgress& p,
                            prometheus::Counter& steps_total) {
  absl::MutexLock lock(&mu_);
  auto* progress = entry.job.mutable_progress();
  steps_total.Increment(static_cast<double>(p.step() - progress->step()));
  progress->set_step(p.step());
  progress->set_total_steps(p.total_steps());
  progress->set_epoch(p.epoch());
  progress->set_fraction(p.total_steps() > 0 ? static_cast<double>(p.step()) / p.total_steps() : 0);
  progress->set_eta_seconds(p.eta_seconds());
  auto* m = entry.job.mutable_metrics();
  m->set_loss(p.loss());
  m->set_samples_per_second(p.samples_per_second());
  // The window's mean, as the trainer's own metrics (tandem_job_step_seconds).
  m->set_step_seconds(p.window_step_seconds() > 0 ? p.window_step_seconds() : p.step_seconds());
  if (p.has_updates()) *m->mutable_updates() = p.updates();
  if (p.pipeline_stages_size() > 0) *m->mutable_pipeline_stages() = p.pipeline_stages();
  entry.job.set_last_event_sequence(entry.log->last_sequence());
  UpdateJobMetrics(entry);
}

void JobManager::RecordCheckpoint(Entry& entry, const JobEvent::CheckpointSaved& c) {
  // The record on disk follows checkpoints, so a recovered job reports where it resumes.
  ChangeAndWrite(entry, "checkpoint", [&] {
    entry.job.set_checkpoint_step(c.step());
    entry.job.set_checkpoint_path(c.path());
    *entry.job.mutable_update_time() = TimeUtil::GetCurrentTime();
  });
}

void JobManager::ChangeAndWrite(Entry& entry, const char* what,
                                const std::function<void()>& change) {
  Job record;
  uint64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    change();
    record = entry.job;
    version = ++entry.record_version;
  }
  const absl::Status s = WriteRecord(entry, record, version);
  if (!s.ok()) {
    std::fprintf(stderr, "tandemd: cannot record the %s of %s: %s\n", what, record.id().c_str(),
                 s.ToString().c_str());
  }
}

absl::Status JobManager::WriteRecord(Entry& entry, const Job& record, uint64_t version,
                                     const std::vector<JobEvent>& events,
                                     JobStore::Priority priority) {
  absl::MutexLock lock(&entry.write_mu);
  // A copy older than the one stored: its change is in that one. Events come
  // only with the newest copy (they are written under mu_), so none is lost.
  if (version <= entry.written_version && events.empty()) return absl::OkStatus();
  absl::Status s = store_->UpdateJob(record, events, priority);
  if (s.ok()) entry.written_version = std::max(entry.written_version, version);
  return s;
}

// The state a run leaves its job in, and why.
std::pair<JobState, std::string> JobManager::EndOfRun(const Entry& entry,
                                                      const absl::Status& status, bool stopping) {
  const Job& record = entry.job;
  if (status.ok()) {
    return {tandem::v1::JOB_STATE_SUCCEEDED,
            absl::StrFormat("finished %d steps", record.progress().step())};
  }
  // A cancel asked for while the run was stuck (a distributed run in its
  // rendezvous or a failing collective, which end UNAVAILABLE or
  // DEADLINE_EXCEEDED rather than CANCELLED) still ends the job: it must not
  // be restarted as if a rank had been lost.
  if (entry.cancel_requested) return {tandem::v1::JOB_STATE_CANCELLED, entry.cancel_reason};
  const auto& d = record.resolved_spec().distributed();
  if (status.code() == absl::StatusCode::kCancelled && (stopping || d.replicas() <= 1)) {
    return {
        tandem::v1::JOB_STATE_QUEUED,
        absl::StrCat("interrupted by tandemd shutting down; resumes from its checkpoint at step ",
                     record.checkpoint_step())};
  }
  // A distributed job that lost a rank (a collective or the rendezvous gave
  // up, or too few peers are healthy), or whose ranks stopped together for a
  // peer that is shutting down (a CANCELLED run nobody here asked for),
  // restarts every rank from rank 0's checkpoint while its fault wait lasts.
  const bool lost_rank = status.code() == absl::StatusCode::kUnavailable ||
                         status.code() == absl::StatusCode::kDeadlineExceeded ||
                         status.code() == absl::StatusCode::kCancelled ||
                         (status.code() == absl::StatusCode::kFailedPrecondition &&
                          absl::StrContains(status.message(), "healthy"));
  if (d.replicas() > 1 && lost_rank) {
    const absl::Duration waited = absl::Now() - entry.fault_since;
    const absl::Duration budget = absl::Seconds(d.fault_wait_seconds());
    const bool peer_stopped = status.code() == absl::StatusCode::kCancelled;
    if (waited < budget) {
      return {
          tandem::v1::JOB_STATE_QUEUED,
          absl::StrCat(peer_stopped ? "the ranks stopped together for a rank's tandemd "
                                      "shutting down ("
                                    : "a rank was lost (",
                       status.message(), "); restarting every rank from the checkpoint at step ",
                       record.checkpoint_step(), " once enough peers are healthy (",
                       absl::FormatDuration(absl::Trunc(budget - waited, absl::Seconds(1))),
                       " of distributed.fault_wait_seconds left)")};
    }
    return {tandem::v1::JOB_STATE_FAILED,
            absl::StrCat("a rank was lost and the ranks could not restart within "
                         "distributed.fault_wait_seconds (",
                         d.fault_wait_seconds(), " s): ", status.message())};
  }
  return {tandem::v1::JOB_STATE_FAILED, std::string(status.message())};
}

void JobManager::FinishRun(Entry& entry, Trainer* trainer, const absl::Status& status) {
  Job& record = entry.job;
  if (trainer != nullptr) {
    *record.mutable_progress() = trainer->progress();
    // The prediction and re-plans are the closed loop's: a re-calibrated
    // plan's prediction is in the record, not in the runner, which runs on.
    const double predicted = record.metrics().predicted_step_seconds();
    const int replans = record.metrics().replans();
    const tandem::v1::DistributedStats distributed = record.metrics().distributed();
    *record.mutable_metrics() = trainer->metrics();
    record.mutable_metrics()->set_replans(replans);
    *record.mutable_metrics()->mutable_distributed() = distributed;
    record.set_checkpoint_step(trainer->checkpoint_step());
    record.set_checkpoint_path(trainer->checkpoint_path());
    if (!trainer->has_runner() || node::SamePlacement(record.plan(), trainer->runner().plan())) {
      record.mutable_metrics()->set_predicted_step_seconds(predicted);
    } else {
      *record.mutable_plan() = trainer->runner().plan();
    }
    if (trainer->has_runner()) {
      *record.mutable_schedule() = trainer->runner().program();
      *record.mutable_measured_timeline() = trainer->runner().last_timeline();
    }
  }
  reserved_host_ -= entry.estimate.host_bytes;
  reserved_accelerator_ -= entry.estimate.accelerator_bytes;
  PublishLocked();
  entry.running = false;
  --running_;
  if (!status.ok() && entry.fault_since == absl::InfiniteFuture()) entry.fault_since = absl::Now();
  const auto [next, reason] = EndOfRun(entry, status, stopping_);
  if (next == tandem::v1::JOB_STATE_QUEUED && record.resolved_spec().distributed().replicas() > 1 &&
      !status.ok() && !stopping_) {
    entry.not_before = absl::Now() + absl::Seconds(2);  // give the peers a moment
  }
  if (next == tandem::v1::JOB_STATE_FAILED) {
    JobEvent e;
    e.mutable_log()->set_severity(tandem::v1::LOG_SEVERITY_ERROR);
    e.mutable_log()->set_message(reason);
    AppendEvent(entry, std::move(e));  // stored too: the sequence has no gap
  }
  const std::string id = record.id();
  const absl::Status s = Transition(entry, next, reason);
  if (!s.ok()) {
    std::fprintf(stderr,
                 "tandemd: cannot record the end of %s yet (%s): it is served from memory and "
                 "written when the store takes it\n",
                 id.c_str(), s.ToString().c_str());
  }
  UpdateJobMetrics(entry);
  if (IsTerminal(next)) {
    entry.log->Close();
    if (entry.unrecorded.empty()) live_.erase(id);
    KeepSeriesOfFinished(id);
  }
}

void JobManager::EndQueuedLocked(Entry& entry, JobState state, const std::string& reason) {
  // The end itself, if the store cannot take it now, is kept and written later.
  const absl::Status s = Transition(entry, state, reason);
  if (!s.ok()) {
    std::fprintf(stderr, "tandemd: cannot record that %s is %s yet: %s\n", entry.job.id().c_str(),
                 StateLabel(state), s.ToString().c_str());
  }
  entry.log->Close();
  if (entry.unrecorded.empty()) live_.erase(entry.job.id());
  // A job re-queued after a run (a lost rank) has that run's series.
  KeepSeriesOfFinished(entry.job.id());
  dirty_ = true;
}

void JobManager::KeepSeriesOfFinished(const std::string& id) {
  finished_series_.push_back(id);
  if (finished_series_.size() > kFinishedSeriesKept) {
    ForgetJobSeries(finished_series_.front());
    finished_series_.pop_front();
  }
}

void JobManager::TrackTelemetry(const std::string& id, Entry& entry, Trainer* trainer) {
  std::vector<std::string> names;
  for (int l = 0; l < trainer->model().num_layers(); ++l) {
    names.push_back(trainer->model().layer(l).name());
  }
  auto telemetry = std::make_shared<profile::JobTelemetry>(std::move(names));
  trainer->set_timing_sink(telemetry.get());
  metrics_->job_telemetry->Track(id, telemetry);
  absl::MutexLock lock(&mu_);
  entry.telemetry = std::move(telemetry);
}

void JobManager::StartPlanLoop(std::shared_ptr<Entry> entry, Trainer& trainer,
                               const std::shared_ptr<const node::NodeOffer>& offer) {
  if (!offer || trainer.runner().plan().layers_size() == 0) return;
  auto loop = std::make_shared<node::PlanLoop>(trainer.model(), trainer.resolved_spec(), *offer,
                                               trainer.runner().plan(), node::PlanLoopOptions{});
  // A pipeline is timed and solved again from this model's layer profile
  // measured here, if any, as a submission now would be (its corrections are
  // measured over the same figures, so either source re-times the running
  // split to what was measured).
  if (loop->pipeline() && !trainer.resolved_spec().placement().has_plan()) {
    loop->set_planned_from(layer_profiles_.Load(trainer.model(), trainer.resolved_spec(), *offer));
  }
  const node::PlanLoop* raw = loop.get();
  std::string id;
  {
    absl::MutexLock lock(&mu_);  // entry->job is mu_'s (a cancel replaces it)
    id = entry->job.id();
  }
  const prometheus::Labels labels = {{"job_id", id}};
  prometheus::Gauge* checked = &metrics_->job_checked_step_seconds.Add(labels);
  prometheus::Gauge* ratio = &metrics_->job_step_time_ratio.Add(labels);
  node::PlanLoopHooks hooks;
  hooks.checked = [this, entry, checked, ratio](const node::PlanCheck& c) {
    checked->Set(c.measured_step_seconds);
    if (c.predicted_step_seconds > 0)
      ratio->Set(c.measured_step_seconds / c.predicted_step_seconds);
    absl::MutexLock lock(&mu_);
    const int n = entry->job.plan_history_size();
    if (n > 0) {
      entry->job.mutable_plan_history(n - 1)->set_measured_step_seconds(c.measured_step_seconds);
    }
  };
  hooks.measured = [this, entry](double seconds, int /*steps*/) {
    absl::MutexLock lock(&mu_);
    const int n = entry->job.plan_history_size();
    if (n > 0) entry->job.mutable_plan_history(n - 1)->set_measured_step_seconds(seconds);
  };
  hooks.log = [this, entry](const std::string& line) {
    JobEvent e;
    e.mutable_log()->set_severity(tandem::v1::LOG_SEVERITY_INFO);
    e.mutable_log()->set_message(line);
    AppendEvent(*entry, e);
  };
  hooks.adopted = [this, entry, id, raw](const node::PlanLoop::Decision& d, int64_t step) {
    RecordReplan(*entry, id, *raw, d, step);
  };
  hooks.settled_corrections = [this, id, raw](const node::PipelineCorrections& c, double ratio,
                                              const std::string& source) {
    KeepCorrections(id, *raw, c,
                    absl::StrFormat("%s; then scaled by x%.3f, what %d steps under the plan they "
                                    "gave measured over its prediction",
                                    source, ratio, node::kSettledCorrectionSteps));
  };
  hooks.collectives = [this, id, raw](tandem::v1::CollectiveProfile fits) {
    fits.set_job_id(id);
    fits.set_measured_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    const absl::Status kept = collective_profiles_.Store(raw->resolved_spec(), raw->node(), fits);
    if (!kept.ok()) {
      std::fprintf(stderr, "tandemd: cannot keep job %s's collectives: %s\n", id.c_str(),
                   kept.ToString().c_str());
    }
  };
  node::AttachPlanLoop(std::move(loop), std::move(hooks), trainer.callbacks());
}

void JobManager::KeepCorrections(const std::string& job_id, const node::PlanLoop& loop,
                                 const node::PipelineCorrections& corrections,
                                 const std::string& measured) {
  tandem::v1::PipelineCorrectionProfile kept = node::CorrectionProfileOf(corrections);
  kept.set_job_id(job_id);
  kept.set_measured_unix_seconds(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  kept.set_measured(measured);
  const tandem::v1::Profile* base = loop.planned_from() ? &*loop.planned_from() : nullptr;
  const absl::Status cached = pipeline_corrections_.Store(loop.model(), loop.resolved_spec(),
                                                          loop.node(), base, std::move(kept));
  if (!cached.ok()) {
    std::fprintf(stderr, "tandemd: cannot keep a pipeline's stage corrections: %s\n",
                 cached.ToString().c_str());
  }
}

void JobManager::RecordReplan(Entry& entry, const std::string& job_id, const node::PlanLoop& loop,
                              const node::PlanLoop::Decision& d, int64_t step) {
  metrics_->replans
      .Add({{"reason", ReplanLabel(d.reason)}, {"placement", d.placement_changed ? "new" : "same"}})
      .Increment();
  if (d.measured_profile) {
    const absl::Status cached =
        layer_profiles_.Store(loop.model(), loop.resolved_spec(), loop.node(), *d.measured_profile);
    if (!cached.ok()) {
      std::fprintf(stderr, "tandemd: cannot cache a layer profile of %s: %s\n",
                   loop.model().fingerprint().substr(0, 12).c_str(), cached.ToString().c_str());
    }
  }
  if (loop.pipeline() && d.reason == tandem::v1::REPLAN_REASON_SLOWER) {
    // The split those factors chose measured slower: not for the next job.
    const tandem::v1::Profile* base = loop.planned_from() ? &*loop.planned_from() : nullptr;
    pipeline_corrections_.Forget(loop.model(), loop.resolved_spec(), loop.node(), base);
  } else if (d.corrections) {
    KeepCorrections(job_id, loop, *d.corrections, d.cost_source);
  }
  // The record follows the plan: a restart resumes under the plan the run
  // switched to (checkpoints hold no plan, so either one resumes exactly).
  ChangeAndWrite(entry, "new plan", [&] { ApplyReplan(entry, d, step); });
}

void JobManager::ApplyReplan(Entry& entry, const node::PlanLoop::Decision& d, int64_t step) {
  Job& job = entry.job;
  if (job.plan_history_size() == 0) {  // a job submitted before plan histories
    *job.add_plan_history() = PlanRecordOf(job.plan(), "", 0);
  }
  tandem::v1::PlanRecord* last = job.mutable_plan_history(job.plan_history_size() - 1);
  last->set_measured_step_seconds(d.check.measured_step_seconds);
  last->set_replaced_at_step(step);
  last->set_replaced_reason(d.reason);
  last->set_replaced_because(d.because);
  last->set_placement_changed(d.placement_changed);
  *job.add_plan_history() = PlanRecordOf(d.plan, d.cost_source, step);
  // A record stays small however often a job resumes: its first plan and the
  // latest ones.
  while (job.plan_history_size() > kPlanHistoryKept) {
    job.mutable_plan_history()->DeleteSubrange(1, 1);
  }
  *job.mutable_plan() = d.plan;
  // The step program of a new placement, as submission stores it.
  if (d.placement_changed) {
    *job.mutable_schedule() =
        d.program.ByteSizeLong() <= kMaxStoredProgramBytes ? d.program : tandem::v1::Schedule();
  }
  job.mutable_metrics()->set_predicted_step_seconds(d.plan.prediction().iteration_seconds());
  job.mutable_metrics()->set_replans(job.metrics().replans() + 1);
  *job.mutable_update_time() = TimeUtil::GetCurrentTime();
  UpdateJobMetrics(entry);
}

void JobManager::ForgetJobSeries(const std::string& job_id) {
  const prometheus::Labels old = {{"job_id", job_id}};
  for (auto* f :
       {&metrics_->job_loss, &metrics_->job_samples_per_second, &metrics_->job_step_seconds,
        &metrics_->job_progress, &metrics_->job_eval_accuracy,
        &metrics_->job_predicted_step_seconds, &metrics_->job_checked_step_seconds,
        &metrics_->job_step_time_ratio, &metrics_->job_update_wait_seconds,
        &metrics_->job_update_exchanges, &metrics_->job_loss_scale, &metrics_->job_skipped_steps}) {
    RemoveSeries(*f, old);
  }
  for (const char* rule : kUpdateRules) {
    RemoveSeries(metrics_->job_update_rule, {{"job_id", job_id}, {"rule", rule}});
  }
  for (const char* stat : {"mean", "max"}) {
    RemoveSeries(metrics_->job_update_staleness, {{"job_id", job_id}, {"stat", stat}});
  }
  for (int lag = 0; lag < kMaxLagLabel; ++lag) {
    RemoveSeries(metrics_->job_update_lagged, {{"job_id", job_id}, {"lag", absl::StrCat(lag)}});
  }
  RemoveSeries(metrics_->job_update_lagged,
               {{"job_id", job_id}, {"lag", absl::StrCat(kMaxLagLabel, "+")}});
  RemoveSeries(metrics_->job_ranks, old);
  RemoveCollectiveSeries(metrics_->job_collective_bytes, metrics_->job_collective_seconds, old);
  for (int stage = 0; stage < kMaxPipelineStages; ++stage) {
    const std::string k = absl::StrCat(stage);
    for (const char* phase : kPipelinePhases) {
      RemoveSeries(metrics_->job_pipeline_stage_seconds,
                   {{"job_id", job_id}, {"stage", k}, {"phase", phase}});
    }
    for (const char* kind : {"peak", "predicted"}) {
      RemoveSeries(metrics_->job_pipeline_stage_bytes,
                   {{"job_id", job_id}, {"stage", k}, {"kind", kind}});
    }
  }
  RemoveSeries(metrics_->job_step_duration, old, metrics_->job_step_duration_buckets);
  RemoveSeries(metrics_->job_steps, old);
  metrics_->job_telemetry->Forget(job_id);
}

void JobManager::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    accepting_ = false;
    stopping_ = true;
    PublishLocked();
    for (auto& [id, e] : live_) {
      if (!e->running) continue;
      e->stop = true;
      if (e->vote) e->vote->Request();
    }
  }
  if (scheduler_.joinable()) scheduler_.join();
  // Wait for runners to checkpoint and re-queue their jobs.
  std::vector<std::thread> runners;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [done, thread] : runners_) runners.push_back(std::move(thread));
    runners_.clear();
  }
  for (std::thread& t : runners) t.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : live_) e->log->Close(/*shutting_down=*/true);
  }
  FlushEvents();
  {
    // A job every event of which the store holds needs no reservation: after
    // the restart its events number on from its last, with no jump
    // (event_log.h).
    absl::MutexLock lock(&mu_);
    for (auto& [id, e] : live_) {
      const absl::StatusOr<uint64_t> stored = store_->LastEventSequence(id);
      if (stored.ok() && *stored >= e->log->last_sequence()) {
        store_->ReleaseEventSequences(id).IgnoreError();
      }
    }
  }
  // A last try for state changes the store has refused; what still cannot be
  // written is said, job by job: such a job resumes from its checkpoint after
  // a restart, as if the daemon had stopped while it ran.
  RetryUnrecorded();
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : live_) {
    if (e->unrecorded.empty()) continue;
    std::fprintf(stderr,
                 "tandemd: stopping with %zu state change(s) of %s not recorded (now %s): the "
                 "store keeps the job as it was, so after a restart it resumes from its "
                 "checkpoint at step %lld\n",
                 e->unrecorded.size(), id.c_str(), StateLabel(e->job.state()),
                 static_cast<long long>(e->job.checkpoint_step()));
  }
}

namespace {

// Why jobs are not accepted, "" when they are; in the order a user acts on.
std::string NotAcceptingReason(bool accepting, const std::string& unresponsive,
                               const absl::Status& read_only, const absl::Status& space) {
  if (!accepting) return "tandemd is shutting down";
  if (!unresponsive.empty()) return unresponsive;
  if (!read_only.ok()) return std::string(read_only.message());
  if (!space.ok()) return std::string(space.message());
  return "";
}

}  // namespace

void JobManager::PublishLocked() {
  Published p;
  p.reserved_host_bytes = reserved_host_;
  p.reserved_accelerator_bytes = reserved_accelerator_;
  p.accepting = accepting_;
  for (const auto& [id, e] : live_) {
    if (e->job.state() == tandem::v1::JOB_STATE_QUEUED) ++p.queued;
    if (e->allocator) p.allocators.push_back(e->allocator.get());
  }
  metrics_->device_memory_reserved.Add({{"device", "cpu"}}).Set(reserved_host_);
  absl::MutexLock lock(&published_mu_);
  p.unresponsive = std::move(published_.unresponsive);
  published_ = std::move(p);
}

void JobManager::SetUnresponsive(const std::string& reason) {
  absl::MutexLock lock(&published_mu_);
  published_.unresponsive = reason;
}

std::string JobManager::ProbeNotAccepting() {
  // statvfs outside the lock: a stalled disk must not hold every job RPC.
  const absl::Status space = CheckStateSpace();
  absl::MutexLock lock(&mu_);
  return NotAcceptingReason(accepting_, "", store_->read_only(), space);
}

JobManager::Snapshot JobManager::TakeSnapshot() {
  Snapshot s;
  absl::StatusOr<std::map<JobState, int64_t>> counts = store_->CountByState();
  if (counts.ok()) s.jobs_by_state = *counts;
  const absl::Status space = CheckStateSpace();
  absl::MutexLock lock(&published_mu_);
  s.not_accepting_reason =
      NotAcceptingReason(published_.accepting, published_.unresponsive, store_->read_only(), space);
  s.accepting = s.not_accepting_reason.empty();
  s.reserved_host_bytes = published_.reserved_host_bytes;
  s.reserved_accelerator_bytes = published_.reserved_accelerator_bytes;
  s.queued = published_.queued;
  for (const HostAllocator* allocator : published_.allocators) {
    const MemoryStats m = allocator->stats();
    for (int c = 0; c < kMemoryCategoryCount; ++c)
      s.host_memory.in_use_bytes[c] += m.in_use_bytes[c];
    s.host_memory.total_in_use_bytes += m.total_in_use_bytes;
  }
  return s;
}

}  // namespace tandem::server
