// The expensive RPCs' lane: it runs what it accepts, refuses beyond its queue
// and beyond a client's share (RESOURCE_EXHAUSTED saying which), and a
// refusal or a full lane never blocks the caller.
#include "server/work_lane.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tandem::server {
namespace {

TEST(WorkLaneTest, RunsWhatItAcceptsAndRefusesBeyondItsBounds) {
  absl::Notification release;
  std::atomic<int> ran{0};
  const auto blocked = [&] {
    release.WaitForNotification();
    ++ran;
  };
  {
    WorkLane lane({.name = "profile", .threads = 1, .max_queued = 2, .max_per_client = 2});
    // One runs and one waits for client a; its third is over its share.
    ASSERT_TRUE(lane.Submit("ipv4:10.0.0.1", blocked).ok());
    ASSERT_TRUE(lane.Submit("ipv4:10.0.0.1", blocked).ok());
    absl::Status s = lane.Submit("ipv4:10.0.0.1", blocked);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(s.message().find("this client (ipv4:10.0.0.1) already has 2"), std::string::npos)
        << s;
    // Another client fills the queue; then the lane is full for everyone.
    ASSERT_TRUE(lane.Submit("ipv4:10.0.0.2", blocked).ok());
    s = lane.Submit("ipv4:10.0.0.3", blocked);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(s.message().find("profile requests: 3 are already running or queued"),
              std::string::npos)
        << s;
    EXPECT_EQ(lane.in_flight(), 3);
    release.Notify();
  }  // the destructor runs what was accepted
  EXPECT_EQ(ran.load(), 3);
}

TEST(WorkLaneTest, AClientsShareComesBackWhenItsRequestsEnd) {
  WorkLane lane({.name = "plan", .threads = 2, .max_queued = 4, .max_per_client = 1});
  absl::Notification done;
  ASSERT_TRUE(lane.Submit("c", [&] { done.Notify(); }).ok());
  done.WaitForNotification();
  // Done() runs just after the task: wait for the count to drop.
  while (lane.in_flight() > 0) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_TRUE(lane.Submit("c", [] {}).ok());
}

TEST(WorkLaneTest, ReportsItsRequestsInFlightAsTheyChange) {
  std::vector<int> seen;  // written under the lane's lock
  absl::Notification release;
  {
    WorkLane lane({.name = "plan",
                   .threads = 1,
                   .max_queued = 1,
                   .max_per_client = 2,
                   .on_in_flight = [&](int n) { seen.push_back(n); }});
    ASSERT_TRUE(lane.Submit("c", [&] { release.WaitForNotification(); }).ok());
    ASSERT_TRUE(lane.Submit("c", [] {}).ok());
    // A refusal changes nothing, so reports nothing.
    EXPECT_FALSE(lane.Submit("d", [] {}).ok());
    release.Notify();
  }
  EXPECT_EQ(seen, (std::vector<int>{1, 2, 1, 0}));
}

TEST(WorkLaneTest, PeerClientDropsThePort) {
  EXPECT_EQ(PeerClient("ipv4:10.0.0.7:53122"), "ipv4:10.0.0.7");
  EXPECT_EQ(PeerClient("ipv6:[::1]:4000"), "ipv6:[::1]");
  EXPECT_EQ(PeerClient("unix:/run/tandemd.sock"), "unix:/run/tandemd.sock");
}

}  // namespace
}  // namespace tandem::server
