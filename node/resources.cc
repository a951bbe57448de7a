#include "node/resources.h"

#include <unistd.h>

#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/core/allocator.h"

namespace tandem::node {

NodeResources DetectNodeResources() {
  NodeResources r;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  r.hostname = host;
  r.cpu_threads = static_cast<int>(std::thread::hardware_concurrency());
  r.host_memory_bytes = PhysicalMemoryBytes();
  // In a container the memory limit (cgroup v2 memory.max, or v1's
  // limit_in_bytes) is what the node really has: a budget sized from the
  // machine's memory would have the kernel kill tandemd before admission
  // refused a job.
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    int64_t limit = 0;
    if (f >> limit && limit > 0 && limit < r.host_memory_bytes) {
      r.host_memory_bytes = limit;
      r.memory_note = absl::StrCat("limited by ", path);
      break;
    }
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (absl::StartsWith(line, "model name")) {
      r.cpu_name = std::string(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)));
      break;
    }
  }
  r.cuda_devices = cuda::QueryCudaDevices(&r.cuda_note);
  return r;
}

int64_t HostMemoryBudget(int64_t flag_bytes, const NodeResources& resources) {
  return flag_bytes > 0 ? flag_bytes : resources.host_memory_bytes * 3 / 4;
}

int64_t AcceleratorMemoryBudget(int64_t flag_bytes,
                                const std::vector<cuda::CudaDeviceInfo>& devices) {
  if (flag_bytes > 0) return flag_bytes;
  return devices.empty() ? 0 : devices[0].memory_bytes * 9 / 10;
}

}  // namespace tandem::node
