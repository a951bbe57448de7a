#include "server/cluster/rendezvous.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"

namespace tandem::server {

absl::Status RendezvousTable::Set(const std::string& key, const std::string& value) {
  if (key.empty() || key.size() > 1024) {
    return absl::InvalidArgumentError("key: must be 1 to 1024 bytes");
  }
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value: more than ", kMaxValueBytes, " bytes"));
  }
  absl::MutexLock lock(&mu_);
  if (ClosedLocked(key)) {
    return absl::FailedPreconditionError(absl::StrCat("key ", key, ": its run has ended"));
  }
  if (values_.size() >= kMaxKeys && values_.count(key) == 0) {
    return absl::ResourceExhaustedError(absl::StrCat("the rendezvous holds ", kMaxKeys, " keys"));
  }
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> RendezvousTable::Get(const std::vector<std::string>& keys,
                                                              absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  for (const std::string& k : keys) {
    if (ClosedLocked(k)) {
      return absl::FailedPreconditionError(absl::StrCat("key ", k, ": its run has ended"));
    }
  }
  auto all_set = [&] {
    for (const std::string& k : keys) {
      if (values_.count(k) == 0) return false;
    }
    return true;
  };
  mu_.AwaitWithTimeout(absl::Condition(&all_set), timeout);
  std::vector<std::string> values, missing;
  for (const std::string& k : keys) {
    auto it = values_.find(k);
    if (it == values_.end()) {
      missing.push_back(k);
    } else {
      values.push_back(it->second);
    }
  }
  if (!missing.empty()) {
    return absl::DeadlineExceededError(absl::StrCat("Timed out after ",
                                                    absl::FormatDuration(timeout), " waiting for ",
                                                    absl::StrJoin(missing, ", ")));
  }
  return values;
}

bool RendezvousTable::ClosedLocked(const std::string& key) const {
  // The greatest closed prefix not after `key` is the only one it can start
  // with, none being a prefix of another.
  auto it = closed_.upper_bound(key);
  return it != closed_.begin() && absl::StartsWith(key, *std::prev(it));
}

void RendezvousTable::Open(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  if (closed_.erase(prefix) > 0) {
    closed_order_.erase(std::find(closed_order_.begin(), closed_order_.end(), prefix));
  }
}

void RendezvousTable::Erase(const std::string& prefix) {
  absl::MutexLock lock(&mu_);
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix);) {
    it = values_.erase(it);
  }
  if (closed_.insert(prefix).second) closed_order_.push_back(prefix);
  while (closed_order_.size() > kClosedKept) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

int RendezvousTable::size() {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(values_.size());
}

void PeerCredentials::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
}

// Gloo expects its Store to throw; the Communicator turns these into statuses.
namespace {
[[noreturn]] void Throw(const absl::Status& status) {
  throw gloo::IoException(std::string(status.message()));
}

// The values `get(slice)` finds, asked for in slices of at most
// RemoteStore::kSlice while `stopped` is given (else in one): a slice that
// ends DEADLINE_EXCEEDED with time left is followed by the next unless
// `stopped` says so. Throws what ends the wait.
template <typename Get>
std::vector<std::string> WaitInSlices(absl::Duration timeout, const std::function<bool()>& stopped,
                                      Get get) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = std::max(absl::ZeroDuration(), deadline - absl::Now());
    const absl::Duration slice = stopped ? std::min(left, RemoteStore::kSlice) : left;
    absl::StatusOr<std::vector<std::string>> values = get(slice);
    if (values.ok()) return *std::move(values);
    if (values.status().code() != absl::StatusCode::kDeadlineExceeded || slice >= left) {
      Throw(values.status());
    }
    if (stopped()) Throw(absl::UnavailableError("stopped while joining the other ranks"));
  }
}
}  // namespace

void LocalStore::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status s = table_->Set(prefix_ + key, std::string(data.begin(), data.end()));
  if (!s.ok()) Throw(s);
}

std::vector<std::string> LocalStore::Wait(const std::vector<std::string>& keys,
                                          absl::Duration timeout) {
  std::vector<std::string> full;
  for (const std::string& k : keys) full.push_back(prefix_ + k);
  return WaitInSlices(timeout, stopped_,
                      [&](absl::Duration slice) { return table_->Get(full, slice); });
}

std::vector<char> LocalStore::get(const std::string& key) {
  const std::string v = Wait({key}, timeout_)[0];
  return std::vector<char>(v.begin(), v.end());
}

void LocalStore::wait(const std::vector<std::string>& keys,
                      const std::chrono::milliseconds& timeout) {
  Wait(keys, std::min(timeout_, absl::FromChrono(timeout)));
}

RemoteStore::RemoteStore(std::shared_ptr<grpc::Channel> channel, PeerCredentials credentials,
                         std::string prefix, absl::Duration timeout, std::function<bool()> stopped)
    : stub_(tandem::v1::Cluster::NewStub(std::move(channel))),
      credentials_(std::move(credentials)),
      prefix_(std::move(prefix)),
      timeout_(timeout),
      stopped_(std::move(stopped)) {}

void RemoteStore::set(const std::string& key, const std::vector<char>& data) {
  tandem::v1::RendezvousSetRequest request;
  request.set_key(prefix_ + key);
  request.set_value(std::string(data.begin(), data.end()));
  tandem::v1::RendezvousSetResponse response;
  grpc::ClientContext context;
  credentials_.Prepare(context, timeout_);
  const grpc::Status s = stub_->RendezvousSet(&context, request, &response);
  if (!s.ok()) {
    Throw(absl::UnavailableError(
        absl::StrCat("the coordinator's rendezvous refused ", key, ": ", s.error_message())));
  }
}

std::vector<std::string> RemoteStore::Fetch(const std::vector<std::string>& keys,
                                            absl::Duration timeout) {
  tandem::v1::RendezvousGetRequest request;
  for (const std::string& k : keys) request.add_keys(prefix_ + k);
  return WaitInSlices(
      timeout, stopped_, [&](absl::Duration slice) -> absl::StatusOr<std::vector<std::string>> {
        request.set_timeout_seconds(absl::ToDoubleSeconds(slice));
        tandem::v1::RendezvousGetResponse response;
        grpc::ClientContext context;
        credentials_.Prepare(context, slice + absl::Seconds(5));
        const grpc::Status s = stub_->RendezvousGet(&context, request, &response);
        if (s.ok())
          return std::vector<std::string>(response.values().begin(), response.values().end());
        if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
          return absl::DeadlineExceededError(
              absl::StrCat("Timed out: the coordinator's rendezvous: ", s.error_message()));
        }
        return absl::UnavailableError(
            absl::StrCat("the coordinator's rendezvous: ", s.error_message()));
      });
}

std::vector<char> RemoteStore::get(const std::string& key) {
  const std::string v = Fetch({key}, timeout_)[0];
  return std::vector<char>(v.begin(), v.end());
}

void RemoteStore::wait(const std::vector<std::string>& keys) { Fetch(keys, timeout_); }

void RemoteStore::wait(const std::vector<std::string>& keys,
                       const std::chrono::milliseconds& timeout) {
  Fetch(keys, std::min(timeout_, absl::FromChrono(timeout)));
}

}  // namespace tandem::server
