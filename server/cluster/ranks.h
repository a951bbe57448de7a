// Distributed jobs across tandemd daemons (docs/distributed.md).
//
// The daemon that accepts a job with distributed.replicas = N > 1 coordinates
// it: its JobManager runs the job as rank 0 (the job's record, events and
// metrics are rank 0's), and when a run starts the Coordinator picks where
// ranks 1..N-1 run (one rank per accelerator of a node for a job with an
// accelerator, its own first; one per node for a CPU job), starts rank r
// there through tandem.v1.Cluster/StartRank
// (all or nothing: a refusal stops the ranks already started, and the run
// fails saying which node lacked what), and joins them over Gloo through the
// rendezvous it serves. Every rank trains its share of each global batch with
// a DataParallelRunner. When the run ends, for whatever reason, the
// coordinator stops whatever ranks are left.
//
// RankHost is the other side: the ranks this daemon runs for coordinators,
// each on a thread with the memory StartRank reserved for it, checkpointing
// under <state_dir>/ranks/ at the same steps as rank 0.
//
// ClusterService serves both over gRPC, behind the same token as the rest.
#ifndef TANDEM_SERVER_CLUSTER_RANKS_H_
#define TANDEM_SERVER_CLUSTER_RANKS_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "runtime/dist/rank_step.h"
#include "runtime/train/partitioned_checkpoint.h"
#include "server/auth.h"
#include "server/cluster/peers.h"
#include "server/cluster/rendezvous.h"
#include "server/job_manager.h"
#include "tandem/v1/cluster.grpc.pb.h"

namespace tandem::server {

// The node's offer as it is now (JobManager::node()): what a rank with an
// accelerator is planned on.
using NodeSource = std::function<std::shared_ptr<const node::NodeOffer>()>;

// The Gloo transport's address for a daemon reached at HOST:PORT: HOST.
std::string HostOf(const std::string& address);

// How many ranks of `resolved` a node with `emulated` emulated accelerators
// and `cuda` CUDA devices runs: one per accelerator of the job's kind, one
// for a job without an accelerator. The second form reads `node`'s offer
// (null: one emulated accelerator, no CUDA device).
int RanksPerNode(const tandem::v1::JobSpec& resolved, int emulated, int cuda);
int RanksPerNode(const tandem::v1::JobSpec& resolved, const node::NodeOffer* node);

// The StartRank requests of ranks 1..N-1 of a run of `job_id` on `nodes`
// (rank r on nodes[r - 1]), whose coordinator is `self`. One rank per
// accelerator: rank 0 has this node's first, the others take each node's
// next in rank order. `threads_shared`: the job's own spec sets no
// training.threads, so each node's ranks share that node's cores
// (RankThreads), not the part of the coordinator's that `spec` carries.
std::vector<tandem::v1::StartRankRequest> StartRankRequests(const std::string& job_id, int attempt,
                                                            const tandem::v1::JobSpec& spec,
                                                            bool threads_shared,
                                                            const std::vector<std::string>& nodes,
                                                            const std::string& self);

// The threads of the rank `request` starts on a node whose jobs get
// `job_threads` (--job_threads; 0: all) of its `node_cores`: the spec's
// training.threads where set, else the node's cores shared evenly among its
// request.ranks_here ranks (0, from an older coordinator: `job_threads`).
int RankThreads(const tandem::v1::StartRankRequest& request, int job_threads, int node_cores);

class RankHost {
 public:
  // `metrics` (may be null) gets each running rank's collectives.
  RankHost(JobManager* jobs, PeerSet* peers, std::string state_dir,
           ServerMetrics* metrics = nullptr);
  // Stops every rank and waits for their threads.
  ~RankHost();

  // A node runs one rank per accelerator: several ranks of a job may run
  // here, each on its own accelerator_index.
  absl::StatusOr<tandem::v1::RankStatus> Start(const tandem::v1::StartRankRequest& request);
  // A rank is its coordinator's job's: `coordinator` as StartRank named it
  // (empty: any coordinator's job of that id, as older coordinators ask).
  // `rank` 0: every rank of the job here (the status is the first's).
  absl::StatusOr<tandem::v1::RankStatus> Stop(const std::string& coordinator,
                                              const std::string& job_id, int rank,
                                              const std::string& why);
  // `rank` 0: the lowest-numbered rank of the job here.
  absl::StatusOr<tandem::v1::RankStatus> Get(const std::string& coordinator,
                                             const std::string& job_id, int rank);
  // Asks every rank to stop (tandemd is shutting down) without waiting.
  void StopAll(const std::string& why);
  // Ranks running now.
  int running();

 private:
  struct Rank;
  // Ranks 1..N-1 of each coordinator's job.
  static std::string RankKey(const tandem::v1::StartRankRequest& r);
  // Whether `rank` is of `coordinator`'s (empty: anyone's) `job_id`.
  static bool OfJob(const Rank& rank, const std::string& coordinator, const std::string& job_id);
  // UNAVAILABLE unless the request's accelerator_index names one of this
  // node's accelerators of the job's kind (0 for CPU jobs): the node's offer
  // may have changed since the coordinator placed the rank (INVALID_ARGUMENT
  // for a negative one).
  absl::Status CheckAcceleratorIndex(const tandem::v1::StartRankRequest& r) const;
  // UNAVAILABLE (retried on the job's next run) while ranks of an earlier
  // run of the job are still stopping here, which they are asked to; else
  // ALREADY_EXISTS while the same rank, or another rank of the job on the
  // same accelerator, runs here.
  absl::Status CheckNotRunning(const tandem::v1::StartRankRequest& r)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(std::shared_ptr<Rank> rank);
  // The rank's trainer: its checkpoints here, its runner joining the others
  // through the coordinator's rendezvous; its callbacks: the stop vote, its
  // step, its collectives on the metrics.
  TrainerOptions OptionsFor(const Rank& rank, HostAllocator* allocator) const;
  TrainerCallbacks CallbacksFor(std::shared_ptr<Rank> rank, const prometheus::Labels& labels);
  // A finished rank stays (GetRank answers for it, its series stay exported
  // with their last values) until kEndedRanksKept newer ranks have finished;
  // then its record and series go, and its thread is joined by the next
  // Start (or the destructor).
  void Ended(std::shared_ptr<Rank> rank, const prometheus::Labels& labels);
  static constexpr size_t kEndedRanksKept = 64;

  JobManager* const jobs_;
  PeerSet* const peers_;
  const std::string state_dir_;
  ServerMetrics* const metrics_;
  absl::Mutex mu_;
  // By RankKey.
  std::map<std::string, std::shared_ptr<Rank>> ranks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The ended ranks, oldest first, with their series' labels.
  std::deque<std::pair<std::shared_ptr<Rank>, prometheus::Labels>> ended_ ABSL_GUARDED_BY(mu_);
  // Threads of ranks whose records went, to join outside mu_.
  std::vector<std::thread> finished_threads_ ABSL_GUARDED_BY(mu_);
};

class Coordinator {
 public:
  Coordinator(PeerSet* peers, RendezvousTable* table) : peers_(peers), table_(table) {}
  // Where rank 0 of a job with an accelerator is planned (the JobManager's
  // current offer); set before the first run begins.
  void set_node_source(NodeSource node) { node_ = std::move(node); }

  // At submission: OK when the cluster has enough healthy nodes for the
  // job's ranks now; FAILED_PRECONDITION saying which are missing or why
  // they are unhealthy otherwise.
  absl::Status Admit(const tandem::v1::JobSpec& resolved);
  // At the start of a run of `job` (a resolved distributed job). A
  // ZeRO-partitioned job whose `checkpoint_dir` holds a committed manifest
  // restarts each rank on the node that holds its partition, and waits (as
  // for a lost rank) while that node is not healthy.
  DistributedRun Begin(const tandem::v1::Job& job, const std::string& checkpoint_dir);

 private:
  // RanksPerNode of this node (its node offer), rank 0 included.
  int SelfSlots(const tandem::v1::JobSpec& resolved) const;
  // The nodes of ranks 1..N-1 (this node's own address for a rank besides
  // rank 0 here; a node once per rank), or why there are not enough.
  absl::StatusOr<std::vector<std::string>> PickNodes(const tandem::v1::JobSpec& resolved);
  // The nodes `placement` names for ranks 1..N-1, when all are healthy peers.
  absl::StatusOr<std::vector<std::string>> PinnedNodes(const PartitionPlacement& placement);
  // A run's nodes for ranks 1..N-1: those holding the partitions of the
  // newest manifest in `checkpoint_dir` when there is one, else PickNodes'.
  absl::StatusOr<std::vector<std::string>> NodesFor(const tandem::v1::JobSpec& resolved,
                                                    const std::string& checkpoint_dir);

  PeerSet* const peers_;
  RendezvousTable* const table_;
  NodeSource node_;
};

class ClusterService final : public tandem::v1::Cluster::Service {
 public:
  ClusterService(Authenticator auth, RankHost* ranks, RendezvousTable* table)
      : auth_(std::move(auth)), ranks_(ranks), table_(table) {}
  grpc::Status StartRank(grpc::ServerContext* context, const tandem::v1::StartRankRequest* request,
                         tandem::v1::RankStatus* response) override;
  grpc::Status StopRank(grpc::ServerContext* context, const tandem::v1::StopRankRequest* request,
                        tandem::v1::RankStatus* response) override;
  grpc::Status GetRank(grpc::ServerContext* context, const tandem::v1::GetRankRequest* request,
                       tandem::v1::RankStatus* response) override;
  grpc::Status RendezvousSet(grpc::ServerContext* context,
                             const tandem::v1::RendezvousSetRequest* request,
                             tandem::v1::RendezvousSetResponse* response) override;
  grpc::Status RendezvousGet(grpc::ServerContext* context,
                             const tandem::v1::RendezvousGetRequest* request,
                             tandem::v1::RendezvousGetResponse* response) override;

 private:
  const Authenticator auth_;
  RankHost* const ranks_;
  RendezvousTable* const table_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_CLUSTER_RANKS_H_
