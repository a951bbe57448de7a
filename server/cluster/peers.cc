#include "server/cluster/peers.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/time_util.h"
#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::server {
namespace {

// HOST:PORT with a port in [1, 65535].
bool ValidAddress(const std::string& a) {
  const size_t colon = a.rfind(':');
  int port = 0;
  return colon != std::string::npos && colon > 0 && absl::SimpleAtoi(a.substr(colon + 1), &port) &&
         port > 0 && port < 65536;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParsePeerList(const std::string& flag) {
  std::vector<std::string> peers;
  for (absl::string_view part : absl::StrSplit(flag, ',', absl::SkipWhitespace())) {
    const std::string a(absl::StripAsciiWhitespace(part));
    if (!ValidAddress(a)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: \"", a, "\" is not HOST:PORT with a port in [1, 65535]"));
    }
    peers.push_back(a);
  }
  return peers;
}

PeerSet::PeerSet(PeerSetOptions options) : options_(std::move(options)) {
  // Listed from the start, unhealthy until checked: GetNode may be served
  // before the first check ends, and an empty list would read as "all healthy".
  for (const std::string& a : options_.static_peers) {
    if (a == options_.self) continue;
    tandem::v1::PeerInfo& info = latest_[a];
    info.set_address(a);
    info.set_reason("not checked yet");
    order_.push_back(a);
  }
  if (!options_.dns.empty() && order_.empty()) {
    // The name stands for its peers until the first lookup finds them.
    tandem::v1::PeerInfo& info = latest_[options_.dns];
    info.set_address(options_.dns);
    info.set_reason("not looked up yet (--peers_dns)");
    order_.push_back(options_.dns);
  }
}

PeerSet::~PeerSet() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void PeerSet::Start() {
  if (empty()) return;
  CheckAll();
  thread_ = std::thread([this] {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
        if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval)) return;
      }
      CheckAll();
    }
  });
}

std::vector<std::string> PeerSet::Addresses() {
  std::vector<std::string> all = options_.static_peers;
  if (!options_.dns.empty()) {
    const size_t colon = options_.dns.rfind(':');
    const std::string name = options_.dns.substr(0, colon), port = options_.dns.substr(colon + 1);
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(name.c_str(), port.c_str(), &hints, &found) == 0) {
      std::vector<std::string> resolved;
      for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
        char host[NI_MAXHOST];
        if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), nullptr, 0,
                        NI_NUMERICHOST) != 0) {
          continue;
        }
        const std::string h = a->ai_family == AF_INET6 ? absl::StrCat("[", host, "]") : host;
        resolved.push_back(absl::StrCat(h, ":", port));
      }
      freeaddrinfo(found);
      std::sort(resolved.begin(), resolved.end());
      resolved.erase(std::unique(resolved.begin(), resolved.end()), resolved.end());
      for (const std::string& r : resolved) {
        if (std::find(all.begin(), all.end(), r) == all.end()) all.push_back(r);
      }
    }
  }
  all.erase(std::remove(all.begin(), all.end(), options_.self), all.end());
  return all;
}

std::shared_ptr<grpc::Channel> PeerSet::Channel(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& c = channels_[address];
  if (c == nullptr) c = grpc::CreateChannel(address, options_.credentials.channel);
  return c;
}

tandem::v1::PeerInfo PeerSet::Check(const std::string& address, bool* late) {
  tandem::v1::PeerInfo info;
  info.set_address(address);
  auto stub = tandem::v1::Tandem::NewStub(Channel(address));
  grpc::ClientContext context;
  options_.credentials.Prepare(context, options_.timeout);
  tandem::v1::GetNodeRequest request;
  tandem::v1::NodeInfo node;
  const grpc::Status s = stub->GetNode(&context, request, &node);
  *info.mutable_checked_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  *late = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  if (!s.ok()) {
    info.set_reason(absl::StrCat("GetNode: ", s.error_message(), " (code ",
                                 static_cast<int>(s.error_code()), ")"));
    return info;
  }
  info.set_hostname(node.hostname());
  for (const auto& d : node.devices()) {
    if (d.kind() == tandem::v1::DEVICE_KIND_CPU) {
      info.set_host_memory_budget_bytes(d.memory_budget_bytes());
      info.set_host_memory_reserved_bytes(d.memory_reserved_bytes());
    }
    if (d.kind() == tandem::v1::DEVICE_KIND_CUDA) info.set_cuda_devices(info.cuda_devices() + 1);
  }
  info.set_emulated_accelerators(node.emulated_accelerators());
  info.set_healthy(node.accepting_jobs());
  if (!node.accepting_jobs()) {
    info.set_reason(absl::StrCat("not accepting jobs: ", node.not_accepting_reason()));
  }
  return info;
}

void PeerSet::CheckAll() {
  const std::vector<std::string> addresses = Addresses();
  std::map<std::string, tandem::v1::PeerInfo> checked;
  std::map<std::string, bool> late;
  for (const std::string& a : addresses) checked[a] = Check(a, &late[a]);
  absl::MutexLock lock(&mu_);
  std::map<std::string, int> late_in_a_row;
  for (auto& [a, info] : checked) {
    if (!late[a]) continue;
    const int n = late_in_a_row[a] = late_[a] + 1;
    auto before = latest_.find(a);
    if (before != latest_.end() && before->second.healthy() &&
        n <= options_.slow_checks_tolerated) {
      // Keep the last answer's figures, say that this one was late.
      const std::string why = info.reason();
      const google::protobuf::Timestamp when = info.checked_time();
      info = before->second;
      info.set_reason(absl::StrCat("still counted healthy: ", n, " late check", n == 1 ? "" : "s",
                                   " in a row of ", options_.slow_checks_tolerated, " tolerated (",
                                   why, ")"));
      *info.mutable_checked_time() = when;
    }
  }
  latest_ = std::move(checked);
  late_ = std::move(late_in_a_row);
  order_ = addresses;
}

std::vector<tandem::v1::PeerInfo> PeerSet::Snapshot() {
  absl::MutexLock lock(&mu_);
  std::vector<tandem::v1::PeerInfo> out;
  for (const std::string& a : order_) out.push_back(latest_[a]);
  return out;
}

}  // namespace tandem::server
