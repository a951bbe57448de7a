// RemoteStore, a rank's Gloo store over the coordinator's rendezvous RPCs: it
// returns what the coordinator's table holds, and a rank stopped while it
// waits for keys that never come (its run failed elsewhere) gives up within a
// slice, not after the whole rendezvous timeout.
#include "server/cluster/rendezvous.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gloo/common/error.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace tandem::server {
namespace {

// The coordinator's side of the rendezvous: a table served over the Cluster
// service's two rendezvous calls.
class TableService final : public tandem::v1::Cluster::Service {
 public:
  grpc::Status RendezvousSet(grpc::ServerContext*, const tandem::v1::RendezvousSetRequest* request,
                             tandem::v1::RendezvousSetResponse*) override {
    const absl::Status s = table_.Set(request->key(), request->value());
    return s.ok() ? grpc::Status::OK : grpc::Status(grpc::StatusCode::INTERNAL, "set");
  }
  grpc::Status RendezvousGet(grpc::ServerContext*, const tandem::v1::RendezvousGetRequest* request,
                             tandem::v1::RendezvousGetResponse* response) override {
    ++gets;
    absl::StatusOr<std::vector<std::string>> values =
        table_.Get({request->keys().begin(), request->keys().end()},
                   absl::Seconds(request->timeout_seconds()));
    if (!values.ok()) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          std::string(values.status().message()));
    }
    for (std::string& v : *values) response->add_values(std::move(v));
    return grpc::Status::OK;
  }
  std::atomic<int> gets{0};

 private:
  RendezvousTable table_;
};

// What `store`'s wait for a key never set throws, with `*stop` set 300 ms
// into it, and how long the wait took.
std::string StoppedWait(gloo::rendezvous::Store& store, std::atomic<bool>* stop,
                        absl::Duration* waited) {
  std::string error;
  const absl::Time start = absl::Now();
  std::thread waiter([&] {
    try {
      store.wait({"never"});
    } catch (const gloo::IoException& e) {
      error = e.what();
    }
  });
  absl::SleepFor(absl::Milliseconds(300));
  *stop = true;
  waiter.join();
  *waited = absl::Now() - start;
  return error;
}

class RemoteStoreTest : public testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port_),
                                   grpc::InsecureChannelCredentials());
  }
  void TearDown() override { server_->Shutdown(); }
  PeerCredentials Credentials() const { return {grpc::InsecureChannelCredentials(), ""}; }

  TableService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(RemoteStoreTest, ARankGetsWhatAnotherSet) {
  RemoteStore a(channel_, Credentials(), "job/run/", absl::Seconds(10));
  RemoteStore b(channel_, Credentials(), "job/run/", absl::Seconds(10), [] { return false; });
  a.set("rank0", {'h', 'i'});
  EXPECT_EQ(b.get("rank0"), (std::vector<char>{'h', 'i'}));
}

TEST_F(RemoteStoreTest, AStoppedRankStopsWaitingWithinASlice) {
  std::atomic<bool> stop{false};
  RemoteStore store(channel_, Credentials(), "job/run/", absl::Seconds(60),
                    [&stop] { return stop.load(); });
  absl::Duration waited;
  const std::string error = StoppedWait(store, &stop, &waited);
  EXPECT_NE(error.find("stopped while joining"), std::string::npos) << error;
  // Within a slice or two of the stop, far from the 60 s timeout.
  EXPECT_LT(waited, absl::Seconds(30)) << waited;
  EXPECT_GE(service_.gets.load(), 1);
}

// Without a stop to watch, a wait asks once, for its whole timeout, and
// fails naming the coordinator's rendezvous.
TEST_F(RemoteStoreTest, AWaitThatRunsOutSaysSo) {
  RemoteStore store(channel_, Credentials(), "job/run/", absl::Seconds(1));
  std::string error;
  try {
    store.wait({"never"});
  } catch (const gloo::IoException& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("the coordinator's rendezvous"), std::string::npos) << error;
  EXPECT_EQ(service_.gets.load(), 1);
}

// The coordinator's own rank waits on the table in this process: a cancel of
// the job (its stop vote requested) ends that wait within a slice too.
TEST(LocalStoreTest, AStoppedCoordinatorStopsWaitingWithinASlice) {
  RendezvousTable table;
  std::atomic<bool> stop{false};
  LocalStore store(&table, "job/run/", absl::Seconds(60), [&stop] { return stop.load(); });
  store.set("rank0", {'x'});
  EXPECT_EQ(store.get("rank0"), std::vector<char>{'x'});
  absl::Duration waited;
  const std::string error = StoppedWait(store, &stop, &waited);
  EXPECT_NE(error.find("stopped while joining"), std::string::npos) << error;
  EXPECT_LT(waited, absl::Seconds(30)) << waited;
}

// A run's prefix closes when the run ends: a rank still loading its data
// then cannot leave keys behind (the table would fill up over many runs), and
// a wait on it ends at once. The next run's prefix is its own; a prefix
// opened again takes keys again.
TEST(RendezvousTableTest, AnEndedRunsPrefixTakesNoMoreKeys) {
  RendezvousTable table;
  ASSERT_TRUE(table.Set("job-1/run-1/rank0", "a").ok());
  table.Erase("job-1/run-1/");
  EXPECT_EQ(table.size(), 0);
  const absl::Status late = table.Set("job-1/run-1/rank1", "b");
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(table.size(), 0);
  const absl::Time start = absl::Now();
  EXPECT_EQ(table.Get({"job-1/run-1/rank0"}, absl::Seconds(30)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Other runs and jobs, before and after it in key order, are untouched.
  EXPECT_TRUE(table.Set("job-1/run-10/rank0", "c").ok());
  EXPECT_TRUE(table.Set("job-1/run-0/rank0", "c").ok());
  EXPECT_TRUE(table.Set("job-1/run-1", "c").ok());
  EXPECT_TRUE(table.Set("job-2/run-1/rank0", "d").ok());
  table.Open("job-1/run-1/");
  EXPECT_TRUE(table.Set("job-1/run-1/rank1", "b").ok());
}

}  // namespace
}  // namespace tandem::server
