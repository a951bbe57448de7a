// The basic GPU gauges of NVIDIA's dcgm-exporter under our prefix, read from
// NVML at each scrape: utilisation of the SMs and of the memory interface,
// memory used and total, temperature and power, one series per GPU labelled
// with NVML's index (`gpu`), its UUID and model name. libnvidia-ml is opened
// with dlopen, so tandemd runs where it is absent and then exports none of
// these. Thread-safe (NVML is).
#ifndef TANDEM_SERVER_METRICS_NVML_COLLECTOR_H_
#define TANDEM_SERVER_METRICS_NVML_COLLECTOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace tandem::metrics {

inline constexpr char kNvmlLibrary[] = "libnvidia-ml.so.1";

class NvmlCollector final : public prometheus::Collectable {
 public:
  // Opens `library` and initialises NVML; an error says why not (no library,
  // a symbol missing, nvmlInit failing: no driver).
  static absl::StatusOr<std::shared_ptr<NvmlCollector>> Open(
      const std::string& library = kNvmlLibrary);
  ~NvmlCollector() override;

  // GPUs NVML reported when opened.
  int device_count() const { return static_cast<int>(devices_.size()); }

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Api;
  struct Device {
    void* handle = nullptr;
    std::string index, uuid, name;
  };
  NvmlCollector(std::unique_ptr<Api> api, void* library);

  std::unique_ptr<Api> api_;
  void* library_;
  std::vector<Device> devices_;
};

}  // namespace tandem::metrics

#endif  // TANDEM_SERVER_METRICS_NVML_COLLECTOR_H_
