#include "runtime/core/omp_threads.h"

#include <dirent.h>
#include <omp.h>

#include <chrono>
#include <thread>

namespace tandem {

void RunOnOwnOmpThread(int threads, absl::FunctionRef<void()> fn) {
  std::thread worker([threads, &fn] {
    if (threads > 0) omp_set_num_threads(threads);
    fn();
  });
  worker.join();
}

int ProcessThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

int ProcessThreadCountOnceAt(int expected, double timeout_seconds) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  int count = ProcessThreadCount();
  while (count != expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    count = ProcessThreadCount();
  }
  return count;
}

}  // namespace tandem
