// HealthWatchdog against a probe the test controls: a probe that does not
// return makes both statuses NOT_SERVING and its return makes them SERVING
// again; a probe that reports no jobs accepted turns only tandem.v1.Tandem off.
#include "server/health_watchdog.h"

#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace tandem::server {
namespace {

class Statuses {
 public:
  void Set(const std::string& service, bool serving) {
    absl::MutexLock lock(&mu_);
    status_[service] = serving;
    ++changes_;
  }
  // Waits (up to 10 s) until `service` is `serving`.
  bool WaitFor(const std::string& service, bool serving) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      auto it = status_.find(service);
      return it != status_.end() && it->second == serving;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }
  int changes() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, bool> status_ ABSL_GUARDED_BY(mu_);
  int changes_ ABSL_GUARDED_BY(mu_) = 0;
};

constexpr HealthWatchdogOptions kFast{.interval = absl::Milliseconds(10),
                                      .deadline = absl::Milliseconds(200)};

TEST(HealthWatchdogTest, AStuckProbeIsNotServingUntilItReturns) {
  Statuses statuses;
  absl::Mutex gate;  // held by the test: the probe blocks on it
  HealthWatchdog watchdog(
      [&] {
        absl::MutexLock lock(&gate);
        return std::string();
      },
      [&](const std::string& service, bool serving) { statuses.Set(service, serving); }, kFast);
  ASSERT_TRUE(statuses.WaitFor("", true));
  ASSERT_TRUE(statuses.WaitFor(kTandemServiceName, true));
  gate.Lock();
  EXPECT_TRUE(statuses.WaitFor("", false));
  EXPECT_TRUE(statuses.WaitFor(kTandemServiceName, false));
  gate.Unlock();
  EXPECT_TRUE(statuses.WaitFor("", true));
  EXPECT_TRUE(statuses.WaitFor(kTandemServiceName, true));
}

TEST(HealthWatchdogTest, NotAcceptingJobsTurnsOffOnlyTheTandemService) {
  Statuses statuses;
  absl::Mutex mu;
  std::string reason = "the state disk is full";
  HealthWatchdog watchdog(
      [&] {
        absl::MutexLock lock(&mu);
        return reason;
      },
      [&](const std::string& service, bool serving) { statuses.Set(service, serving); }, kFast);
  ASSERT_TRUE(statuses.WaitFor("", true));
  ASSERT_TRUE(statuses.WaitFor(kTandemServiceName, false));
  {
    absl::MutexLock lock(&mu);
    reason.clear();
  }
  EXPECT_TRUE(statuses.WaitFor(kTandemServiceName, true));
  EXPECT_TRUE(statuses.WaitFor("", true));
}

TEST(HealthWatchdogTest, StatusesAreSetOnlyWhenTheyChange) {
  Statuses statuses;
  {
    // Checks as often as kFast's, with a deadline no descheduled probe thread
    // of a loaded machine reaches (that would be two more changes).
    HealthWatchdogOptions options = kFast;
    options.deadline = absl::Seconds(30);
    HealthWatchdog watchdog([] { return std::string(); },
                            [&](const std::string& s, bool serving) { statuses.Set(s, serving); },
                            options);
    ASSERT_TRUE(statuses.WaitFor(kTandemServiceName, true));
    absl::SleepFor(absl::Milliseconds(200));  // about 80 checks
  }
  EXPECT_EQ(statuses.changes(), 2);
}

}  // namespace
}  // namespace tandem::server
