// CPU counters read around each profiled phase, from Linux perf events.
//
// CounterSource is the seam (Dynolog's one-monitor-per-source): the profiler
// reads cumulative values before and after a phase and keeps the difference.
// OpenPerfCounters tries the hardware events first (cycles, instructions, cache
// references and misses). Where the kernel or the hypervisor refuses them
// (ENOENT or EOPNOTSUPP on a VM without a virtual PMU, EACCES/EPERM under
// perf_event_paranoid) it falls back to the kernel's software events
// (task-clock, page faults, context switches) and says so in note(); when even
// those are refused it counts nothing and note() says why. A source never
// reports a value it did not count.
//
// Scope: our kernels run on the OpenMP team (oneDNN and our own loops), so one
// counter per event is opened on every thread of the calling thread's team
// (inside a parallel region, each thread for itself) and Read() sums them.
// libgomp keeps the same team threads across parallel regions of the same size,
// so the counters follow the work as long as the team size does not change
// after opening; a per-process `inherit` counter would miss threads that
// existed before it was opened, which the team's threads always do. Counts
// include the team's spin-waiting between regions: that is CPU time the phase
// consumed.
//
// PerfEventApi is the kernel seam below it (perf_event_open, read, close), so
// tests exercise every fallback with FakePerfEventApi (testing/fakes.h).
// Implementations of both interfaces are thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_PERF_COUNTERS_H_
#define TANDEM_RUNTIME_PROFILE_PERF_COUNTERS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// One read of a counting event. The kernel multiplexes events when there are
// more than the PMU has counters; value * time_enabled / time_running
// estimates the full count.
struct PerfReading {
  uint64_t value = 0;
  uint64_t time_enabled_ns = 0;
  uint64_t time_running_ns = 0;
};

class PerfEventApi {
 public:
  virtual ~PerfEventApi() = default;
  // Opens an enabled counting event (perf_event_attr type and config) on the
  // calling thread, any CPU. `exclude_kernel` counts user space only (what
  // perf_event_paranoid >= 2 allows an unprivileged process). Returns the file
  // descriptor, or -errno.
  virtual int Open(uint32_t type, uint64_t config, bool exclude_kernel) = 0;
  virtual bool Read(int fd, PerfReading* reading) = 0;
  virtual void Close(int fd) = 0;
};

// perf_event_open(2) itself.
PerfEventApi* RealPerfEventApi();

struct CounterInfo {
  // "cycles", "instructions", "cache_references", "cache_misses", "task_clock",
  // "page_faults", "context_switches".
  std::string name;
  // "cycles", "instructions", "events", "seconds".
  std::string unit;
  tandem::v1::CounterSource source = tandem::v1::COUNTER_SOURCE_UNSPECIFIED;
};

class CounterSource {
 public:
  virtual ~CounterSource() = default;
  // What Read() returns, in order; empty when nothing could be counted.
  virtual const std::vector<CounterInfo>& counters() const = 0;
  // COUNTER_SOURCE_HARDWARE, _SOFTWARE, or _UNSPECIFIED when counting nothing.
  virtual tandem::v1::CounterSource source() const = 0;
  // Why the source is what it is: the refusal and its errno when it fell back
  // or counts nothing, and what is counted where. Never empty.
  virtual const std::string& note() const = 0;
  // Cumulative values since opening, one per counters(), in their units;
  // multiplexed events scaled interval by interval; NaN for a counter the
  // kernel has not yet scheduled at all (multiplexed out entirely).
  virtual void Read(std::vector<double>* values) = 0;
};

// Hardware events on every thread of the calling thread's OpenMP team, else
// software events, else nothing (see the file comment). Never fails: what
// could not be opened is explained in note().
std::unique_ptr<CounterSource> OpenPerfCounters(PerfEventApi* api = RealPerfEventApi());

// "ENOENT (No such file or directory)".
std::string ErrnoText(int error);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_PERF_COUNTERS_H_
