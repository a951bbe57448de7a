#include "server/work_lane.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem::server {

WorkLane::WorkLane(WorkLaneOptions options)
    : options_(std::move(options)), pool_(options_.threads, options_.name) {}

WorkLane::~WorkLane() = default;

absl::Status WorkLane::Submit(const std::string& client, std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    const int queued = in_flight_ - pool_.size();
    if (queued >= options_.max_queued) {
      return absl::ResourceExhaustedError(absl::StrCat(
          options_.name, " requests: ", in_flight_, " are already running or queued (at most ",
          pool_.size(), " run and ", options_.max_queued, " wait); retry later"));
    }
    int& mine = per_client_[client];
    if (mine >= options_.max_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrCat(options_.name, " requests: this client (", client, ") already has ", mine,
                       " running or queued, the most one client may; retry when one ends"));
    }
    ++mine;
    ++in_flight_;
    if (options_.on_in_flight) options_.on_in_flight(in_flight_);
  }
  pool_.Schedule([this, client, task = std::move(task)] {
    task();
    Done(client);
  });
  return absl::OkStatus();
}

void WorkLane::Done(const std::string& client) {
  absl::MutexLock lock(&mu_);
  --in_flight_;
  if (options_.on_in_flight) options_.on_in_flight(in_flight_);
  auto it = per_client_.find(client);
  if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
}

int WorkLane::in_flight() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

std::string PeerClient(const std::string& peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) return peer;
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos || colon < 5) return peer;
  return peer.substr(0, colon);
}

}  // namespace tandem::server
