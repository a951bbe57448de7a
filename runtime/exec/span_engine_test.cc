// The span engine's wait attribution: how long a resource sat idle for a
// span's dependency, and which resource that wait traces back to through
// copies.
#include "runtime/exec/span_engine.h"

#include <chrono>
#include <mutex>
#include <thread>

#include "gtest/gtest.h"

namespace tandem {
namespace {

using tandem::v1::TimelineResource;

absl::Status Sleep(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  return absl::OkStatus();
}

SpanInfo On(TimelineResource r) {
  SpanInfo info;
  info.resource = r;
  return info;
}

const SpanRecord& Find(const std::vector<SpanRecord>& records, TimelineResource r, int nth = 0) {
  for (const SpanRecord& s : records) {
    if (s.info.resource == r && nth-- == 0) return s;
  }
  static const SpanRecord none;
  ADD_FAILURE() << "no span on " << TimelineResource_Name(r);
  return none;
}

TEST(SpanEngineTest, ComputeWaitingForWeightsAfterAHostUpdateHasWaitedOnTheHost) {
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  const auto h2d = TimelineResource::TIMELINE_RESOURCE_COPY_H2D;
  const auto update = TimelineResource::TIMELINE_RESOURCE_HOST_UPDATE;
  SpanEngine engine({compute, h2d, update});
  // compute runs 20 ms, then waits for update (200 ms) -> h2d (10 ms).
  const SpanId first = engine.Add(On(compute), {}, [] { return Sleep(0.02); });
  const SpanId u = engine.Add(On(update), {}, [] { return Sleep(0.2); });
  const SpanId copy = engine.Add(On(h2d), {u}, [] { return Sleep(0.01); });
  engine.Add(On(compute), {first, copy}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.WaitAll().ok());
  const std::vector<SpanRecord> records = engine.TakeRecords();

  const SpanRecord& second = Find(records, compute, 1);
  const SpanRecord& first_end = Find(records, compute, 0);
  const SpanRecord& copied = Find(records, h2d);
  const SpanRecord& updated = Find(records, update);
  // The copy engine sat idle until the update was done: it waited on it.
  EXPECT_EQ(copied.waited_on, update);
  EXPECT_GT(copied.wait_seconds, 0.5 * (updated.end - updated.start));
  // The compute stream, idle from its first span's end (~20 ms) to the copy's
  // end (~210 ms), waited on the update behind the copy.
  EXPECT_EQ(second.waited_on, update);
  ASSERT_GT(copied.end, first_end.end);
  EXPECT_LE(second.wait_seconds, copied.end - first_end.end + 1e-9);
  EXPECT_GT(second.wait_seconds, 0.5 * (copied.end - first_end.end));
  // The first span of a stream that had nothing to wait for did not wait.
  EXPECT_EQ(first_end.wait_seconds, 0);
  EXPECT_EQ(first_end.waited_on, TimelineResource::TIMELINE_RESOURCE_UNSPECIFIED);
}

TEST(SpanEngineTest, AWaitBehindACopyQueuedBehindOtherCopiesIsOnTheLink) {
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  const auto h2d = TimelineResource::TIMELINE_RESOURCE_COPY_H2D;
  const auto update = TimelineResource::TIMELINE_RESOURCE_HOST_UPDATE;
  SpanEngine engine({compute, h2d, update});
  // The copy engine is busy for 200 ms with an earlier copy; the update is
  // done at ~10 ms, so the copy that follows it waits for the link, not for
  // the host, and so does the compute stream behind it.
  const SpanId first = engine.Add(On(compute), {}, [] { return Sleep(0.02); });
  engine.Add(On(h2d), {}, [] { return Sleep(0.2); });
  const SpanId u = engine.Add(On(update), {}, [] { return Sleep(0.01); });
  const SpanId copy = engine.Add(On(h2d), {u}, [] { return Sleep(0.01); });
  engine.Add(On(compute), {first, copy}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.WaitAll().ok());
  const std::vector<SpanRecord> records = engine.TakeRecords();
  EXPECT_EQ(Find(records, h2d, 1).wait_seconds, 0);
  EXPECT_EQ(Find(records, compute, 1).waited_on, h2d);
  EXPECT_GT(Find(records, compute, 1).wait_seconds, 0.1);
}

// A span on a resource the engine does not run is an error every wait
// returns; what depends on it, started or ended, does not wait forever.
TEST(SpanEngineTest, ASpanOnAResourceItDoesNotRunFailsEveryWaitWithoutAHang) {
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  const auto unknown = TimelineResource::TIMELINE_RESOURCE_NETWORK;
  SpanEngine engine({compute});
  const SpanId a = engine.Add(On(compute), {}, [] { return Sleep(0.05); });
  const SpanId lost = engine.Add(On(unknown), {a}, [] { return absl::OkStatus(); });
  bool ran = false;
  const SpanId after = engine.Add(On(compute), {lost}, [&ran] {
    ran = true;
    return absl::OkStatus();
  });
  const absl::Status s = engine.Wait(after);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("does not run"), std::string::npos) << s;
  EXPECT_FALSE(ran);  // the graph failed: its work is skipped
  EXPECT_EQ(engine.WaitAll().code(), absl::StatusCode::kInternal);
}

TEST(SpanEngineTest, ASpanReadyWhenAddedHasNotWaited) {
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  SpanEngine engine({compute});
  const SpanId a = engine.Add(On(compute), {}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.Wait(a).ok());
  Sleep(0.05).IgnoreError();  // the resource idles with nothing to run: no wait
  engine.Add(On(compute), {a}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.WaitAll().ok());
  for (const SpanRecord& r : engine.TakeRecords()) {
    EXPECT_EQ(r.wait_seconds, 0);
    EXPECT_EQ(r.waited_on, TimelineResource::TIMELINE_RESOURCE_UNSPECIFIED);
  }
}

TEST(SpanEngineTest, AStartDependencyIsMetWhenThatSpanStartsNotWhenItEnds) {
  // The copy waits for the start of the compute stream's second span, which
  // itself waits 50 ms for the first: the copy starts with it and ends (10 ms)
  // long before it (200 ms), and every span goes to the recorder.
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  const auto h2d = TimelineResource::TIMELINE_RESOURCE_COPY_H2D;
  std::mutex mu;
  std::vector<SpanRecord> recorded;
  SpanEngine engine({compute, h2d}, nullptr, 0, [&](const SpanRecord& r) {
    std::lock_guard<std::mutex> lock(mu);
    recorded.push_back(r);
  });
  const SpanId first = engine.Add(On(compute), {}, [] { return Sleep(0.05); });
  const SpanId second = engine.Add(On(compute), {first}, [] { return Sleep(0.2); });
  engine.Add(On(h2d), {}, {second}, [] { return Sleep(0.01); });
  ASSERT_TRUE(engine.WaitAll().ok());
  const std::vector<SpanRecord> records = engine.TakeRecords();
  const SpanRecord& copy = Find(records, h2d);
  const SpanRecord& fed = Find(records, compute, 1);
  EXPECT_GE(copy.start, fed.start);
  EXPECT_LT(copy.end, fed.end);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(recorded.size(), 3u);
}

TEST(SpanEngineTest, AStartDependencyOnASpanAlreadyStartedIsMet) {
  const auto compute = TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE;
  const auto h2d = TimelineResource::TIMELINE_RESOURCE_COPY_H2D;
  SpanEngine engine({compute, h2d});
  const SpanId a = engine.Add(On(compute), {}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.Wait(a).ok());
  const SpanId copy = engine.Add(On(h2d), {}, {a}, [] { return absl::OkStatus(); });
  ASSERT_TRUE(engine.Wait(copy).ok());
}

}  // namespace
}  // namespace tandem
