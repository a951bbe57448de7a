// PeerSet's health checks against a stand-in daemon whose GetNode answers at
// once, late (after the check's deadline) or not accepting jobs: a healthy
// peer keeps its health through the tolerated late answers in a row and loses
// it at the next; a peer first seen late, or not accepting, is unhealthy at
// once; an answer in time resets the count.
#include "server/cluster/peers.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::server {
namespace {

class NodeService final : public tandem::v1::Tandem::Service {
 public:
  grpc::Status GetNode(grpc::ServerContext* context, const tandem::v1::GetNodeRequest*,
                       tandem::v1::NodeInfo* node) override {
    // Late: past the check's deadline, however long that took to come.
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (late && !context->IsCancelled() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    node->set_hostname("stand-in");
    node->set_emulated_accelerators(3);
    node->set_accepting_jobs(accepting.load());
    if (!accepting) node->set_not_accepting_reason("tandemd is shutting down");
    return grpc::Status::OK;
  }
  std::atomic<bool> late{false};
  std::atomic<bool> accepting{true};
};

class PeerSetTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    PeerSetOptions o;
    o.static_peers = {address_};
    o.self = "127.0.0.1:1";
    o.credentials = {grpc::InsecureChannelCredentials(), ""};
    // Room for an answer in time on a loaded machine (a fresh channel's
    // connect included); the late answers wait until the check gives up.
    o.timeout = absl::Seconds(1);
    o.slow_checks_tolerated = 2;
    peers_ = std::make_unique<PeerSet>(std::move(o));
  }
  void TearDown() override { server_->Shutdown(); }
  tandem::v1::PeerInfo Checked() {
    peers_->CheckAll();
    const auto all = peers_->Snapshot();
    EXPECT_EQ(all.size(), 1u);
    return all.empty() ? tandem::v1::PeerInfo() : all[0];
  }

  NodeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<PeerSet> peers_;
};

// GetNode may be served before the first check ends: the peer is listed, not
// healthy, rather than left out (an empty list reads as "all healthy").
TEST_F(PeerSetTest, BeforeTheFirstCheckAPeerIsListedAndNotHealthy) {
  const auto before = peers_->Snapshot();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].address(), address_);
  EXPECT_FALSE(before[0].healthy());
  EXPECT_EQ(before[0].reason(), "not checked yet");
  EXPECT_TRUE(Checked().healthy());
}

// With --peers_dns alone, the name is listed (unhealthy) until the first
// lookup replaces it with what it finds.
TEST(PeerSetDnsTest, BeforeTheFirstLookupTheNameIsListedAndNotHealthy) {
  PeerSetOptions o;
  o.dns = "tandemd.invalid:7000";
  o.self = "127.0.0.1:1";
  o.credentials = {grpc::InsecureChannelCredentials(), ""};
  PeerSet peers(std::move(o));
  const auto before = peers.Snapshot();
  ASSERT_EQ(before.size(), 1u);
  EXPECT_EQ(before[0].address(), "tandemd.invalid:7000");
  EXPECT_FALSE(before[0].healthy());
  peers.CheckAll();  // .invalid never resolves: no peers
  EXPECT_TRUE(peers.Snapshot().empty());
}

TEST_F(PeerSetTest, AHealthyPeerKeepsItsHealthThroughTheToleratedLateAnswers) {
  ASSERT_TRUE(Checked().healthy());
  service_.late = true;
  for (int n = 1; n <= 2; ++n) {
    const tandem::v1::PeerInfo p = Checked();
    EXPECT_TRUE(p.healthy()) << "late check " << n << ": " << p.reason();
    EXPECT_EQ(p.emulated_accelerators(), 3);  // the last answer's figures
    EXPECT_NE(p.reason().find(std::to_string(n) + " late check"), std::string::npos) << p.reason();
  }
  const tandem::v1::PeerInfo third = Checked();
  EXPECT_FALSE(third.healthy());
  EXPECT_NE(third.reason().find("code 4"), std::string::npos) << third.reason();
  // An answer in time: healthy, and the count starts again.
  service_.late = false;
  ASSERT_TRUE(Checked().healthy());
  service_.late = true;
  EXPECT_TRUE(Checked().healthy());
}

TEST_F(PeerSetTest, APeerFirstSeenLateIsUnhealthy) {
  service_.late = true;
  EXPECT_FALSE(Checked().healthy());
  EXPECT_FALSE(Checked().healthy());
}

TEST_F(PeerSetTest, APeerNotAcceptingJobsOrGoneIsUnhealthyAtOnce) {
  ASSERT_TRUE(Checked().healthy());
  service_.accepting = false;
  const tandem::v1::PeerInfo p = Checked();
  EXPECT_FALSE(p.healthy());
  EXPECT_NE(p.reason().find("shutting down"), std::string::npos) << p.reason();
  service_.accepting = true;
  ASSERT_TRUE(Checked().healthy());
  server_->Shutdown();
  EXPECT_FALSE(Checked().healthy());
}

}  // namespace
}  // namespace tandem::server
