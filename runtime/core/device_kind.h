// The kinds of device a layer can run on. kCpu and kEmulated run the CPU kernels
// on host memory (the emulated accelerator's memory is a separate host arena);
// kCuda runs CUDA kernels on device memory.
#ifndef TANDEM_RUNTIME_CORE_DEVICE_KIND_H_
#define TANDEM_RUNTIME_CORE_DEVICE_KIND_H_

namespace tandem {

enum class DeviceKind { kCpu = 0, kCuda = 1, kEmulated = 2 };

inline const char* DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kEmulated:
      return "emulated";
  }
  return "?";
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_DEVICE_KIND_H_
