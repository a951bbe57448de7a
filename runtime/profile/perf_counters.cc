#include "runtime/profile/perf_counters.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <omp.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace tandem::profile {
namespace {

class LinuxPerfEventApi final : public PerfEventApi {
 public:
  int Open(uint32_t type, uint64_t config, bool exclude_kernel) override {
    perf_event_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.size = sizeof(attr);
    attr.type = type;
    attr.config = config;
    attr.exclude_kernel = exclude_kernel ? 1 : 0;
    attr.exclude_hv = 1;
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
    const long fd = syscall(__NR_perf_event_open, &attr, /*pid=*/0, /*cpu=*/-1, /*group_fd=*/-1,
                            PERF_FLAG_FD_CLOEXEC);
    return fd < 0 ? -errno : static_cast<int>(fd);
  }

  bool Read(int fd, PerfReading* reading) override {
    uint64_t v[3];
    if (::read(fd, v, sizeof(v)) != static_cast<ssize_t>(sizeof(v))) return false;
    reading->value = v[0];
    reading->time_enabled_ns = v[1];
    reading->time_running_ns = v[2];
    return true;
  }

  void Close(int fd) override { ::close(fd); }
};

struct EventSpec {
  const char* name;
  const char* unit;
  uint32_t type;
  uint64_t config;
  // Multiplies the raw count into `unit` (task-clock counts nanoseconds).
  double scale;
};

constexpr EventSpec kHardwareEvents[] = {
    {"cycles", "cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, 1.0},
    {"instructions", "instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, 1.0},
    {"cache_references", "events", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES, 1.0},
    {"cache_misses", "events", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES, 1.0},
};

constexpr EventSpec kSoftwareEvents[] = {
    {"task_clock", "seconds", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, 1e-9},
    {"page_faults", "events", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, 1.0},
    {"context_switches", "events", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, 1.0},
};

// One event open on every team thread.
struct OpenEvent {
  EventSpec spec;
  std::vector<int> fds;
};

struct Refusal {
  const char* name;
  int error;
};

// Opens each event on every thread of the team; an event refused on any thread
// is closed everywhere and reported.
void OpenOnTeam(PerfEventApi* api, const EventSpec* specs, int count, bool exclude_kernel,
                std::vector<OpenEvent>* opened, std::vector<Refusal>* refused, int* team_size) {
  const int team = omp_get_max_threads();
  std::vector<std::vector<int>> fds(team, std::vector<int>(count, -ENODEV));
  int actual_team = 0;
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
#pragma omp single
    actual_team = omp_get_num_threads();
    for (int e = 0; e < count; ++e)
      fds[t][e] = api->Open(specs[e].type, specs[e].config, exclude_kernel);
  }
  *team_size = actual_team;
  for (int e = 0; e < count; ++e) {
    int error = 0;
    for (int t = 0; t < actual_team; ++t) {
      if (fds[t][e] < 0 && error == 0) error = -fds[t][e];
    }
    if (error != 0) {
      for (int t = 0; t < actual_team; ++t) {
        if (fds[t][e] >= 0) api->Close(fds[t][e]);
      }
      refused->push_back({specs[e].name, error});
      continue;
    }
    OpenEvent event{specs[e], {}};
    for (int t = 0; t < actual_team; ++t) event.fds.push_back(fds[t][e]);
    opened->push_back(std::move(event));
  }
}

bool IsPermissionError(int error) { return error == EACCES || error == EPERM; }

bool AllPermissionErrors(const std::vector<Refusal>& refused) {
  if (refused.empty()) return false;
  for (const Refusal& r : refused) {
    if (!IsPermissionError(r.error)) return false;
  }
  return true;
}

// Tries `specs` counting kernel and user time, then user time only when the
// refusals were all for permission.
void OpenWithRetry(PerfEventApi* api, const EventSpec* specs, int count,
                   std::vector<OpenEvent>* opened, std::vector<Refusal>* refused, bool* user_only,
                   int* team_size) {
  *user_only = false;
  OpenOnTeam(api, specs, count, false, opened, refused, team_size);
  if (opened->empty() && AllPermissionErrors(*refused)) {
    std::vector<Refusal> again;
    OpenOnTeam(api, specs, count, true, opened, &again, team_size);
    if (!opened->empty()) {
      *user_only = true;
      *refused = std::move(again);
    }
  }
}

std::string DescribeRefusals(const std::vector<Refusal>& refused) {
  // Events refused for the same reason are named together.
  std::vector<std::pair<int, std::vector<std::string>>> by_error;
  for (const Refusal& r : refused) {
    auto it = std::find_if(by_error.begin(), by_error.end(),
                           [&](const auto& e) { return e.first == r.error; });
    if (it == by_error.end()) {
      by_error.push_back({r.error, {r.name}});
    } else {
      it->second.push_back(r.name);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [error, names] : by_error) {
    parts.push_back(
        absl::StrCat("perf_event_open(", absl::StrJoin(names, ", "), "): ", ErrnoText(error)));
  }
  std::string text = absl::StrJoin(parts, "; ");
  for (const Refusal& r : refused) {
    if (IsPermissionError(r.error)) {
      std::ifstream f("/proc/sys/kernel/perf_event_paranoid");
      int paranoid = 0;
      if (f >> paranoid) absl::StrAppend(&text, " (kernel.perf_event_paranoid is ", paranoid, ")");
      break;
    }
  }
  return text;
}

std::vector<std::string> Names(const std::vector<OpenEvent>& events) {
  std::vector<std::string> names;
  for (const OpenEvent& e : events) names.push_back(e.spec.name);
  return names;
}

class PerfCounterSource final : public CounterSource {
 public:
  PerfCounterSource(PerfEventApi* api, std::vector<OpenEvent> events,
                    tandem::v1::CounterSource source, std::string note)
      : api_(api), events_(std::move(events)), source_(source), note_(std::move(note)) {
    for (const OpenEvent& e : events_) infos_.push_back({e.spec.name, e.spec.unit, source_});
  }

  ~PerfCounterSource() override {
    for (const OpenEvent& e : events_) {
      for (int fd : e.fds) api_->Close(fd);
    }
  }

  const std::vector<CounterInfo>& counters() const override { return infos_; }
  tandem::v1::CounterSource source() const override { return source_; }
  const std::string& note() const override { return note_; }

  // Multiplexed events are scaled interval by interval: each reading's
  // growth since the last one, by that interval's enabled over running time,
  // added to a running estimate. (Scaling the cumulative count by the
  // cumulative share, as before, made the difference of two readings wrong,
  // even negative, when the share of time an event was scheduled changed.)
  // An interval enabled but never scheduled takes the event's rate so far
  // (perf's own scaling extrapolates alike); before any rate is known it is
  // unknown, NaN. Thread-safe.
  void Read(std::vector<double>* values) override {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    absl::MutexLock lock(&mu_);
    values->assign(events_.size(), 0.0);
    if (last_.empty()) {
      last_.resize(events_.size());
      for (size_t e = 0; e < events_.size(); ++e) last_[e].resize(events_[e].fds.size());
      estimate_.assign(events_.size(), 0.0);
      enabled_.assign(events_.size(), 0.0);
    }
    for (size_t e = 0; e < events_.size(); ++e) {
      bool known = true;
      for (size_t f = 0; f < events_[e].fds.size(); ++f) {
        PerfReading r;
        if (!api_->Read(events_[e].fds[f], &r)) {
          known = false;
          continue;
        }
        PerfReading& before = last_[e][f];
        const double dv = static_cast<double>(r.value - before.value);
        const double de = static_cast<double>(r.time_enabled_ns - before.time_enabled_ns);
        const double dr = static_cast<double>(r.time_running_ns - before.time_running_ns);
        before = r;
        if (dr > 0) {
          estimate_[e] += dv * de / dr;
          enabled_[e] += de;
        } else if (de > 0 && enabled_[e] > 0) {
          const double rate = estimate_[e] / enabled_[e];  // per enabled ns so far
          estimate_[e] += rate * de;
          enabled_[e] += de;
        } else if (de > 0) {
          known = false;  // enabled, never on the PMU, and no rate yet
        }                 // else not enabled on this thread since (it has not run): nothing counted
      }
      (*values)[e] = known ? estimate_[e] * events_[e].spec.scale : nan;
    }
  }

 private:
  absl::Mutex mu_;
  // Per event and thread, the last raw reading; per event, the running
  // estimate of its count and the enabled time it covers.
  std::vector<std::vector<PerfReading>> last_ ABSL_GUARDED_BY(mu_);
  std::vector<double> estimate_ ABSL_GUARDED_BY(mu_);
  std::vector<double> enabled_ ABSL_GUARDED_BY(mu_);
  PerfEventApi* const api_;
  const std::vector<OpenEvent> events_;
  const tandem::v1::CounterSource source_;
  const std::string note_;
  std::vector<CounterInfo> infos_;
};

}  // namespace

PerfEventApi* RealPerfEventApi() {
  static auto* api = new LinuxPerfEventApi();
  return api;
}

std::string ErrnoText(int error) {
  const char* name = strerrorname_np(error);
  return absl::StrCat(name != nullptr ? name : absl::StrCat("errno ", error).c_str(), " (",
                      strerror(error), ")");
}

std::unique_ptr<CounterSource> OpenPerfCounters(PerfEventApi* api) {
  std::vector<OpenEvent> hardware, software;
  std::vector<Refusal> hardware_refused, software_refused;
  bool user_only = false;
  int team = 1;
  OpenWithRetry(api, kHardwareEvents, std::size(kHardwareEvents), &hardware, &hardware_refused,
                &user_only, &team);
  const std::string scope = absl::StrCat(team, " OpenMP thread", team == 1 ? "" : "s",
                                         user_only ? ", user space only" : "");
  if (!hardware.empty()) {
    std::string note = absl::StrCat("hardware events (", absl::StrJoin(Names(hardware), ", "),
                                    ") summed over ", scope);
    if (!hardware_refused.empty()) {
      absl::StrAppend(&note, "; refused: ", DescribeRefusals(hardware_refused));
    }
    return std::make_unique<PerfCounterSource>(api, std::move(hardware),
                                               tandem::v1::COUNTER_SOURCE_HARDWARE, note);
  }
  OpenWithRetry(api, kSoftwareEvents, std::size(kSoftwareEvents), &software, &software_refused,
                &user_only, &team);
  const std::string why =
      absl::StrCat("hardware events refused: ", DescribeRefusals(hardware_refused));
  if (!software.empty()) {
    std::string note = absl::StrCat(
        why, "; using software events (", absl::StrJoin(Names(software), ", "), ") summed over ",
        team, " OpenMP thread", team == 1 ? "" : "s", user_only ? ", user space only" : "");
    if (!software_refused.empty()) {
      absl::StrAppend(&note, "; also refused: ", DescribeRefusals(software_refused));
    }
    return std::make_unique<PerfCounterSource>(api, std::move(software),
                                               tandem::v1::COUNTER_SOURCE_SOFTWARE, note);
  }
  return std::make_unique<PerfCounterSource>(
      api, std::vector<OpenEvent>{}, tandem::v1::COUNTER_SOURCE_UNSPECIFIED,
      absl::StrCat("no counters: ", why,
                   "; software events refused: ", DescribeRefusals(software_refused)));
}

}  // namespace tandem::profile
