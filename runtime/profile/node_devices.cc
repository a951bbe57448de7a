#include "runtime/profile/node_devices.h"

#include "absl/strings/str_cat.h"
#include "runtime/cuda/device_query.h"

namespace tandem::profile {

std::vector<ProfiledDevice*> NodeProfiledDevices::devices() const {
  std::vector<ProfiledDevice*> out;
  for (const std::unique_ptr<ProfiledDevice>& d : owned) out.push_back(d.get());
  return out;
}

NodeProfiledDevices OpenNodeProfiledDevices(int threads, const CpuDeviceOptions& cpu,
                                            const CudaProfiledDeviceOptions& gpu) {
  NodeProfiledDevices node;
  {
    // The CPU device counts on the OpenMP team it is created under.
    ScopedThreads scoped(threads);
    node.owned.push_back(CpuProfiledDevice::Create(cpu));
  }
  const std::vector<cuda::CudaDeviceInfo> gpus = cuda::QueryCudaDevices();
  if (gpus.empty()) return node;
  const cuda::CudaDeviceInfo& first = gpus.front();
  absl::StatusOr<std::unique_ptr<ProfiledDevice>> device =
      CreateCudaProfiledDevice(first.ordinal, gpu);
  if (device.ok()) {
    node.owned.push_back(std::move(device).value());
    if (gpus.size() > 1) {
      node.notes.push_back(absl::StrCat(gpus.size(), " CUDA devices found: profiling cuda:",
                                        first.ordinal, ", the one jobs run on"));
    }
  } else {
    node.notes.push_back(absl::StrCat("cuda:", first.ordinal, " (", first.name,
                                      ") could not be opened for profiling (",
                                      device.status().ToString(), "): profiling the CPU alone"));
  }
  return node;
}

}  // namespace tandem::profile
