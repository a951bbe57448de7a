#include "runtime/cuda/device_query.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem::cuda {

bool BuiltWithCuda() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<CudaDeviceInfo> QueryCudaDevices(std::string* why) {
  std::vector<CudaDeviceInfo> devices;
#ifdef TANDEM_HAVE_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = std::string("no CUDA device: ") + cudaGetErrorString(err);
    cudaGetLastError();  // Clear the sticky error so later calls start clean.
    return devices;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    CudaDeviceInfo info;
    info.ordinal = i;
    info.name = prop.name;
    info.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.multiprocessors = prop.multiProcessorCount;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    devices.push_back(info);
  }
  if (devices.empty() && why != nullptr) *why = "no CUDA device found";
#else
  if (why != nullptr) *why = "built without the CUDA toolkit";
#endif
  return devices;
}

}  // namespace tandem::cuda
