// Keeps grpc.health.v1 true to what the daemon can do. A probe thread calls a
// function that takes the locks every cheap RPC takes (the job manager's,
// JobManager::ProbeNotAccepting; GetNode does not wait on it, and tandemd
// passes a stuck probe on to it) over and over; a monitor thread sets:
//   - ""                  NOT_SERVING while a probe has been running longer
//                         than the deadline (the daemon cannot answer: a store
//                         write stuck on a failing disk, a lock held too long),
//                         SERVING again once probes finish;
//   - "tandem.v1.Tandem"  as "", and NOT_SERVING also while the probe says no
//                         jobs are accepted (a read-only store, a full state
//                         disk, shutdown): reads still work, submits do not.
// Each change is logged once to stderr. Thread-safe; the destructor stops both
// threads (a probe stuck for good is waited for: it holds the caller's locks).
#ifndef TANDEM_SERVER_HEALTH_WATCHDOG_H_
#define TANDEM_SERVER_HEALTH_WATCHDOG_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem::server {

struct HealthWatchdogOptions {
  // Between the end of one probe and the start of the next, and between checks.
  absl::Duration interval = absl::Seconds(1);
  // A probe running longer than this makes the daemon NOT_SERVING.
  absl::Duration deadline = absl::Seconds(5);
};

inline constexpr char kTandemServiceName[] = "tandem.v1.Tandem";

class HealthWatchdog {
 public:
  // `probe` returns "" when jobs are accepted, else why not. `set_serving`
  // is called with a service name ("" or kTandemServiceName) on each change,
  // never concurrently; first from the constructor, with the state after a
  // first probe run on the calling thread.
  HealthWatchdog(std::function<std::string()> probe,
                 std::function<void(const std::string& service, bool serving)> set_serving,
                 HealthWatchdogOptions options = {});
  ~HealthWatchdog();
  HealthWatchdog(const HealthWatchdog&) = delete;
  HealthWatchdog& operator=(const HealthWatchdog&) = delete;

 private:
  void ProbeLoop();
  void MonitorLoop();
  void Set(const std::string& service, bool serving, const std::string& why);

  const std::function<std::string()> probe_;
  const std::function<void(const std::string&, bool)> set_serving_;
  const HealthWatchdogOptions options_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // When the running probe started; InfiniteFuture between probes.
  absl::Time probe_started_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool probed_ ABSL_GUARDED_BY(mu_) = false;
  std::string not_accepting_ ABSL_GUARDED_BY(mu_);
  // Statuses last set (monitor thread only): -1 unset, 0 NOT_SERVING, 1 SERVING.
  int overall_ = -1, service_ = -1;
  std::thread probe_thread_, monitor_thread_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_HEALTH_WATCHDOG_H_
