#include "server/event_log.h"

#include <algorithm>

#include "google/protobuf/util/time_util.h"

namespace tandem::server {

EventLog::EventLog(std::string job_id, uint64_t last_sequence, size_t max_in_memory,
                   Reserve reserve, uint64_t reserved_through)
    : job_id_(std::move(job_id)),
      first_sequence_(last_sequence + 1),
      max_in_memory_(std::max<size_t>(1, max_in_memory)),
      reserve_(std::move(reserve)),
      reserved_through_(std::max(last_sequence, reserved_through)) {}

tandem::v1::JobEvent EventLog::Append(tandem::v1::JobEvent event) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    event.set_job_id(job_id_);
    event.set_sequence(first_sequence_ + events_.size());
    if (reserve_ && event.sequence() > reserved_through_) {
      reserved_through_ = event.sequence() - 1 + kReserveBlock;
      reserve_(reserved_through_);
    }
    if (!event.has_time())
      *event.mutable_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    events_.push_back(event);
    if (events_.size() > max_in_memory_) {
      events_.pop_front();
      ++first_sequence_;
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->second.first <= event.sequence()) {
        wake.push_back(std::move(it->second.second));
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Outside the lock: a waiter may read the log from its wake-up.
  for (auto& w : wake) w();
  return event;
}

std::vector<tandem::v1::JobEvent> EventLog::Read(uint64_t from, int max,
                                                 uint64_t* first_in_memory) const {
  absl::MutexLock lock(&mu_);
  *first_in_memory = first_sequence_;
  std::vector<tandem::v1::JobEvent> out;
  if (from < first_sequence_) from = first_sequence_;
  for (uint64_t s = from;
       s < first_sequence_ + events_.size() && static_cast<int>(out.size()) < max; ++s) {
    out.push_back(events_[s - first_sequence_]);
  }
  return out;
}

uint64_t EventLog::last_sequence() const {
  absl::MutexLock lock(&mu_);
  return first_sequence_ + events_.size() - 1;
}

void EventLog::Close(bool shutting_down) {
  std::vector<std::function<void()>> wake;
  {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    shutting_down_ = shutting_down;
    for (auto& [handle, waiter] : waiters_) wake.push_back(std::move(waiter.second));
    waiters_.clear();
  }
  for (auto& w : wake) w();
}

bool EventLog::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

bool EventLog::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shutting_down_;
}

int64_t EventLog::WaitFor(uint64_t from, std::function<void()> wake) {
  absl::MutexLock lock(&mu_);
  if (closed_ || from < first_sequence_ + events_.size()) return 0;
  const int64_t handle = next_handle_++;
  waiters_.emplace(handle, std::make_pair(from, std::move(wake)));
  return handle;
}

void EventLog::CancelWait(int64_t handle) {
  absl::MutexLock lock(&mu_);
  waiters_.erase(handle);
}

}  // namespace tandem::server
