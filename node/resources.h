// What this node has, detected once at start: host name, CPU, host memory (or
// the container's limit when lower) and CUDA devices; and the one default for
// each memory budget tandemd hands out (a flag of 0 means the default). Used by
// tandemd and the CLI alike. Thread-safe: no state.
#ifndef TANDEM_NODE_RESOURCES_H_
#define TANDEM_NODE_RESOURCES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cuda/device_query.h"

namespace tandem::node {

struct NodeResources {
  std::string hostname;
  std::string cpu_name;
  int cpu_threads = 0;
  // Physical memory, or the container's memory limit when lower.
  int64_t host_memory_bytes = 0;
  // Where host_memory_bytes came from when not physical memory.
  std::string memory_note;
  std::vector<cuda::CudaDeviceInfo> cuda_devices;
  std::string cuda_note;
};

NodeResources DetectNodeResources();

// Host bytes all jobs together may use: `flag_bytes` when > 0, else 75% of the
// host's memory (what tandemd and its own buffers leave room for).
int64_t HostMemoryBudget(int64_t flag_bytes, const NodeResources& resources);

// Accelerator bytes all jobs together may use, and what a job asking for none
// gets: `flag_bytes` when > 0, else 90% of the first CUDA device's memory (the
// rest is the CUDA context's and cuBLAS's), else 0 (no GPU: an emulated job
// must say its capacity).
int64_t AcceleratorMemoryBudget(int64_t flag_bytes,
                                const std::vector<cuda::CudaDeviceInfo>& devices);

}  // namespace tandem::node

#endif  // TANDEM_NODE_RESOURCES_H_
