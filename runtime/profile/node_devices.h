// The devices of this node that `tandem profile` and tandemd's ProfileModel
// measure: the host, then the CUDA GPU jobs run on (the first one the device
// query finds), when it opens as a CudaProfiledDevice. A GPU that is found but
// cannot be opened is left out, with the reason in `notes` for the caller to
// print: the profile is then the host's alone. (A build without the toolkit
// finds no GPU.)
// Not thread-safe with other profiling (the devices measure each other).
#ifndef TANDEM_RUNTIME_PROFILE_NODE_DEVICES_H_
#define TANDEM_RUNTIME_PROFILE_NODE_DEVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "runtime/profile/cpu_device.h"
#include "runtime/profile/cuda_device_factory.h"
#include "runtime/profile/profiled_device.h"

namespace tandem::profile {

struct NodeProfiledDevices {
  // The host first, then the GPU if it opened.
  std::vector<std::unique_ptr<ProfiledDevice>> owned;
  // Sentences for the user about GPUs found and left out, e.g. "cuda:0
  // (NVIDIA H100 80GB HBM3) could not be opened for profiling (no CUDA device:
  // ...): profiling the CPU alone".
  std::vector<std::string> notes;

  // For ProfilerEnvironment::devices.
  std::vector<ProfiledDevice*> devices() const;
};

// The host's CpuProfiledDevice is created under `threads` OpenMP threads (0 =
// the calling thread's), which must be the ProfilerEnvironment's `threads`.
NodeProfiledDevices OpenNodeProfiledDevices(int threads, const CpuDeviceOptions& cpu = {},
                                            const CudaProfiledDeviceOptions& gpu = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_NODE_DEVICES_H_
