// The coordinator's StartRank requests and the threads a rank takes on its
// node: a job that sets no threads runs each node's ranks on that node's
// cores shared among them, not on the share of the coordinator's cores its
// resolved spec carries; a job that sets them keeps them everywhere.
#include "server/cluster/ranks.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/cluster.pb.h"

namespace tandem::server {
namespace {

constexpr char kSelf[] = "10.0.0.1:50051";
constexpr char kPeer[] = "10.0.0.2:50051";

// A 4-rank job with an emulated accelerator, resolved on a coordinator of 2
// cores and 2 accelerators: each of its 2 ranks there got 1 thread.
tandem::v1::JobSpec FourRankSpec() {
  tandem::v1::JobSpec spec;
  spec.mutable_distributed()->set_replicas(4);
  spec.mutable_placement()->set_accelerator(tandem::v1::ACCELERATOR_KIND_EMULATED);
  spec.mutable_training()->set_threads(1);
  return spec;
}

TEST(StartRankRequestsTest, EachNodesRanksShareThatNodesCores) {
  // Rank 1 on the coordinator beside rank 0, ranks 2 and 3 on the peer.
  const std::vector<std::string> nodes = {kSelf, kPeer, kPeer};
  const std::vector<tandem::v1::StartRankRequest> requests =
      StartRankRequests("job-1", 1, FourRankSpec(), /*threads_shared=*/true, nodes, kSelf);
  ASSERT_EQ(requests.size(), 3u);
  for (size_t i = 0; i < requests.size(); ++i) {
    const tandem::v1::StartRankRequest& r = requests[i];
    EXPECT_EQ(r.rank(), static_cast<int>(i) + 1);
    EXPECT_EQ(r.ranks_here(), 2) << "rank " << r.rank();
    EXPECT_EQ(r.spec().training().threads(), 0) << "rank " << r.rank();
  }
  EXPECT_EQ(requests[0].accelerator_index(), 1);
  EXPECT_EQ(requests[1].accelerator_index(), 0);
  EXPECT_EQ(requests[2].accelerator_index(), 1);
  // The coordinator's rank 1 gets 1 of its 2 cores, as rank 0 does; the
  // peer's ranks share its 16 (or its --job_threads 6).
  EXPECT_EQ(RankThreads(requests[0], 0, 2), 1);
  EXPECT_EQ(RankThreads(requests[1], 0, 16), 8);
  EXPECT_EQ(RankThreads(requests[2], 6, 16), 3);
}

TEST(StartRankRequestsTest, ThreadsTheJobSetAreKeptOnEveryNode) {
  const std::vector<std::string> nodes = {kPeer, kPeer, kPeer};
  const std::vector<tandem::v1::StartRankRequest> requests =
      StartRankRequests("job-1", 1, FourRankSpec(), /*threads_shared=*/false, nodes, kSelf);
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].ranks_here(), 3);
  EXPECT_EQ(requests[0].spec().training().threads(), 1);
  EXPECT_EQ(RankThreads(requests[0], 0, 16), 1);
}

TEST(RankThreadsTest, ARequestFromAnOlderCoordinatorKeepsTheOldRule) {
  tandem::v1::StartRankRequest r;
  EXPECT_EQ(RankThreads(r, 0, 16), 0);  // the trainer's default: all cores
  EXPECT_EQ(RankThreads(r, 4, 16), 4);
  r.set_ranks_here(32);
  EXPECT_EQ(RankThreads(r, 0, 16), 1);  // never below one
}

}  // namespace
}  // namespace tandem::server
