// The /metrics endpoint on prometheus-cpp's exposer: it serves the registered
// collectables in the text format, runs the scrape hook, and keeps serving
// other scrapes while clients misbehave (a slow client that never finishes its
// headers, a huge URL, a POST announcing gigabytes).
#include "server/metrics/exposer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace tandem::metrics {
namespace {

// A connected TCP socket to 127.0.0.1:port with a receive timeout.
int Connect(int port, double timeout_seconds = 10) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{};
  tv.tv_sec = static_cast<long>(timeout_seconds);
  tv.tv_usec = static_cast<long>((timeout_seconds - tv.tv_sec) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Everything the server sends until it closes (or the receive timeout).
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = recv(fd, buffer, sizeof(buffer), 0)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

std::string Request(int port, const std::string& request) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  SendAll(fd, request);
  std::string response = ReadAll(fd);
  close(fd);
  return response;
}

std::string Scrape(int port) {
  return Request(port, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n");
}

class ExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus::BuildCounter()
        .Name("tandem_test_total")
        .Help("test")
        .Register(*registry_)
        .Add({})
        .Increment(3);
    ExposerOptions options;
    options.threads = 4;
    options.request_timeout_ms = 1500;
    absl::StatusOr<std::unique_ptr<MetricsExposer>> e =
        MetricsExposer::Start("127.0.0.1:0", {hook_, registry_}, options);
    ASSERT_TRUE(e.ok()) << e.status();
    exposer_ = *std::move(e);
    ASSERT_GT(exposer_->port(), 0);
  }

  std::atomic<int> scrapes_{0};
  std::shared_ptr<ScrapeHook> hook_ = std::make_shared<ScrapeHook>([this] { ++scrapes_; });
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  std::unique_ptr<MetricsExposer> exposer_;
};

TEST_F(ExposerTest, ServesTheTextFormatAndRunsTheHookOnEachScrape) {
  const std::string response = Scrape(exposer_->port());
  EXPECT_NE(response.find("HTTP/1.1 200"), std::string::npos) << response;
  EXPECT_NE(response.find("# TYPE tandem_test_total counter"), std::string::npos) << response;
  EXPECT_NE(response.find("tandem_test_total 3"), std::string::npos) << response;
  EXPECT_EQ(scrapes_, 1);
  Scrape(exposer_->port());
  EXPECT_EQ(scrapes_, 2);
}

TEST_F(ExposerTest, RefusesABadAddressAndAPortInUse) {
  EXPECT_EQ(MetricsExposer::Start("no-port", {registry_}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MetricsExposer::Start("127.0.0.1:70000", {registry_}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status taken =
      MetricsExposer::Start("127.0.0.1:" + std::to_string(exposer_->port()), {registry_}).status();
  EXPECT_EQ(taken.code(), absl::StatusCode::kUnavailable) << taken;
  EXPECT_NE(taken.message().find("cannot listen for metrics"), std::string::npos) << taken;
}

TEST_F(ExposerTest, SlowClientsHoldingEveryWorkerAreCutAtTheRequestTimeout) {
  // As many clients as workers, each sending a header line a byte at a time
  // and never finishing: scrapes still answer, within the request timeout.
  std::vector<int> slow;
  for (int i = 0; i < 4; ++i) {
    const int fd = Connect(exposer_->port());
    ASSERT_GE(fd, 0);
    SendAll(fd, "GET /metrics HTTP/1.1\r\nX-Slow: ");
    slow.push_back(fd);
  }
  std::thread dribble([&] {
    for (int t = 0; t < 30; ++t) {
      for (int fd : slow) SendAll(fd, "a");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  const std::string response = Scrape(exposer_->port());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  dribble.join();
  for (int fd : slow) close(fd);
  EXPECT_NE(response.find("tandem_test_total 3"), std::string::npos) << response;
  // The 1.5 s timeout, plus scheduling on a loaded 2-core machine.
  EXPECT_LT(seconds, 8.0);
}

TEST_F(ExposerTest, AHugeUrlIsRefusedAndServingGoesOn) {
  const std::string response =
      Request(exposer_->port(),
              "GET /metrics?" + std::string(64 * 1024, 'x') + " HTTP/1.1\r\nHost: test\r\n\r\n");
  EXPECT_EQ(response.find("HTTP/1.1 200"), std::string::npos) << response.substr(0, 200);
  EXPECT_NE(Scrape(exposer_->port()).find("tandem_test_total 3"), std::string::npos);
}

TEST_F(ExposerTest, APostAnnouncingGigabytesIsAnsweredWithoutReadingItsBody) {
  const int fd = Connect(exposer_->port());
  ASSERT_GE(fd, 0);
  SendAll(fd, "POST /metrics HTTP/1.1\r\nHost: test\r\nContent-Length: 4294967296\r\n\r\nxxxx");
  const std::string response = ReadAll(fd);
  close(fd);
  EXPECT_EQ(response.find("HTTP/1.1 200"), std::string::npos) << response;
  EXPECT_NE(response.find("HTTP/1.1 "), std::string::npos) << "no answer at all";
  EXPECT_EQ(scrapes_, 0);
  EXPECT_NE(Scrape(exposer_->port()).find("tandem_test_total 3"), std::string::npos);
}

TEST_F(ExposerTest, UnknownPathsAreNotFound) {
  EXPECT_NE(Request(exposer_->port(), "GET /nope HTTP/1.1\r\nHost: test\r\n\r\n").find("404"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::metrics
