#include "runtime/dist/communicator.h"

#include <functional>
#include <thread>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/core/clock.h"

namespace tandem {
namespace {

// Runs body(communicator) on `size` threads, one rank each, joined through one
// in-memory store; fails the test on any rank's error.
void OnRanks(int size, const std::function<void(Communicator&)>& body) {
  gloo::rendezvous::HashStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions options;
      options.timeout = absl::Seconds(20);
      auto comm = Communicator::Connect(store, "test", r, size, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

class CommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(CommunicatorTest, AllReduceSumsEveryRanksValues) {
  const int size = GetParam();
  OnRanks(size, [&](Communicator& comm) {
    std::vector<float> x(1000);
    for (size_t i = 0; i < x.size(); ++i) x[i] = comm.rank() * 1000 + i;
    ASSERT_TRUE(comm.AllReduceSum(x.data(), x.size()).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      // sum over r of (1000 r + i)
      ASSERT_EQ(x[i], 1000.0f * size * (size - 1) / 2 + size * i) << i;
    }
    std::vector<double> d = {1.5 * comm.rank(), 2.0};
    ASSERT_TRUE(comm.AllReduceSum(d.data(), 2).ok());
    EXPECT_EQ(d[0], 1.5 * size * (size - 1) / 2);
    EXPECT_EQ(d[1], 2.0 * size);
    EXPECT_EQ(comm.stats().calls, size > 1 ? 2 : 0);
  });
}

TEST_P(CommunicatorTest, ReduceScatterThenAllGatherIsAnAllReduce) {
  const int size = GetParam();
  // Uneven slices.
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(37 + 5 * r);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  OnRanks(size, [&](Communicator& comm) {
    std::vector<float> x(total);
    for (int64_t i = 0; i < total; ++i) x[i] = (comm.rank() + 1) * 0.5f + i;
    // Twice on the same buffer: the set-up is cached and must stay right.
    for (int round = 0; round < 2; ++round) {
      for (int64_t i = 0; i < total; ++i) x[i] = (comm.rank() + 1) * 0.5f + i;
      const absl::Status rs = comm.ReduceScatterSum(x.data(), counts);
      ASSERT_TRUE(rs.ok()) << rs;
      int64_t offset = 0;
      for (int r = 0; r < comm.rank(); ++r) offset += counts[r];
      for (int64_t i = offset; i < offset + counts[comm.rank()]; ++i) {
        ASSERT_FLOAT_EQ(x[i], 0.5f * size * (size + 1) / 2 + size * i) << "round " << round;
      }
      ASSERT_TRUE(comm.AllGather(x.data(), counts).ok());
      for (int64_t i = 0; i < total; ++i) {
        ASSERT_FLOAT_EQ(x[i], 0.5f * size * (size + 1) / 2 + size * i) << i;
      }
    }
  });
}

// The 16-bit all-gather (bf16 working copies): each rank's slice, uneven and
// one of them empty where there are several ranks, reaches every rank; the
// bytes counted are half the fp32 gather's.
TEST_P(CommunicatorTest, AllGatherOf16BitWordsGivesEveryRankEverySlice) {
  const int size = GetParam();
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(r == 1 ? 0 : 11 + 3 * r);
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  OnRanks(size, [&](Communicator& comm) {
    int64_t offset = 0;
    for (int r = 0; r < comm.rank(); ++r) offset += counts[r];
    std::vector<uint16_t> x(total, 0xffff);
    for (int64_t i = offset; i < offset + counts[comm.rank()]; ++i) {
      x[i] = static_cast<uint16_t>(1000 * comm.rank() + i);
    }
    ASSERT_TRUE(comm.AllGather(x.data(), counts).ok());
    int64_t at = 0;
    for (int r = 0; r < size; ++r) {
      for (int64_t i = at; i < at + counts[r]; ++i) ASSERT_EQ(x[i], 1000 * r + i) << i;
      at += counts[r];
    }
    if (size > 1) EXPECT_EQ(comm.stats().bytes, total * 2 * (size - 1) / size);
  });
}

TEST_P(CommunicatorTest, BroadcastCopiesTheRootsValues) {
  const int size = GetParam();
  OnRanks(size, [&](Communicator& comm) {
    std::vector<float> x(64, static_cast<float>(comm.rank()));
    ASSERT_TRUE(comm.Broadcast(x.data(), x.size(), size - 1).ok());
    for (float v : x) ASSERT_EQ(v, size - 1);
    ASSERT_TRUE(comm.Barrier().ok());
    EXPECT_EQ(comm.Broadcast(x.data(), 1, size).code(), absl::StatusCode::kInvalidArgument);
    if (size > 1) {
      // Gloo's halving-doubling reduce-scatter cannot give a rank nothing.
      std::vector<int64_t> counts(size, 4);
      counts[0] = 0;
      EXPECT_EQ(comm.ReduceScatterSum(x.data(), counts).code(), absl::StatusCode::kInvalidArgument);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(CommunicatorTest, ARankThatNeverJoinsTimesTheRendezvousOut) {
  gloo::rendezvous::HashStore store;
  CommunicatorOptions options;
  options.timeout = absl::Seconds(1);
  const double start = WallSeconds();
  auto comm = Communicator::Connect(store, "lonely", 0, 2, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("rendezvous of rank 0 of 2"), std::string::npos);
  EXPECT_LT(WallSeconds() - start, 30);
}

TEST(CommunicatorTest, APeerThatLeavesFailsTheCollectiveWithAStatus) {
  gloo::rendezvous::HashStore store;
  std::unique_ptr<Communicator> survivor;
  std::thread leaver([&] {
    CommunicatorOptions options;
    options.timeout = absl::Seconds(2);
    auto comm = Communicator::Connect(store, "leave", 1, 2, options);
    ASSERT_TRUE(comm.ok());
    // Leaves without taking part: its connections close.
  });
  CommunicatorOptions options;
  options.timeout = absl::Seconds(2);
  auto comm = Communicator::Connect(store, "leave", 0, 2, options);
  leaver.join();
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> x(16, 1.0f);
  const absl::Status status = (*comm)->AllReduceSum(x.data(), x.size());
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
}

TEST(CommunicatorTest, RefusesABadRank) {
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(Communicator::Connect(store, "x", 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
