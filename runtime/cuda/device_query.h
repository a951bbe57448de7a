// Finds the CUDA GPUs of this node at run time. A binary built with the toolkit
// still runs where there is no driver or no GPU: it then finds none. Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_DEVICE_QUERY_H_
#define TANDEM_RUNTIME_CUDA_DEVICE_QUERY_H_

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cuda {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int64_t memory_bytes = 0;
  int multiprocessors = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

// Whether this binary was built with the CUDA toolkit.
bool BuiltWithCuda();

// The usable GPUs; empty without a toolkit build, a driver or a device. When
// none are found, `why` (if given) says which of those it was.
std::vector<CudaDeviceInfo> QueryCudaDevices(std::string* why = nullptr);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_DEVICE_QUERY_H_
