// Serves metrics on GET /metrics in the Prometheus text format through
// prometheus-cpp's pull exposer (a civetweb server with its own threads),
// bounded against clients that misbehave: a connection that has not sent its
// whole request within the request timeout is closed, requests larger than
// the header buffer are refused, and methods other than GET and HEAD get an
// error without their body being read. Start and the destructor from one
// thread; scrapes are concurrent.
#ifndef TANDEM_SERVER_METRICS_EXPOSER_H_
#define TANDEM_SERVER_METRICS_EXPOSER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace tandem::metrics {

struct ExposerOptions {
  // Worker threads: each serves one connection at a time, so this many slow
  // clients at once can delay a scrape by up to the request timeout.
  int threads = 8;
  int request_timeout_ms = 5000;
  // The request line and headers together, in bytes.
  int max_request_bytes = 16 * 1024;
};

class MetricsExposer {
 public:
  // Listens on "HOST:PORT" (port 0 picks one) and serves `collectables` in
  // order on each scrape.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(
      const std::string& address,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables,
      const ExposerOptions& options = {});

  int port() const { return port_; }

 private:
  MetricsExposer(std::unique_ptr<prometheus::Exposer> exposer, int port)
      : exposer_(std::move(exposer)), port_(port) {}

  std::unique_ptr<prometheus::Exposer> exposer_;
  const int port_;
};

// A collectable that serves nothing and runs `refresh` on every scrape, so
// gauges sampled from elsewhere (process RSS, the node's jobs) are current.
// Register it before the collectables it refreshes.
class ScrapeHook final : public prometheus::Collectable {
 public:
  explicit ScrapeHook(std::function<void()> refresh) : refresh_(std::move(refresh)) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<void()> refresh_;
};

}  // namespace tandem::metrics

#endif  // TANDEM_SERVER_METRICS_EXPOSER_H_
