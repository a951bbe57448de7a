// Fakes for the profiler's seams, for tests: the kernel's perf interface, a
// counter source, and an accelerator whose memory is host memory. Each is
// thread-safe where its interface is.
#ifndef TANDEM_RUNTIME_PROFILE_TESTING_FAKES_H_
#define TANDEM_RUNTIME_PROFILE_TESTING_FAKES_H_

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/profile/perf_counters.h"
#include "runtime/profile/profiled_device.h"

namespace tandem::profile::testing {

// perf_event_open as a table: event types can be refused with an errno (for all
// opens, or only those counting kernel time), and every read of an open event
// advances its value by `step` while enabled and running advance by 1000 ns.
class FakePerfEventApi final : public PerfEventApi {
 public:
  void Refuse(uint32_t type, int error) {
    absl::MutexLock lock(&mu_);
    refused_[type] = error;
  }
  // Refuses opens that count kernel time with EACCES (perf_event_paranoid 2).
  void RefuseKernel(bool refuse) {
    absl::MutexLock lock(&mu_);
    refuse_kernel_ = refuse;
  }
  void set_step(uint64_t step) {
    absl::MutexLock lock(&mu_);
    step_ = step;
  }
  // Every open event's n-th read returns readings[n - 1] (the last once they
  // run out) instead of advancing by `step`: a multiplexed event's counts.
  void Script(std::vector<PerfReading> readings) {
    absl::MutexLock lock(&mu_);
    script_ = std::move(readings);
  }

  int Open(uint32_t type, uint64_t config, bool exclude_kernel) override {
    absl::MutexLock lock(&mu_);
    auto it = refused_.find(type);
    if (it != refused_.end()) return -it->second;
    if (refuse_kernel_ && !exclude_kernel) return -EACCES;
    const int fd = next_fd_++;
    events_[fd] = {type, config, exclude_kernel, 0};
    return fd;
  }
  bool Read(int fd, PerfReading* reading) override {
    absl::MutexLock lock(&mu_);
    auto it = events_.find(fd);
    if (it == events_.end()) return false;
    it->second.reads += 1;
    if (!script_.empty()) {
      *reading = script_[std::min<size_t>(it->second.reads, script_.size()) - 1];
      return true;
    }
    reading->value = it->second.reads * step_;
    reading->time_enabled_ns = reading->time_running_ns = it->second.reads * 1000;
    return true;
  }
  void Close(int fd) override {
    absl::MutexLock lock(&mu_);
    events_.erase(fd);
  }

  int open_events() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(events_.size());
  }
  bool any_user_only() const {
    absl::MutexLock lock(&mu_);
    for (const auto& [fd, e] : events_) {
      if (e.exclude_kernel) return true;
    }
    return false;
  }

 private:
  struct Event {
    uint32_t type;
    uint64_t config;
    bool exclude_kernel;
    uint64_t reads;
  };
  mutable absl::Mutex mu_;
  std::map<uint32_t, int> refused_ ABSL_GUARDED_BY(mu_);
  bool refuse_kernel_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<PerfReading> script_ ABSL_GUARDED_BY(mu_);
  uint64_t step_ ABSL_GUARDED_BY(mu_) = 10;
  int next_fd_ ABSL_GUARDED_BY(mu_) = 100;
  std::map<int, Event> events_ ABSL_GUARDED_BY(mu_);
};

// Counters whose values advance by `step` at every Read, so a phase bracketed
// by two reads sees exactly `step`.
class FakeCounterSource final : public CounterSource {
 public:
  FakeCounterSource(std::vector<CounterInfo> counters, tandem::v1::CounterSource source,
                    std::string note, std::vector<double> step)
      : counters_(std::move(counters)),
        source_(source),
        note_(std::move(note)),
        step_(std::move(step)),
        values_(step_.size(), 0.0) {}
  const std::vector<CounterInfo>& counters() const override { return counters_; }
  tandem::v1::CounterSource source() const override { return source_; }
  const std::string& note() const override { return note_; }
  void Read(std::vector<double>* values) override {
    for (size_t i = 0; i < values_.size(); ++i) values_[i] += step_[i];
    *values = values_;
  }

 private:
  std::vector<CounterInfo> counters_;
  tandem::v1::CounterSource source_;
  std::string note_;
  std::vector<double> step_;
  std::vector<double> values_;
};

// A profiled device over an EmulatedAccelerator (what a whole iteration runs
// on); the memory it hands the profiler is plain host memory with an optional
// budget, its host link memcpy (which can be made to fail), and it has,
// optionally, "pinned" host memory. It records every phase bracket, and reports the
// number of timed calls of each phase as a counter "calls".
class FakeAccelerator final : public ProfiledDevice {
 public:
  explicit FakeAccelerator(bool pinned = true)
      : ProfiledDevice(&emulated_), emulated_(EmulatedOptions{}), pinned_(pinned) {}

  tandem::v1::DeviceProfile Describe() const override {
    tandem::v1::DeviceProfile d;
    d.set_id(id());
    d.set_kind(tandem::v1::DEVICE_KIND_EMULATED);
    d.set_name("fake accelerator");
    return d;
  }
  std::map<std::string, std::string> Versions() const override { return {{"fake", "1"}}; }
  std::unique_ptr<Allocator> NewAllocator() override {
    return std::make_unique<HostAllocator>(budget_bytes_, id());
  }
  void EvictCaches() override { ++evictions_; }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override {
    if (fail_copies_) return absl::InternalError("copy engine fault");
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override {
    return CopyToDevice(dst, src, bytes);
  }
  absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) override {
    if (!pinned_) return ProfiledDevice::AllocatePinnedHost(bytes);
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    pinned_live_.insert(p);
    return p;
  }
  void FreePinnedHost(void* ptr, int64_t) override {
    pinned_live_.erase(ptr);
    std::free(ptr);
  }
  void BeginPhase(int layer, Phase phase, int, bool timed) override {
    open_ = {layer, phase};
    ++begun_;
  }
  void EndPhase(int layer, Phase phase, int, bool timed) override {
    if (open_ != std::make_pair(layer, phase)) ++mismatched_;
    if (timed) ++timed_calls_[{layer, phase}];
  }
  absl::Status CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) override {
    for (auto [phase, p] : {std::pair{Phase::kForward, out->mutable_forward()},
                            std::pair{Phase::kBackward, out->mutable_backward()}}) {
      tandem::v1::Counter* c = p->add_counters();
      c->set_name("calls");
      c->set_value(timed_calls_[{layer, phase}]);
      c->set_unit("events");
    }
    if (timed_calls_.count({layer, Phase::kUpdate})) {
      tandem::v1::Counter* c = out->mutable_update()->add_counters();
      c->set_name("calls");
      c->set_value(timed_calls_[{layer, Phase::kUpdate}]);
    }
    return absl::OkStatus();
  }
  absl::Status MeasurePeaks(tandem::v1::DeviceProfile* out) override { return absl::OkStatus(); }
  void FinishProfile(tandem::v1::DeviceProfile* out) override {}

  void set_fail_copies(bool fail) { fail_copies_ = fail; }
  void set_budget_bytes(int64_t bytes) { budget_bytes_ = bytes; }
  int mismatched_brackets() const { return mismatched_; }
  int begun() const { return begun_; }
  int evictions() const { return evictions_; }
  int live_pinned_buffers() const { return static_cast<int>(pinned_live_.size()); }

 private:
  EmulatedAccelerator emulated_;
  const bool pinned_;
  bool fail_copies_ = false;
  int64_t budget_bytes_ = 0;
  std::pair<int, Phase> open_{-2, Phase::kForward};
  int begun_ = 0, mismatched_ = 0, evictions_ = 0;
  std::map<std::pair<int, Phase>, int> timed_calls_;
  std::set<void*> pinned_live_;
};

}  // namespace tandem::profile::testing

#endif  // TANDEM_RUNTIME_PROFILE_TESTING_FAKES_H_
