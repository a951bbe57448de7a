#include "server/metrics/nvml_collector.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

// The few NVML declarations we use (nvml.h, stable since NVML's v2 entry
// points). Every function returns 0 (NVML_SUCCESS) on success.
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned int gpu;     // percent of time a kernel ran
  unsigned int memory;  // percent of time device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};
constexpr int kNvmlTemperatureGpu = 0;
constexpr unsigned int kNvmlStringBytes = 96;

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

}  // namespace

struct NvmlCollector::Api {
  int (*init)();
  int (*shutdown)();
  int (*device_count)(unsigned int*);
  int (*device_by_index)(unsigned int, nvmlDevice_t*);
  int (*device_name)(nvmlDevice_t, char*, unsigned int);
  int (*device_uuid)(nvmlDevice_t, char*, unsigned int);
  int (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  int (*memory)(nvmlDevice_t, nvmlMemory_t*);
  int (*temperature)(nvmlDevice_t, int, unsigned int*);
  int (*power_milliwatts)(nvmlDevice_t, unsigned int*);
};

absl::StatusOr<std::shared_ptr<NvmlCollector>> NvmlCollector::Open(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    return absl::NotFoundError(absl::StrCat("cannot load ", library, ": ", dlerror()));
  auto api = std::make_unique<Api>();
  std::string missing;
  auto bind = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
  };
  bind(api->init, "nvmlInit_v2");
  bind(api->shutdown, "nvmlShutdown");
  bind(api->device_count, "nvmlDeviceGetCount_v2");
  bind(api->device_by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(api->device_name, "nvmlDeviceGetName");
  bind(api->device_uuid, "nvmlDeviceGetUUID");
  bind(api->utilization, "nvmlDeviceGetUtilizationRates");
  bind(api->memory, "nvmlDeviceGetMemoryInfo");
  bind(api->temperature, "nvmlDeviceGetTemperature");
  bind(api->power_milliwatts, "nvmlDeviceGetPowerUsage");
  if (!missing.empty()) {
    dlclose(lib);
    return absl::FailedPreconditionError(absl::StrCat(library, " lacks ", missing));
  }
  if (const int rc = api->init(); rc != 0) {
    dlclose(lib);
    return absl::UnavailableError(
        absl::StrCat("nvmlInit failed (NVML error ", rc, "): no NVIDIA driver?"));
  }
  return std::shared_ptr<NvmlCollector>(new NvmlCollector(std::move(api), lib));
}

NvmlCollector::NvmlCollector(std::unique_ptr<Api> api, void* library)
    : api_(std::move(api)), library_(library) {
  unsigned int count = 0;
  if (api_->device_count(&count) != 0) count = 0;
  for (unsigned int i = 0; i < count; ++i) {
    Device d;
    if (api_->device_by_index(i, &d.handle) != 0) continue;
    char text[kNvmlStringBytes] = {};
    d.index = std::to_string(i);
    if (api_->device_uuid(d.handle, text, sizeof(text)) == 0) d.uuid = text;
    if (api_->device_name(d.handle, text, sizeof(text)) == 0) d.name = text;
    devices_.push_back(std::move(d));
  }
}

NvmlCollector::~NvmlCollector() {
  api_->shutdown();
  dlclose(library_);
}

std::vector<MetricFamily> NvmlCollector::Collect() const {
  MetricFamily util{"tandem_gpu_utilization_ratio",
                    "Fraction of the last sample period in which a kernel ran on the GPU (NVML).",
                    MetricType::Gauge,
                    {}};
  MetricFamily mem_util{
      "tandem_gpu_memory_utilization_ratio",
      "Fraction of the last sample period in which GPU memory was read or written (NVML).",
      MetricType::Gauge,
      {}};
  MetricFamily used{"tandem_gpu_memory_used_bytes",
                    "GPU memory in use, by every process (NVML).",
                    MetricType::Gauge,
                    {}};
  MetricFamily total{
      "tandem_gpu_memory_total_bytes", "GPU memory installed (NVML).", MetricType::Gauge, {}};
  MetricFamily temp{
      "tandem_gpu_temperature_celsius", "GPU core temperature (NVML).", MetricType::Gauge, {}};
  MetricFamily power{
      "tandem_gpu_power_watts", "GPU board power draw (NVML).", MetricType::Gauge, {}};
  for (const Device& d : devices_) {
    auto sample = [&](MetricFamily& family, double value) {
      ClientMetric m;
      m.label = {{"gpu", d.index}, {"model", d.name}, {"uuid", d.uuid}};
      m.gauge.value = value;
      family.metric.push_back(std::move(m));
    };
    if (nvmlUtilization_t u; api_->utilization(d.handle, &u) == 0) {
      sample(util, u.gpu / 100.0);
      sample(mem_util, u.memory / 100.0);
    }
    if (nvmlMemory_t m; api_->memory(d.handle, &m) == 0) {
      sample(used, static_cast<double>(m.used));
      sample(total, static_cast<double>(m.total));
    }
    if (unsigned int c = 0; api_->temperature(d.handle, kNvmlTemperatureGpu, &c) == 0)
      sample(temp, c);
    if (unsigned int mw = 0; api_->power_milliwatts(d.handle, &mw) == 0) sample(power, mw / 1000.0);
  }
  return {util, mem_util, used, total, temp, power};
}

}  // namespace tandem::metrics
