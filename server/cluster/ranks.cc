#include "server/cluster/ranks.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "runtime/dist/data_parallel_runner.h"
#include "runtime/dist/plan_rank.h"
#include "runtime/train/trainer.h"
#include "server/tandem_service.h"

namespace tandem::server {
namespace {

absl::Duration Seconds(double s) { return absl::Milliseconds(static_cast<int64_t>(s * 1000)); }

// The rendezvous keys of one run of one job.
std::string RunPrefix(const std::string& job_id, int attempt) {
  return absl::StrCat(job_id, "/run-", attempt, "/");
}

OptimizerSharding ShardingOf(const tandem::v1::JobSpec& resolved) {
  return resolved.distributed().sharding() == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED
             ? OptimizerSharding::kPartitioned
             : OptimizerSharding::kReplicated;
}

// A runner factory joining `ranks` ranks as `rank` through `store` (made when
// the factory runs, so that its waits count from then): the CPU engine's rank
// for a job without an accelerator, else one running the rank's plan for its
// share on this node (`node`'s offer when the run starts) on its accelerator
// `accelerator_index`.
RunnerFactory DataParallelFactory(
    int rank, int ranks, std::string prefix, std::string hostname,
    std::function<std::unique_ptr<gloo::rendezvous::Store>()> make_store,
    std::shared_ptr<StopVote> vote, NodeSource node, int accelerator_index = 0) {
  return [=](const Model& model, const tandem::v1::JobSpec& resolved, int64_t max_batch,
             Allocator* allocator) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
    const auto& d = resolved.distributed();
    CommunicatorOptions copts;
    copts.hostname = hostname;
    copts.timeout = Seconds(d.collective_timeout_seconds());
    copts.rendezvous_timeout = Seconds(d.rendezvous_timeout_seconds());
    std::unique_ptr<gloo::rendezvous::Store> store = make_store();
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Connect(*store, prefix, rank, ranks, copts);
    if (!comm.ok()) return comm.status();
    DataParallelOptions options;
    options.sharding = ShardingOf(resolved);
    options.bucket_bytes = d.bucket_bytes();
    options.stop_vote = vote;
    if (resolved.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE) {
      const std::shared_ptr<const node::NodeOffer> offer = node ? node() : nullptr;
      if (offer == nullptr) return absl::InternalError("no node offer to plan a rank on");
      TANDEM_ASSIGN_OR_RETURN(
          node::RankExecutor executor,
          node::PrepareRankExecutor(model, resolved, *offer, ranks, allocator, accelerator_index));
      // The per-step agreement's own connections (plan_rank.h).
      TANDEM_ASSIGN_OR_RETURN(
          std::unique_ptr<Communicator> control,
          Communicator::Connect(*store, prefix + "-control", rank, ranks, copts));
      TANDEM_ASSIGN_OR_RETURN(
          std::unique_ptr<PlanRankRunner> runner,
          PlanRankRunner::Create(model, std::move(executor.options), max_batch, *std::move(comm),
                                 std::move(control), options, std::move(executor.accelerator)));
      return std::unique_ptr<StepRunner>(std::move(runner));
    }
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DataParallelRunner> runner,
                            DataParallelRunner::Create(model, resolved.optimizer(), max_batch,
                                                       resolved.training().seed(), allocator,
                                                       *std::move(comm), options));
    return std::unique_ptr<StepRunner>(std::move(runner));
  };
}

// The spec every rank of a run gets: `resolved`, and for a job with an
// accelerator the rank plan (node::RankPlan: `stored`, the job's plan solved
// at submission, else solved here) pinned as its placement.plan, so that
// every rank runs the same step program.
absl::StatusOr<tandem::v1::JobSpec> PinRankPlan(const Model& model,
                                                const tandem::v1::JobSpec& resolved,
                                                const NodeSource& node,
                                                const tandem::v1::Plan& stored) {
  if (resolved.placement().accelerator() == tandem::v1::ACCELERATOR_KIND_NONE) return resolved;
  const std::shared_ptr<const node::NodeOffer> offer = node ? node() : nullptr;
  if (offer == nullptr) return absl::InternalError("no node offer to plan the ranks on");
  TANDEM_ASSIGN_OR_RETURN(
      tandem::v1::Plan plan,
      node::RankPlan(model, resolved, *offer, resolved.distributed().replicas(), &stored));
  tandem::v1::JobSpec pinned = resolved;
  *pinned.mutable_placement()->mutable_plan() = std::move(plan);
  return pinned;
}

// One tandem.v1.Cluster call to the daemon at `address`, with the cluster's
// credentials and a deadline of `timeout`.
template <typename Request, typename Response>
grpc::Status CallPeer(PeerSet* peers, const std::string& address, absl::Duration timeout,
                      grpc::Status (tandem::v1::Cluster::Stub::*method)(grpc::ClientContext*,
                                                                        const Request&, Response*),
                      const Request& request, Response* response) {
  auto stub = tandem::v1::Cluster::NewStub(peers->Channel(address));
  grpc::ClientContext context;
  peers->credentials().Prepare(context, timeout);
  return ((*stub).*method)(&context, request, response);
}

}  // namespace

std::vector<tandem::v1::StartRankRequest> StartRankRequests(const std::string& job_id, int attempt,
                                                            const tandem::v1::JobSpec& spec,
                                                            bool threads_shared,
                                                            const std::vector<std::string>& nodes,
                                                            const std::string& self) {
  std::map<std::string, int> ranks_here = {{self, 1}};
  for (const std::string& node : nodes) ++ranks_here[node];
  std::vector<tandem::v1::StartRankRequest> requests;
  std::map<std::string, int> next_accelerator = {{self, 1}};
  for (size_t i = 0; i < nodes.size(); ++i) {
    tandem::v1::StartRankRequest& request = requests.emplace_back();
    if (spec.placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE) {
      request.set_accelerator_index(next_accelerator[nodes[i]]++);
    }
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_rank(static_cast<int>(i) + 1);
    request.set_ranks(spec.distributed().replicas());
    request.set_coordinator(self);
    *request.mutable_spec() = spec;
    // The coordinator's share of its own cores says nothing of this node's.
    if (threads_shared) request.mutable_spec()->mutable_training()->clear_threads();
    request.set_ranks_here(ranks_here[nodes[i]]);
    request.set_hostname(HostOf(nodes[i]));
  }
  return requests;
}

int RankThreads(const tandem::v1::StartRankRequest& request, int job_threads, int node_cores) {
  const int set = request.spec().training().threads();
  if (set > 0 || request.ranks_here() <= 0) return set > 0 ? set : job_threads;
  return node::ThreadsPerRank(job_threads, node_cores, request.ranks_here());
}

namespace {

// What ranks 1..N-1 of `job_id` on `nodes` say they are doing, as a clause
// for a failed run's reason ("rank 1 on 10.0.0.2:50051: JOB_STATE_FAILED
// (...)", or that its daemon does not answer); `failed_alone` is set when one
// of them failed for a reason of its own (not a lost peer, a timeout or a
// stop), which no restart mends.
std::string RankStates(PeerSet* peers, const std::vector<std::string>& nodes,
                       const std::string& job_id, bool* failed_alone) {
  std::vector<std::string> states;
  for (size_t i = 0; i < nodes.size(); ++i) {
    tandem::v1::GetRankRequest request;
    request.set_coordinator(peers->self());
    request.set_job_id(job_id);
    request.set_rank(static_cast<int>(i) + 1);
    tandem::v1::RankStatus status;
    const grpc::Status s = CallPeer(peers, nodes[i], absl::Seconds(2),
                                    &tandem::v1::Cluster::Stub::GetRank, request, &status);
    states.push_back(absl::StrCat(
        "rank ", i + 1, " on ", nodes[i], ": ",
        s.ok() ? absl::StrCat(tandem::v1::JobState_Name(status.state()), " (", status.reason(), ")")
               : absl::StrCat("unreachable (", s.error_message(), ")")));
    // A rank's reason for FAILED is its status, "CODE: message".
    if (s.ok() && status.state() == tandem::v1::JOB_STATE_FAILED) {
      bool transient = false;
      for (const char* code : {"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "CANCELLED"}) {
        transient |= absl::StartsWith(status.reason(), code);
      }
      *failed_alone |= !transient;
    }
  }
  return absl::StrJoin(states, "; ");
}

// Stops ranks 1..N-1 of `job_id` on `started` (best effort: a rank's daemon
// may be gone).
void StopStartedRanks(PeerSet* peers, const std::vector<std::string>& started,
                      const std::string& job_id, const std::string& why) {
  for (size_t i = 0; i < started.size(); ++i) {
    tandem::v1::StopRankRequest request;
    request.set_coordinator(peers->self());
    request.set_job_id(job_id);
    request.set_rank(static_cast<int>(i) + 1);
    request.set_reason(why);
    tandem::v1::RankStatus status;
    CallPeer(peers, started[i], absl::Seconds(2), &tandem::v1::Cluster::Stub::StopRank, request,
             &status);
  }
}

// Starts rank i + 1 on nodes[i] with requests[i], in turn, each started node
// appended to `started` and `picked`; the first refusal names its rank.
absl::Status StartPeerRanks(PeerSet* peers,
                            const std::vector<tandem::v1::StartRankRequest>& requests,
                            const std::vector<std::string>& nodes,
                            std::vector<std::string>* started, std::vector<std::string>* picked) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    tandem::v1::RankStatus status;
    const grpc::Status s = CallPeer(peers, nodes[i], absl::Seconds(30),
                                    &tandem::v1::Cluster::Stub::StartRank, requests[i], &status);
    if (!s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("rank ", i + 1, " on node ", nodes[i],
                                       " could not start: ", s.error_message()));
    }
    started->push_back(nodes[i]);
    picked->push_back(nodes[i]);
  }
  return absl::OkStatus();
}

// A failed run's `status` with what each started rank says it is doing. A
// rank that failed on its own (a spec or memory error on its node) is not a
// lost rank: restarting would fail alike, so the job fails now (ABORTED)
// instead of retrying for distributed.fault_wait_seconds.
absl::Status ExplainedFailure(PeerSet* peers, const std::vector<std::string>& started,
                              const std::string& job_id, const absl::Status& status) {
  if (started.empty()) return status;
  bool failed_alone = false;
  const std::string states = RankStates(peers, started, job_id, &failed_alone);
  return absl::Status(failed_alone ? absl::StatusCode::kAborted : status.code(),
                      absl::StrCat(status.message(), "; ", states));
}

// `s` as one path component: letters, digits, '-' and '.' kept, the rest '_'
// ("10.0.0.2:50051" -> "10.0.0.2_50051").
std::string PathPart(const std::string& s) {
  std::string out = s;
  for (char& c : out) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '.') c = '_';
  }
  return out == "." || out == ".." ? "_" : out;
}

// A rank's checkpoints from before they were kept under their coordinator
// (ranks/<job>/rank-<r>): moved to `keyed` when that does not exist yet, so
// that a partitioned job whose daemons were upgraded mid-run finds its
// partitions (best effort: a failure leaves the run to fail as it would).
void AdoptUnkeyedCheckpoints(const std::string& unkeyed, const std::string& keyed) {
  std::error_code e;
  if (!std::filesystem::is_directory(unkeyed, e) || std::filesystem::exists(keyed, e)) return;
  std::filesystem::create_directories(std::filesystem::path(keyed).parent_path(), e);
  std::filesystem::rename(unkeyed, keyed, e);
  std::fprintf(stderr, "tandemd: moved rank checkpoints %s to %s%s\n", unkeyed.c_str(),
               keyed.c_str(), e ? absl::StrCat(" failed: ", e.message()).c_str() : "");
}

bool SafeId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return id != "." && id != "..";
}

}  // namespace

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// ---------------------------------------------------------------- RankHost

struct RankHost::Rank {
  tandem::v1::StartRankRequest request;
  std::shared_ptr<void> memory;
  // What StartRank reserved: estimate.host_bytes.
  MemoryEstimate estimate;
  std::shared_ptr<StopVote> vote = std::make_shared<StopVote>();
  std::atomic<bool> stop{false};
  std::atomic<int64_t> step{0};
  absl::Mutex mu;
  tandem::v1::JobState state ABSL_GUARDED_BY(mu) = tandem::v1::JOB_STATE_QUEUED;
  std::string reason ABSL_GUARDED_BY(mu) = "joining the other ranks";
  std::thread thread;

  tandem::v1::RankStatus Status() {
    tandem::v1::RankStatus s;
    s.set_job_id(request.job_id());
    s.set_rank(request.rank());
    s.set_attempt(request.attempt());
    s.set_step(step.load());
    s.set_reserved_host_bytes(estimate.host_bytes);
    absl::MutexLock lock(&mu);
    s.set_state(state);
    s.set_reason(reason);
    return s;
  }
  void SetState(tandem::v1::JobState s, std::string why) {
    absl::MutexLock lock(&mu);
    state = s;
    reason = std::move(why);
  }
  bool ended() {
    absl::MutexLock lock(&mu);
    return state == tandem::v1::JOB_STATE_SUCCEEDED || state == tandem::v1::JOB_STATE_FAILED ||
           state == tandem::v1::JOB_STATE_CANCELLED;
  }
};

RankHost::RankHost(JobManager* jobs, PeerSet* peers, std::string state_dir, ServerMetrics* metrics)
    : jobs_(jobs), peers_(peers), state_dir_(std::move(state_dir)), metrics_(metrics) {}

RankHost::~RankHost() {
  std::map<std::string, std::shared_ptr<Rank>> ranks;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    ranks = ranks_;
  }
  for (auto& [id, rank] : ranks) {
    rank->stop = true;
    rank->vote->Request();
  }
  for (auto& [id, rank] : ranks) {
    // A rank's thread moves under mu_ (Start, Ended), which a rank's end takes.
    std::thread thread;
    {
      absl::MutexLock lock(&mu_);
      thread = std::move(rank->thread);
    }
    if (thread.joinable()) thread.join();
  }
  // Every rank has ended: no Ended() adds to these any more.
  std::vector<std::thread> finished;
  {
    absl::MutexLock lock(&mu_);
    finished.swap(finished_threads_);
  }
  for (std::thread& t : finished) {
    if (t.joinable()) t.join();
  }
}

namespace {

// NOT_FOUND for rank `rank` of `job_id` (0: any of its ranks).
absl::Status NoRankHere(const std::string& job_id, int rank) {
  return absl::NotFoundError(rank == 0 ? absl::StrCat("no rank of ", job_id, " here")
                                       : absl::StrCat("no rank ", rank, " of ", job_id, " here"));
}

}  // namespace

std::string RankHost::RankKey(const tandem::v1::StartRankRequest& r) {
  return absl::StrCat(r.coordinator(), "/", r.job_id(), "#", r.rank());
}

bool RankHost::OfJob(const Rank& rank, const std::string& coordinator, const std::string& job_id) {
  return rank.request.job_id() == job_id &&
         (coordinator.empty() || rank.request.coordinator() == coordinator);
}

absl::Status RankHost::CheckAcceleratorIndex(const tandem::v1::StartRankRequest& r) const {
  const int index = r.accelerator_index();
  const int count = RanksPerNode(r.spec(), jobs_->node().get());
  const auto kind = r.spec().placement().accelerator();
  const char* what = kind == tandem::v1::ACCELERATOR_KIND_EMULATED
                         ? "emulated accelerators (tandemd --emulated_accelerators)"
                     : kind == tandem::v1::ACCELERATOR_KIND_CUDA ? "CUDA devices"
                                                                 : "accelerators";
  if (index < 0) return absl::InvalidArgumentError("accelerator_index: must be >= 0");
  if (index >= count) {
    // The coordinator placed it by this node's offer at its last health
    // check; UNAVAILABLE lets its next run place it by the offer now.
    return absl::UnavailableError(absl::StrCat("accelerator_index: ", index,
                                               " is not one of this daemon's ", count, " ", what,
                                               " (its offer changed since the coordinator's "
                                               "last health check?)"));
  }
  return absl::OkStatus();
}

absl::Status RankHost::CheckNotRunning(const tandem::v1::StartRankRequest& r) {
  // Ranks left from an earlier run whose StopRank never came (this node was
  // unreachable then), whatever their rank number or accelerator, are asked
  // to stop and hold the start back: they would only wait out their
  // collectives' timeout. A rank of this run is a conflict.
  std::vector<std::string> leftovers;
  absl::Status conflict;
  for (const auto& [key, rank] : ranks_) {
    const tandem::v1::StartRankRequest& other = rank->request;
    if (!OfJob(*rank, r.coordinator(), r.job_id()) || rank->ended()) continue;
    if (other.attempt() < r.attempt()) {
      rank->stop = true;
      rank->vote->Request();
      leftovers.push_back(absl::StrCat("rank ", other.rank(), " of run ", other.attempt()));
    } else if (!conflict.ok()) {
      continue;
    } else if (other.rank() == r.rank()) {
      conflict = absl::AlreadyExistsError(
          absl::StrCat("rank ", r.rank(), " of ", r.job_id(), " already runs here"));
    } else if (other.accelerator_index() == r.accelerator_index() &&
               r.spec().placement().accelerator() != tandem::v1::ACCELERATOR_KIND_NONE) {
      conflict = absl::AlreadyExistsError(absl::StrCat("accelerator_index: rank ", other.rank(),
                                                       " of ", r.job_id(), " already runs on ",
                                                       r.accelerator_index(), " here"));
    }
  }
  if (!leftovers.empty()) {
    return absl::UnavailableError(
        absl::StrCat(r.job_id(), "'s ", absl::StrJoin(leftovers, ", "), " still stopping here"));
  }
  return conflict;
}

absl::StatusOr<tandem::v1::RankStatus> RankHost::Start(const tandem::v1::StartRankRequest& r) {
  if (!SafeId(r.job_id())) {
    return absl::InvalidArgumentError("job_id: must be 1 to 128 letters, digits, '-', '_' or '.'");
  }
  if (r.ranks() < 2 || r.ranks() > 1024) {
    return absl::InvalidArgumentError("ranks: must be in [2, 1024]");
  }
  if (r.rank() < 1 || r.rank() >= r.ranks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank: must be in [1, ", r.ranks() - 1, "] (rank 0 is the coordinator's)"));
  }
  if (r.coordinator().empty() || r.hostname().empty()) {
    return absl::InvalidArgumentError("coordinator and hostname: both must be set");
  }
  if (r.coordinator().size() > 255) {
    return absl::InvalidArgumentError("coordinator: at most 255 characters");
  }
  if (r.spec().distributed().replicas() != r.ranks()) {
    return absl::InvalidArgumentError("spec.distributed.replicas: is not ranks");
  }
  TANDEM_RETURN_IF_ERROR(CheckAcceleratorIndex(r));
  TANDEM_ASSIGN_OR_RETURN(const MemoryEstimate estimate, jobs_->Estimate(r.spec()));
  auto rank = std::make_shared<Rank>();
  rank->request = r;
  rank->estimate = estimate;
  const std::string key = RankKey(r);
  {
    absl::MutexLock lock(&mu_);
    // UNAVAILABLE, as a daemon that is gone: the coordinator retries on
    // another run while its fault wait lasts.
    if (stopping_) return absl::UnavailableError("this tandemd is stopping");
    TANDEM_RETURN_IF_ERROR(CheckNotRunning(r));
  }
  const int64_t bytes = estimate.host_bytes;
  absl::StatusOr<std::shared_ptr<void>> memory =
      jobs_->HoldHostMemory(bytes, absl::StrCat("rank ", r.rank(), " of ", r.job_id()));
  if (!memory.ok()) return memory.status();
  rank->memory = *std::move(memory);
  // An ended rank of the same key is replaced; its thread, and those of
  // ranks whose records went, are joined outside mu_, since a rank's last
  // step (Ended) takes mu_ after it is seen ended.
  std::vector<std::thread> finished;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("this tandemd is stopping");
    TANDEM_RETURN_IF_ERROR(CheckNotRunning(r));
    auto it = ranks_.find(key);
    if (it != ranks_.end()) finished.push_back(std::move(it->second->thread));
    for (std::thread& t : finished_threads_) finished.push_back(std::move(t));
    finished_threads_.clear();
    ranks_[key] = rank;
    rank->thread = std::thread([this, rank] { Run(rank); });
  }
  for (std::thread& t : finished) {
    if (t.joinable()) t.join();
  }
  return rank->Status();
}

TrainerOptions RankHost::OptionsFor(const Rank& rank, HostAllocator* allocator) const {
  const tandem::v1::StartRankRequest& r = rank.request;
  const tandem::v1::JobSpec& spec = r.spec();
  TrainerOptions options;
  options.job_id = absl::StrCat(r.job_id(), "-rank", r.rank());
  // Every rank checkpoints at rank 0's steps: the whole state (replicated),
  // or its own partition of it, which rank 0's manifest names.
  // Under its coordinator: job ids are each daemon's own.
  options.checkpoint_dir = absl::StrCat(state_dir_, "/ranks/", PathPart(r.coordinator()), "/",
                                        r.job_id(), "/rank-", r.rank());
  AdoptUnkeyedCheckpoints(absl::StrCat(state_dir_, "/ranks/", r.job_id(), "/rank-", r.rank()),
                          options.checkpoint_dir);
  options.data_reserved_bytes = rank.estimate.data_bytes;
  // Rank 0's position, weights and buffers (and a replicated job's optimizer
  // state) reach every rank when the run starts; a partitioned rank then loads
  // its own partition of rank 0's step from here (partitioned_checkpoint.h).
  options.resume = false;
  options.spec_resolved = true;
  const std::shared_ptr<const node::NodeOffer> offer = jobs_->node();
  options.threads = RankThreads(r, jobs_->options().default_threads,
                                offer != nullptr ? offer->host.threads() : 1);
  const PathPolicy& policy = jobs_->options().data_policy;
  options.resolve_path = [&policy](const std::string& f, const std::string& p) {
    return policy.Resolve(f, p);
  };
  options.host_allocator = allocator;
  std::shared_ptr<grpc::Channel> channel = peers_->Channel(r.coordinator());
  const PeerCredentials credentials = peers_->credentials();
  const absl::Duration wait = Seconds(spec.distributed().rendezvous_timeout_seconds());
  const std::string prefix = RunPrefix(r.job_id(), r.attempt());
  options.make_runner = DataParallelFactory(
      r.rank(), r.ranks(), "gloo", r.hostname(),
      [channel, credentials, prefix, wait, stop = &rank.stop] {
        // A StopRank while the rank joins ends its wait (its Run holds the
        // rank, and so `stop`, until the trainer is gone).
        return std::make_unique<RemoteStore>(channel, credentials, prefix, wait,
                                             [stop] { return stop->load(); });
      },
      rank.vote, [jobs = jobs_] { return jobs->node(); }, r.accelerator_index());
  return options;
}

TrainerCallbacks RankHost::CallbacksFor(std::shared_ptr<Rank> rank,
                                        const prometheus::Labels& labels) {
  TrainerCallbacks callbacks;
  callbacks.should_stop = [rank] {
    if (rank->stop.load()) rank->vote->Request();
    return rank->vote->agreed();
  };
  callbacks.on_step = [rank](const tandem::v1::JobEvent::StepProgress& p) {
    rank->step = p.step();
  };
  if (metrics_ != nullptr) {
    callbacks.after_step = [this, labels](int64_t, double, const StepRunner& runner) {
      const tandem::v1::DistributedStats d = runner.distributed_stats();
      if (d.ranks() == 0) return;
      SetCollectiveSeries(metrics_->rank_collective_bytes, metrics_->rank_collective_seconds,
                          labels, d);
    };
  }
  return callbacks;
}

void RankHost::Run(std::shared_ptr<Rank> rank) {
  const tandem::v1::StartRankRequest& r = rank->request;
  const prometheus::Labels labels = {
      {"coordinator", r.coordinator()}, {"job_id", r.job_id()}, {"rank", absl::StrCat(r.rank())}};
  // The reservation less what the dataset and an emulated accelerator's
  // memory hold of it, as JobManager's runs.
  HostAllocator allocator(rank->estimate.RunnerHostBytes());
  absl::Status status;
  {
    absl::StatusOr<std::unique_ptr<Trainer>> trainer =
        Trainer::Create(r.spec(), OptionsFor(*rank, &allocator), CallbacksFor(rank, labels));
    if (trainer.ok()) {
      rank->SetState(tandem::v1::JOB_STATE_RUNNING, "running");
      status = (*trainer)->Run();
    } else {
      status = trainer.status();
    }
  }
  // Its memory goes back first, so that a rank seen ended holds nothing.
  rank->memory.reset();
  if (status.ok()) {
    rank->SetState(tandem::v1::JOB_STATE_SUCCEEDED, "finished");
  } else if (status.code() == absl::StatusCode::kCancelled) {
    rank->SetState(tandem::v1::JOB_STATE_CANCELLED, std::string(status.message()));
  } else {
    rank->SetState(tandem::v1::JOB_STATE_FAILED, status.ToString());
  }
  Ended(rank, labels);
  std::fprintf(stderr, "tandemd: rank %d of %s (coordinator %s) ended: %s\n", r.rank(),
               r.job_id().c_str(), r.coordinator().c_str(), rank->Status().reason().c_str());
}

void RankHost::Ended(std::shared_ptr<Rank> rank, const prometheus::Labels& labels) {
  absl::MutexLock lock(&mu_);
  ended_.emplace_back(std::move(rank), labels);
  if (ended_.size() <= kEndedRanksKept) return;
  auto [old, old_labels] = std::move(ended_.front());
  ended_.pop_front();
  auto it = ranks_.find(RankKey(old->request));
  // A newer run of the same rank replaced its record, and writes its series.
  if (it == ranks_.end() || it->second != old) return;
  finished_threads_.push_back(std::move(old->thread));
  ranks_.erase(it);
  if (metrics_ != nullptr) {
    RemoveCollectiveSeries(metrics_->rank_collective_bytes, metrics_->rank_collective_seconds,
                           old_labels);
  }
}

absl::StatusOr<tandem::v1::RankStatus> RankHost::Stop(const std::string& coordinator,
                                                      const std::string& job_id, int rank_number,
                                                      const std::string& why) {
  std::vector<std::shared_ptr<Rank>> stopped;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, rank] : ranks_) {
      if (!OfJob(*rank, coordinator, job_id)) continue;
      if (rank_number == 0 || rank->request.rank() == rank_number) stopped.push_back(rank);
    }
  }
  if (stopped.empty()) return NoRankHere(job_id, rank_number);
  for (const std::shared_ptr<Rank>& rank : stopped) {
    rank->stop = true;
    rank->vote->Request();
  }
  return stopped.front()->Status();
}

absl::StatusOr<tandem::v1::RankStatus> RankHost::Get(const std::string& coordinator,
                                                     const std::string& job_id, int rank_number) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<Rank> found;
  for (const auto& [key, rank] : ranks_) {
    if (!OfJob(*rank, coordinator, job_id)) continue;
    if (rank_number != 0 && rank->request.rank() != rank_number) continue;
    if (found == nullptr || rank->request.rank() < found->request.rank()) found = rank;
  }
  if (found == nullptr) return NoRankHere(job_id, rank_number);
  return found->Status();
}

void RankHost::StopAll(const std::string& why) {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (auto& [id, rank] : ranks_) {
    rank->stop = true;
    rank->vote->Request();
  }
}

int RankHost::running() {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (auto& [id, rank] : ranks_) n += rank->ended() ? 0 : 1;
  return n;
}

// ---------------------------------------------------------------- Coordinator

int RanksPerNode(const tandem::v1::JobSpec& resolved, int emulated, int cuda) {
  switch (resolved.placement().accelerator()) {
    case tandem::v1::ACCELERATOR_KIND_EMULATED:
      return std::max(1, emulated);
    case tandem::v1::ACCELERATOR_KIND_CUDA:
      return std::max(0, cuda);
    default:
      return 1;
  }
}

int RanksPerNode(const tandem::v1::JobSpec& resolved, const node::NodeOffer* node) {
  return node == nullptr ? RanksPerNode(resolved, 1, 0)
                         : RanksPerNode(resolved, node->emulated_accelerators,
                                        static_cast<int>(node->cuda_devices.size()));
}

int Coordinator::SelfSlots(const tandem::v1::JobSpec& resolved) const {
  const std::shared_ptr<const node::NodeOffer> offer = node_ ? node_() : nullptr;
  return std::max(1, RanksPerNode(resolved, offer.get()));
}

absl::StatusOr<std::vector<std::string>> Coordinator::PickNodes(
    const tandem::v1::JobSpec& resolved) {
  const auto& d = resolved.distributed();
  const int wanted = d.replicas() - 1;
  const std::vector<tandem::v1::PeerInfo> peers = peers_->Snapshot();
  const bool cpu = resolved.placement().accelerator() == tandem::v1::ACCELERATOR_KIND_NONE;
  // One rank per accelerator of the job's kind (per node for CPU jobs):
  // this node's after rank 0's, then each healthy peer's, in order.
  std::vector<std::string> slots, healthy, unhealthy;
  std::map<std::string, int> room;
  const int self_slots = SelfSlots(resolved);
  room[peers_->self()] = self_slots - 1;
  for (int k = 0; k < room[peers_->self()]; ++k) slots.push_back(peers_->self());
  for (const auto& p : peers) {
    if (p.healthy()) {
      healthy.push_back(p.address());
      room[p.address()] = RanksPerNode(resolved, p.emulated_accelerators(), p.cuda_devices());
      for (int k = 0; k < room[p.address()]; ++k) slots.push_back(p.address());
    } else {
      unhealthy.push_back(absl::StrCat(p.address(), " (", p.reason(), ")"));
    }
  }
  if (d.nodes_size() > 0) {
    std::vector<std::string> chosen;
    for (int i = 0; i < d.nodes_size(); ++i) {
      // "self" names the coordinator, as its own address does.
      const std::string n = d.nodes(i) == "self" ? peers_->self() : d.nodes(i);
      auto it = std::find_if(peers.begin(), peers.end(),
                             [&](const tandem::v1::PeerInfo& p) { return p.address() == n; });
      if (it == peers.end() && n != peers_->self()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "spec.distributed.nodes[", i, "]: ", n, " is not a peer of this tandemd (peers: ",
            healthy.empty() ? (peers.empty() ? "none" : "none healthy")
                            : absl::StrJoin(healthy, ", "),
            ")"));
      }
      if (it != peers.end() && !it->healthy()) {
        return absl::FailedPreconditionError(
            absl::StrCat("spec.distributed.nodes[", i, "]: ", n, " is unhealthy: ", it->reason()));
      }
      if (room[n]-- <= 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "spec.distributed.nodes[", i, "]: ", n, " has no accelerator left for another rank",
            cpu ? " (one rank per node for a job without an accelerator)" : ""));
      }
      chosen.push_back(n);
    }
    return chosen;
  }
  if (static_cast<int>(slots.size()) < wanted) {
    if (cpu) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spec.distributed.replicas: ", d.replicas(), " ranks need ", wanted,
          " other healthy tandemd node", wanted == 1 ? "" : "s",
          " (one rank per node); this one has ", healthy.size(),
          healthy.empty() ? "" : absl::StrCat(" (", absl::StrJoin(healthy, ", "), ")"),
          unhealthy.empty() ? "" : absl::StrCat("; unhealthy: ", absl::StrJoin(unhealthy, "; "))));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.distributed.replicas: ", d.replicas(), " ranks need ", d.replicas(),
        " accelerators (one rank per accelerator); this node has ", self_slots,
        " and its healthy peers ", slots.size() - (self_slots - 1),
        healthy.empty() ? "" : absl::StrCat(" (", absl::StrJoin(healthy, ", "), ")"),
        unhealthy.empty() ? "" : absl::StrCat("; unhealthy: ", absl::StrJoin(unhealthy, "; "))));
  }
  slots.resize(wanted);
  return slots;
}

absl::StatusOr<std::vector<std::string>> Coordinator::PinnedNodes(
    const PartitionPlacement& placement) {
  const std::vector<tandem::v1::PeerInfo> peers = peers_->Snapshot();
  for (size_t i = 0; i < placement.nodes.size(); ++i) {
    const std::string& n = placement.nodes[i];
    if (n == peers_->self()) continue;  // a rank this node ran besides rank 0
    auto it = std::find_if(peers.begin(), peers.end(),
                           [&](const tandem::v1::PeerInfo& p) { return p.address() == n; });
    if (it == peers.end() || !it->healthy()) {
      // "healthy" in the message: the job waits for the node as for a lost rank.
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", i + 1, "'s partition of the checkpoint at step ", placement.step, " is on ", n,
          ", which is not a healthy peer now",
          it == peers.end() ? " (not among the peers)" : absl::StrCat(" (", it->reason(), ")")));
    }
  }
  return placement.nodes;
}

absl::StatusOr<std::vector<std::string>> Coordinator::NodesFor(const tandem::v1::JobSpec& resolved,
                                                               const std::string& checkpoint_dir) {
  // A committed partitioned checkpoint binds each rank to its partition's node.
  const std::optional<PartitionPlacement> pinned =
      checkpoint_dir.empty() ? std::nullopt
                             : PartitionNodes(checkpoint_dir, resolved.distributed().replicas());
  return pinned ? PinnedNodes(*pinned) : PickNodes(resolved);
}

absl::Status Coordinator::Admit(const tandem::v1::JobSpec& resolved) {
  return PickNodes(resolved).status();
}

DistributedRun Coordinator::Begin(const tandem::v1::Job& job, const std::string& checkpoint_dir) {
  DistributedRun run;
  run.vote = std::make_shared<StopVote>();
  run.nodes = std::make_shared<std::vector<std::string>>();
  // The peers started for this run, shared with `end`.
  auto started = std::make_shared<std::vector<std::string>>();
  const std::string job_id = job.id();
  const int attempt = std::max(1, job.attempts());
  const std::string prefix = RunPrefix(job_id, attempt);
  PeerSet* peers = peers_;
  RendezvousTable* table = table_;
  table->Open(prefix);
  run.end = [peers, started, job_id, table, prefix] {
    StopStartedRanks(peers, *started, job_id, "the job's run ended on its coordinator");
    table->Erase(prefix);
  };
  auto picked_nodes = run.nodes;
  RunnerFactory join = DataParallelFactory(
      0, job.resolved_spec().distributed().replicas(), "gloo", HostOf(peers_->self()),
      [table, prefix, job, vote = run.vote] {
        // A cancel of the job (JobManager requests the vote) ends the wait.
        return std::make_unique<LocalStore>(
            table, prefix, Seconds(job.resolved_spec().distributed().rendezvous_timeout_seconds()),
            [vote] { return vote->requested(); });
      },
      run.vote, node_);
  run.factory = [this, job, attempt, started, join, picked_nodes, peers, checkpoint_dir](
                    const Model& model, const tandem::v1::JobSpec& resolved, int64_t max_batch,
                    Allocator* allocator) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
    TANDEM_ASSIGN_OR_RETURN(const std::vector<std::string> nodes,
                            NodesFor(resolved, checkpoint_dir));
    TANDEM_ASSIGN_OR_RETURN(const tandem::v1::JobSpec spec,
                            PinRankPlan(model, resolved, node_, job.plan()));
    picked_nodes->assign({"self"});
    TANDEM_RETURN_IF_ERROR(StartPeerRanks(
        peers,
        StartRankRequests(job.id(), attempt, spec, job.spec().training().threads() == 0, nodes,
                          peers->self()),
        nodes, started.get(), picked_nodes.get()));
    // On failure the run ends: `explain` adds what each rank was doing, and
    // `end` stops them.
    absl::StatusOr<std::unique_ptr<StepRunner>> runner = join(model, spec, max_batch, allocator);
    if (!runner.ok()) {
      return absl::Status(runner.status().code(),
                          absl::StrCat("the ranks did not join: ", runner.status().message()));
    }
    return runner;
  };
  run.explain = [peers, started, job_id](const absl::Status& status) {
    return ExplainedFailure(peers, *started, job_id, status);
  };
  return run;
}

// ---------------------------------------------------------------- ClusterService

grpc::Status ClusterService::StartRank(grpc::ServerContext* context,
                                       const tandem::v1::StartRankRequest* request,
                                       tandem::v1::RankStatus* response) {
  if (grpc::Status s = auth_.Check(*context); !s.ok()) return s;
  absl::StatusOr<tandem::v1::RankStatus> status = ranks_->Start(*request);
  if (!status.ok()) return ToGrpc(status.status());
  *response = *status;
  return grpc::Status::OK;
}

grpc::Status ClusterService::StopRank(grpc::ServerContext* context,
                                      const tandem::v1::StopRankRequest* request,
                                      tandem::v1::RankStatus* response) {
  if (grpc::Status s = auth_.Check(*context); !s.ok()) return s;
  absl::StatusOr<tandem::v1::RankStatus> status =
      ranks_->Stop(request->coordinator(), request->job_id(), request->rank(), request->reason());
  if (!status.ok()) return ToGrpc(status.status());
  *response = *status;
  return grpc::Status::OK;
}

grpc::Status ClusterService::GetRank(grpc::ServerContext* context,
                                     const tandem::v1::GetRankRequest* request,
                                     tandem::v1::RankStatus* response) {
  if (grpc::Status s = auth_.Check(*context); !s.ok()) return s;
  absl::StatusOr<tandem::v1::RankStatus> status =
      ranks_->Get(request->coordinator(), request->job_id(), request->rank());
  if (!status.ok()) return ToGrpc(status.status());
  *response = *status;
  return grpc::Status::OK;
}

grpc::Status ClusterService::RendezvousSet(grpc::ServerContext* context,
                                           const tandem::v1::RendezvousSetRequest* request,
                                           tandem::v1::RendezvousSetResponse*) {
  if (grpc::Status s = auth_.Check(*context); !s.ok()) return s;
  return ToGrpc(table_->Set(request->key(), request->value()));
}

grpc::Status ClusterService::RendezvousGet(grpc::ServerContext* context,
                                           const tandem::v1::RendezvousGetRequest* request,
                                           tandem::v1::RendezvousGetResponse* response) {
  if (grpc::Status s = auth_.Check(*context); !s.ok()) return s;
  if (request->keys_size() == 0 || request->keys_size() > 4096) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "keys: 1 to 4096 of them");
  }
  if (!(request->timeout_seconds() >= 0 && request->timeout_seconds() <= 3600)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "timeout_seconds: must be in [0, 3600]");
  }
  absl::StatusOr<std::vector<std::string>> values = table_->Get(
      {request->keys().begin(), request->keys().end()}, Seconds(request->timeout_seconds()));
  if (!values.ok()) return ToGrpc(values.status());
  for (std::string& v : *values) response->add_values(std::move(v));
  return grpc::Status::OK;
}

}  // namespace tandem::server
