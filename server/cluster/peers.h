// The other tandemd daemons of this one's cluster: --peers (static HOST:PORT
// list) and --peers_dns (a name whose address records, a Kubernetes headless
// Service's, are the peers; re-resolved at every check). A thread checks every
// peer's health with GetNode every `interval`; distributed jobs place their
// ranks on the healthy ones. A healthy peer whose answer is late (the check's
// deadline passes, as on a loaded machine) stays healthy until
// `slow_checks_tolerated` checks in a row have been late; a refused
// connection, an error or a peer that is not accepting jobs is unhealthy at
// once. Thread-safe.
#ifndef TANDEM_SERVER_CLUSTER_PEERS_H_
#define TANDEM_SERVER_CLUSTER_PEERS_H_

#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/rendezvous.h"
#include "tandem/v1/node.pb.h"

namespace tandem::server {

struct PeerSetOptions {
  std::vector<std::string> static_peers;
  // "NAME:PORT"; empty = none.
  std::string dns;
  // This daemon as peers reach it (--advertise): never its own peer.
  std::string self;
  PeerCredentials credentials;
  absl::Duration interval = absl::Seconds(2);
  absl::Duration timeout = absl::Seconds(2);
  // Late answers in a row a healthy peer keeps its health through.
  int slow_checks_tolerated = 2;
};

// "a:1,b:2" into addresses; INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<std::string>> ParsePeerList(const std::string& flag);

class PeerSet {
 public:
  explicit PeerSet(PeerSetOptions options);
  ~PeerSet();
  // Checks every peer once now, then every interval on its own thread.
  void Start();

  // The latest check of each peer, in --peers order then DNS order.
  std::vector<tandem::v1::PeerInfo> Snapshot();
  // Checks every peer now (Start's thread does so every interval).
  void CheckAll();
  bool empty() const { return options_.static_peers.empty() && options_.dns.empty(); }
  const std::string& self() const { return options_.self; }
  const PeerCredentials& credentials() const { return options_.credentials; }
  // A channel to `address` (cached).
  std::shared_ptr<grpc::Channel> Channel(const std::string& address);

 private:
  // One GetNode of `address`; *late: its deadline passed.
  tandem::v1::PeerInfo Check(const std::string& address, bool* late);
  std::vector<std::string> Addresses();

  const PeerSetOptions options_;
  absl::Mutex mu_;
  std::map<std::string, tandem::v1::PeerInfo> latest_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);
  // Late checks in a row of each peer.
  std::map<std::string, int> late_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_CLUSTER_PEERS_H_
