// The rendezvous of a distributed job's ranks (docs/distributed.md). The
// coordinator (the daemon that accepted the job) keeps a RendezvousTable and
// serves it over tandem.v1.Cluster; each rank reaches it through a Gloo
// rendezvous Store: LocalStore on the coordinator's own rank 0, RemoteStore on
// the other daemons. Keys carry the job's id and run, so runs never meet.
// Thread-safe.
#ifndef TANDEM_SERVER_CLUSTER_RENDEZVOUS_H_
#define TANDEM_SERVER_CLUSTER_RENDEZVOUS_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/cluster.grpc.pb.h"

namespace tandem::server {

class RendezvousTable {
 public:
  // At most this many keys and bytes per value: the table serves peers, and a
  // peer that floods it is refused rather than let it grow.
  static constexpr int kMaxKeys = 1 << 16;
  static constexpr int kMaxValueBytes = 1 << 20;

  // A run's keys live under its prefix ("<job>/run-<n>/"), which Open
  // makes usable and Erase closes. FAILED_PRECONDITION for a key under a
  // closed prefix: a rank that joins after its run ended (still loading its
  // data when it was stopped) leaves nothing behind.
  absl::Status Set(const std::string& key, const std::string& value);
  // Every key's value, waiting up to `timeout` for those not set yet;
  // DEADLINE_EXCEEDED naming the missing ones; FAILED_PRECONDITION at once
  // for keys under a closed prefix.
  absl::StatusOr<std::vector<std::string>> Get(const std::vector<std::string>& keys,
                                               absl::Duration timeout);
  // A run begins under `prefix` (reopened if it was closed).
  void Open(const std::string& prefix);
  // Drops every key that starts with `prefix` and closes it (a run has
  // ended). The latest kClosedKept closed prefixes are remembered.
  void Erase(const std::string& prefix);
  int size();
  static constexpr size_t kClosedKept = 4096;

 private:
  // Whether `key` is under a closed prefix.
  bool ClosedLocked(const std::string& key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  // Closed prefixes (none a prefix of another: each ends "/run-<n>/"), and
  // the order they closed in.
  std::set<std::string> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> closed_order_ ABSL_GUARDED_BY(mu_);
};

// Credentials and the bearer token for calls to other daemons: the same TLS
// and token clients use.
struct PeerCredentials {
  std::shared_ptr<grpc::ChannelCredentials> channel;
  std::string token;
  // Adds the token to a call's metadata and sets its deadline.
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;
};

// Gloo's Store over a RendezvousTable in this process, under `prefix`.
// Like RemoteStore, a wait gives up once `stopped` says so (rank 0's job was
// cancelled while its ranks join), within a slice of RemoteStore::kSlice.
class LocalStore final : public gloo::rendezvous::Store {
 public:
  LocalStore(RendezvousTable* table, std::string prefix, absl::Duration timeout,
             std::function<bool()> stopped = nullptr)
      : table_(table),
        prefix_(std::move(prefix)),
        timeout_(timeout),
        stopped_(std::move(stopped)) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, ToChrono(timeout_)); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  static std::chrono::milliseconds ToChrono(absl::Duration d) {
    return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
  }
  // The table's values of `keys` (under prefix_), waiting up to `timeout`.
  std::vector<std::string> Wait(const std::vector<std::string>& keys, absl::Duration timeout);
  RendezvousTable* const table_;
  const std::string prefix_;
  const absl::Duration timeout_;
  const std::function<bool()> stopped_;
};

// Gloo's Store over the coordinator's Rendezvous RPCs, under `prefix`. A
// wait asks in slices of at most kSlice and gives up (UNAVAILABLE, "stopped")
// once `stopped` says so: a rank stopped while it joins (StopRank: its run
// failed elsewhere) ends within a slice instead of holding its memory for the
// whole rendezvous timeout.
class RemoteStore final : public gloo::rendezvous::Store {
 public:
  static constexpr absl::Duration kSlice = absl::Seconds(1);
  RemoteStore(std::shared_ptr<grpc::Channel> channel, PeerCredentials credentials,
              std::string prefix, absl::Duration timeout, std::function<bool()> stopped = nullptr);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> Fetch(const std::vector<std::string>& keys, absl::Duration timeout);
  std::unique_ptr<tandem::v1::Cluster::Stub> stub_;
  const PeerCredentials credentials_;
  const std::string prefix_;
  const absl::Duration timeout_;
  const std::function<bool()> stopped_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_CLUSTER_RENDEZVOUS_H_
