// Serves a Registry over HTTP: GET /metrics answers the text exposition format
// 0.0.4; GET /healthz answers "ok". Runs its own listener threads (cpp-httplib).
// Start and Stop from one thread; scraping is concurrent.
#ifndef TANDEM_SERVER_METRICS_HTTP_EXPORTER_H_
#define TANDEM_SERVER_METRICS_HTTP_EXPORTER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/metrics/registry.h"

namespace httplib {
class Server;
}

namespace tandem::metrics {

class HttpExporter {
 public:
  // `before_scrape` runs before each serialisation (to refresh sampled gauges).
  HttpExporter(const Registry* registry, std::function<void()> before_scrape);
  ~HttpExporter();

  // Listens on "host:port" (port 0 picks one); returns the bound port.
  absl::StatusOr<int> Start(const std::string& address);
  void Stop();

 private:
  const Registry* registry_;
  std::function<void()> before_scrape_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
};

}  // namespace tandem::metrics

#endif  // TANDEM_SERVER_METRICS_HTTP_EXPORTER_H_
