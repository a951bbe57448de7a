// The host as a ProfiledDevice: a HostAccelerator (host memory, layers on the
// oneDNN CPU kernels of the calling thread's OpenMP team, the fused optimizer
// kernels for updates) plus, per phase:
//
//   - thread_cpu_seconds: CPU time of the calling thread alone
//     (CLOCK_THREAD_CPUTIME_ID), as TimingStats defines it. OpenMP workers'
//     time is not in it; the task_clock counter (software events) sums the
//     whole team's.
//   - counters from a CounterSource: perf events on the team (perf_counters.h),
//     hardware where the kernel allows, software otherwise, each Counter marked
//     with its source; none at all when perf refuses everything, and the
//     DeviceProfile's counter_note says why.
//
// Before each update call it evicts the caches (EvictCaches), so per-layer
// update times are those of state last touched an iteration ago. The host has
// no link to itself, so no links are measured for it. Driven by
// one thread (the profiler's), like every ProfiledDevice.
#ifndef TANDEM_RUNTIME_PROFILE_CPU_DEVICE_H_
#define TANDEM_RUNTIME_PROFILE_CPU_DEVICE_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/device/host_accelerator.h"
#include "runtime/profile/cpu_peaks.h"
#include "runtime/profile/perf_counters.h"
#include "runtime/profile/profiled_device.h"

namespace tandem::profile {

struct CpuDeviceOptions {
  TriadOptions triad;
  GemmOptions gemm;
  // The limit of every allocator NewAllocator makes, in bytes: tandemd passes
  // the host memory a profile reserved. 0 = the machine's physical memory
  // (never unlimited).
  int64_t allocator_budget_bytes = 0;
};

class CpuProfiledDevice final : public ProfiledDevice {
 public:
  // Counts with OpenPerfCounters() on the calling thread's OpenMP team: set
  // the thread count before creating it.
  static std::unique_ptr<CpuProfiledDevice> Create(CpuDeviceOptions options = {});
  CpuProfiledDevice(std::unique_ptr<CounterSource> counters, CpuDeviceOptions options);

  tandem::v1::DeviceProfile Describe() const override;
  std::map<std::string, std::string> Versions() const override;

  std::unique_ptr<Allocator> NewAllocator() override;
  // Writes a buffer of twice the last-level cache from every team thread.
  void EvictCaches() override;

  void BeginPhase(int layer, Phase phase, int repetition, bool timed) override;
  void EndPhase(int layer, Phase phase, int repetition, bool timed) override;
  absl::Status CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) override;

  absl::Status MeasurePeaks(tandem::v1::DeviceProfile* out) override;
  void FinishProfile(tandem::v1::DeviceProfile* out) override;

 private:
  // Timed calls of one phase of one layer: thread CPU seconds and counter
  // deltas per call.
  struct Samples {
    std::vector<double> thread_cpu_seconds;
    std::vector<std::vector<double>> counters;
  };

  HostAccelerator host_;
  std::unique_ptr<CounterSource> counters_;
  CpuDeviceOptions options_;
  double begin_cpu_seconds_ = 0;
  std::vector<double> begin_counters_, end_counters_;
  std::map<std::pair<int, Phase>, Samples> samples_;
  std::vector<float> eviction_;
  float eviction_generation_ = 0;
};

// Sets the calling thread's OpenMP thread count to `threads` (0 = leaves it)
// and restores it on scope exit: ProfileModel measures under its environment's
// threads, and a CpuProfiledDevice it is given is created under the same count.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads);
  ~ScopedThreads();
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  const int previous_;
};

// The last-level cache of CPU 0, in bytes, from sysfs; 32 MiB when unknown.
int64_t LastLevelCacheBytes();

// The most EvictCaches writes, in bytes: twice the last-level cache where that
// is smaller. Some machines report a cache too large to sweep at every
// update call within a daemon's memory budget (a 2-core VM here reported a
// 480 MiB L3, which made every profile hold 960 MiB beyond its budget; parts
// with stacked cache have over 1 GiB); there the sweep evicts part of it.
constexpr int64_t kMaxEvictionBytes = int64_t{256} << 20;

// What EvictCaches writes on this machine: min(2 x LastLevelCacheBytes(),
// kMaxEvictionBytes).
int64_t EvictionBytes();

// "AMD EPYC 7B13", from /proc/cpuinfo; "unknown CPU" when it says nothing.
std::string HostCpuName();

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CPU_DEVICE_H_
