// The counter source's fallbacks, against a fake kernel, and on this machine.
#include "runtime/profile/perf_counters.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <omp.h>

#include <cmath>
#include <iostream>

#include "gtest/gtest.h"
#include "runtime/profile/testing/fakes.h"

namespace tandem::profile {
namespace {

using testing::FakePerfEventApi;

std::vector<std::string> Names(const CounterSource& s) {
  std::vector<std::string> names;
  for (const CounterInfo& c : s.counters()) names.push_back(c.name);
  return names;
}

TEST(PerfCountersTest, UsesHardwareEventsWhenTheKernelAllowsThem) {
  FakePerfEventApi api;
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  EXPECT_EQ(s->source(), tandem::v1::COUNTER_SOURCE_HARDWARE);
  EXPECT_EQ(Names(*s), (std::vector<std::string>{"cycles", "instructions", "cache_references",
                                                 "cache_misses"}));
  for (const CounterInfo& c : s->counters())
    EXPECT_EQ(c.source, tandem::v1::COUNTER_SOURCE_HARDWARE);
  EXPECT_NE(s->note().find("hardware events"), std::string::npos) << s->note();
  // One counter per event on every thread of the team.
  EXPECT_EQ(api.open_events(), 4 * omp_get_max_threads());
}

TEST(PerfCountersTest, FallsBackToSoftwareEventsAndSaysWhy) {
  FakePerfEventApi api;
  api.Refuse(PERF_TYPE_HARDWARE, ENOENT);
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  EXPECT_EQ(s->source(), tandem::v1::COUNTER_SOURCE_SOFTWARE);
  EXPECT_EQ(Names(*s), (std::vector<std::string>{"task_clock", "page_faults", "context_switches"}));
  for (const CounterInfo& c : s->counters())
    EXPECT_EQ(c.source, tandem::v1::COUNTER_SOURCE_SOFTWARE);
  EXPECT_NE(s->note().find("hardware events refused"), std::string::npos) << s->note();
  EXPECT_NE(s->note().find("perf_event_open(cycles, instructions, cache_references, cache_misses)"),
            std::string::npos)
      << s->note();
  EXPECT_NE(s->note().find("ENOENT (No such file or directory)"), std::string::npos) << s->note();
  EXPECT_NE(s->note().find("using software events"), std::string::npos) << s->note();
}

TEST(PerfCountersTest, CountsNothingWhenEverythingIsRefusedAndSaysWhy) {
  FakePerfEventApi api;
  api.Refuse(PERF_TYPE_HARDWARE, EOPNOTSUPP);
  api.Refuse(PERF_TYPE_SOFTWARE, EACCES);
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  EXPECT_EQ(s->source(), tandem::v1::COUNTER_SOURCE_UNSPECIFIED);
  EXPECT_TRUE(s->counters().empty());
  EXPECT_NE(s->note().find("no counters"), std::string::npos) << s->note();
  EXPECT_NE(s->note().find("EOPNOTSUPP"), std::string::npos) << s->note();
  EXPECT_NE(s->note().find("EACCES"), std::string::npos) << s->note();
  std::vector<double> values = {1, 2, 3};
  s->Read(&values);
  EXPECT_TRUE(values.empty());
  EXPECT_EQ(api.open_events(), 0);
}

TEST(PerfCountersTest, RetriesUserSpaceOnlyWhenKernelCountingIsForbidden) {
  FakePerfEventApi api;
  api.RefuseKernel(true);
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  EXPECT_EQ(s->source(), tandem::v1::COUNTER_SOURCE_HARDWARE);
  EXPECT_TRUE(api.any_user_only());
  EXPECT_NE(s->note().find("user space only"), std::string::npos) << s->note();
}

TEST(PerfCountersTest, ReadSumsTheTeamAndConvertsUnits) {
  FakePerfEventApi api;
  api.Refuse(PERF_TYPE_HARDWARE, ENOENT);
  api.set_step(1000);
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  ASSERT_EQ(s->counters().size(), 3u);
  std::vector<double> first, second;
  s->Read(&first);
  s->Read(&second);
  const double team = omp_get_max_threads();
  // task_clock counts nanoseconds and reports seconds; 1000 per read per thread.
  EXPECT_NEAR(second[0] - first[0], team * 1000e-9, 1e-15);
  EXPECT_DOUBLE_EQ(second[1] - first[1], team * 1000);
  EXPECT_EQ(s->counters()[0].unit, "seconds");
  EXPECT_EQ(s->counters()[1].unit, "events");
}

// A multiplexed event: 100 events in a first fully scheduled microsecond,
// 10,000 in a second, then 10 while scheduled a tenth of a third (about 100
// over it), then a fourth never scheduled. Each interval is scaled by its own
// share: the third reads about 100, not the 4,343 that scaling the
// cumulative count by the cumulative share gave; the fourth takes the rate so
// far (10,200 over 3 us: 3,400).
TEST(PerfCountersTest, MultiplexedEventsAreScaledIntervalByInterval) {
  FakePerfEventApi api;
  api.Refuse(PERF_TYPE_HARDWARE, ENOENT);
  api.Script({{100, 1000, 1000}, {10100, 2000, 2000}, {10110, 3000, 2100}, {10110, 4000, 2100}});
  std::unique_ptr<CounterSource> s = OpenPerfCounters(&api);
  ASSERT_GE(s->counters().size(), 2u);
  std::vector<double> r[4];
  for (auto& v : r) s->Read(&v);
  const double team = omp_get_max_threads();
  // counters()[1] counts events unscaled (the task clock is [0], in seconds).
  EXPECT_DOUBLE_EQ(r[1][1] - r[0][1], team * 10000);
  EXPECT_DOUBLE_EQ(r[2][1] - r[1][1], team * 100);
  EXPECT_DOUBLE_EQ(r[3][1] - r[2][1], team * 3400);
}

TEST(PerfCountersTest, ClosesEveryEventItOpened) {
  FakePerfEventApi api;
  api.Refuse(PERF_TYPE_HARDWARE, ENOENT);
  { std::unique_ptr<CounterSource> s = OpenPerfCounters(&api); }
  EXPECT_EQ(api.open_events(), 0);
}

// This machine: whatever the kernel allows, the source says what it is and why.
TEST(PerfCountersTest, OnThisMachineTheSourceExplainsItself) {
  std::unique_ptr<CounterSource> s = OpenPerfCounters();
  ASSERT_FALSE(s->note().empty());
  if (s->source() != tandem::v1::COUNTER_SOURCE_HARDWARE) {
    EXPECT_NE(s->note().find("refused"), std::string::npos) << s->note();
  }
  std::cout << "counter source: " << tandem::v1::CounterSource_Name(s->source()) << ": "
            << s->note() << "\n";
  if (s->source() == tandem::v1::COUNTER_SOURCE_SOFTWARE) {
    std::vector<double> before, after;
    s->Read(&before);
    volatile double x = 0;
    for (int i = 0; i < 20000000; ++i) x = x + i;
    s->Read(&after);
    // task_clock: the busy loop ran on this thread, a member of the team.
    EXPECT_GT(after[0] - before[0], 1e-3);
  }
}

}  // namespace
}  // namespace tandem::profile
