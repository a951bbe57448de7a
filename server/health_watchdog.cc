#include "server/health_watchdog.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem::server {

HealthWatchdog::HealthWatchdog(std::function<std::string()> probe,
                               std::function<void(const std::string&, bool)> set_serving,
                               HealthWatchdogOptions options)
    : probe_(std::move(probe)), set_serving_(std::move(set_serving)), options_(options) {
  // The first answer before the constructor returns, so that a client asking
  // right after start-up finds both services.
  const std::string not_accepting = probe_();
  Set("", true, "");
  Set(kTandemServiceName, not_accepting.empty(), not_accepting);
  probe_thread_ = std::thread([this] { ProbeLoop(); });
  monitor_thread_ = std::thread([this] { MonitorLoop(); });
}

HealthWatchdog::~HealthWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  monitor_thread_.join();
  probe_thread_.join();
}

void HealthWatchdog::ProbeLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      probe_started_ = absl::Now();
    }
    std::string not_accepting = probe_();
    absl::MutexLock lock(&mu_);
    probe_started_ = absl::InfiniteFuture();
    probed_ = true;
    not_accepting_ = std::move(not_accepting);
    auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval);
  }
}

void HealthWatchdog::MonitorLoop() {
  while (true) {
    bool probed, stuck;
    absl::Duration running;
    std::string not_accepting;
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stop_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), options_.interval / 4)) return;
      probed = probed_;
      running = absl::Now() - probe_started_;
      stuck = running > options_.deadline;
      not_accepting = not_accepting_;
    }
    if (!probed && !stuck) continue;  // the first probe is still within its deadline
    const std::string why = stuck ? absl::StrFormat("the job manager has not answered for %.1f s",
                                                    absl::ToDoubleSeconds(running))
                                  : not_accepting;
    Set("", !stuck, why);
    Set(kTandemServiceName, !stuck && not_accepting.empty(), why);
  }
}

void HealthWatchdog::Set(const std::string& service, bool serving, const std::string& why) {
  int& last = service.empty() ? overall_ : service_;
  if (last == static_cast<int>(serving)) return;
  const bool first = last < 0;
  last = serving;
  set_serving_(service, serving);
  if (first && serving) return;
  std::fprintf(stderr, "tandemd: health%s%s %s%s%s\n", service.empty() ? "" : " of ",
               service.c_str(), serving ? "SERVING" : "NOT_SERVING", serving ? "" : ": ",
               serving ? "" : why.c_str());
}

}  // namespace tandem::server
