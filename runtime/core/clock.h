// Time sources. Wall time is monotonic (steady_clock); thread CPU time is the
// calling thread's (CLOCK_THREAD_CPUTIME_ID). Thread-safe.
#ifndef TANDEM_RUNTIME_CORE_CLOCK_H_
#define TANDEM_RUNTIME_CORE_CLOCK_H_

#include <time.h>

#include <chrono>

namespace tandem {

inline double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_CLOCK_H_
