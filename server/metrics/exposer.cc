#include "server/metrics/exposer.h"

#include <exception>
#include <mutex>

#include "CivetServer.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/metric_family.h"

namespace tandem::metrics {
namespace {

// civetweb reports why it cannot start only through its log callback.
std::mutex civet_error_mu;
std::string civet_error;

int KeepCivetError(const mg_connection*, const char* message) {
  std::lock_guard<std::mutex> lock(civet_error_mu);
  civet_error = message;
  return 1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& address,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables,
    const ExposerOptions& options) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_listen: expected HOST:PORT, got '", address, "'"));
  }
  // civetweb's option names; "-" before keep-alive: one request per connection,
  // so an idle client never holds a worker.
  std::vector<std::string> civet_options = {
      "listening_ports",    address,
      "num_threads",        std::to_string(options.threads),
      "request_timeout_ms", std::to_string(options.request_timeout_ms),
      "max_request_size",   std::to_string(options.max_request_bytes),
      "enable_keep_alive",  "no",
  };
  std::unique_ptr<prometheus::Exposer> exposer;
  CivetCallbacks callbacks;
  callbacks.log_message = KeepCivetError;
  try {
    exposer = std::make_unique<prometheus::Exposer>(civet_options, &callbacks);
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(civet_error_mu);
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", address, ": ",
                                               civet_error.empty() ? e.what() : civet_error));
  }
  for (const auto& c : collectables) exposer->RegisterCollectable(c);
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for metrics on ", address));
  }
  return std::unique_ptr<MetricsExposer>(new MetricsExposer(std::move(exposer), ports.front()));
}

std::vector<prometheus::MetricFamily> ScrapeHook::Collect() const {
  refresh_();
  return {};
}

}  // namespace tandem::metrics
