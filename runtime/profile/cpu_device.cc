#include "runtime/profile/cpu_device.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "base/status_macros.h"
#include "runtime/core/allocator.h"
#include "runtime/core/clock.h"
#include "runtime/core/cpu_features.h"
#include "runtime/cpu/onednn.h"
#include "runtime/profile/timing_stats.h"

namespace tandem::profile {
ScopedThreads::ScopedThreads(int threads) : previous_(omp_get_max_threads()) {
  if (threads > 0) omp_set_num_threads(threads);
}

ScopedThreads::~ScopedThreads() { omp_set_num_threads(previous_); }

std::string HostCpuName() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown CPU";
}

int64_t LastLevelCacheBytes() {
  int64_t best = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream f(absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/size"));
    std::string size;
    if (!(f >> size) || size.empty()) continue;
    int64_t multiplier = 1;
    if (size.back() == 'K') multiplier = 1 << 10;
    if (size.back() == 'M') multiplier = 1 << 20;
    if (multiplier != 1) size.pop_back();
    int64_t value = 0;
    if (absl::SimpleAtoi(size, &value)) best = std::max(best, value * multiplier);
  }
  return best > 0 ? best : int64_t{32} << 20;
}

int64_t EvictionBytes() { return std::min(2 * LastLevelCacheBytes(), kMaxEvictionBytes); }

std::unique_ptr<CpuProfiledDevice> CpuProfiledDevice::Create(CpuDeviceOptions options) {
  return std::make_unique<CpuProfiledDevice>(OpenPerfCounters(), options);
}

CpuProfiledDevice::CpuProfiledDevice(std::unique_ptr<CounterSource> counters,
                                     CpuDeviceOptions options)
    : ProfiledDevice(&host_), counters_(std::move(counters)), options_(options) {}

tandem::v1::DeviceProfile CpuProfiledDevice::Describe() const {
  tandem::v1::DeviceProfile d;
  const int threads = omp_get_max_threads();
  d.set_id(id());
  d.set_kind(tandem::v1::DEVICE_KIND_CPU);
  d.set_name(absl::StrCat(HostCpuName(), " (", threads, " thread", threads == 1 ? "" : "s", ")"));
  d.set_threads(threads);
  d.set_memory_bytes(PhysicalMemoryBytes());
  return d;
}

std::map<std::string, std::string> CpuProfiledDevice::Versions() const {
  return {{"onednn", cpu::OneDnnVersion()}, {"cpu_isa", CpuIsaName(ActiveCpuIsa())}};
}

std::unique_ptr<Allocator> CpuProfiledDevice::NewAllocator() {
  return std::make_unique<HostAllocator>(
      options_.allocator_budget_bytes > 0 ? options_.allocator_budget_bytes : PhysicalMemoryBytes(),
      id());
}

void CpuProfiledDevice::EvictCaches() {
  if (eviction_.empty()) eviction_.resize(EvictionBytes() / sizeof(float));
  float* p = eviction_.data();
  const int64_t n = static_cast<int64_t>(eviction_.size());
  const float value = ++eviction_generation_;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void CpuProfiledDevice::BeginPhase(int layer, Phase phase, int repetition, bool timed) {
  if (!timed) return;
  counters_->Read(&begin_counters_);
  begin_cpu_seconds_ = ThreadCpuSeconds();
}

void CpuProfiledDevice::EndPhase(int layer, Phase phase, int repetition, bool timed) {
  if (!timed) return;
  const double cpu_seconds = ThreadCpuSeconds() - begin_cpu_seconds_;
  counters_->Read(&end_counters_);
  Samples& s = samples_[{layer, phase}];
  s.thread_cpu_seconds.push_back(cpu_seconds);
  std::vector<double> delta(end_counters_.size());
  for (size_t i = 0; i < delta.size(); ++i) delta[i] = end_counters_[i] - begin_counters_[i];
  s.counters.push_back(std::move(delta));
}

absl::Status CpuProfiledDevice::CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) {
  const std::vector<CounterInfo>& infos = counters_->counters();
  for (Phase phase : {Phase::kForward, Phase::kBackward, Phase::kUpdate}) {
    auto it = samples_.find({layer, phase});
    if (it == samples_.end()) continue;
    const Samples& s = it->second;
    tandem::v1::PhaseProfile* p = MutablePhase(phase, out);
    p->mutable_timing()->set_thread_cpu_seconds(Median(s.thread_cpu_seconds));
    for (size_t c = 0; c < infos.size(); ++c) {
      std::vector<double> values;
      for (const std::vector<double>& call : s.counters) {
        if (std::isfinite(call[c])) values.push_back(call[c]);
      }
      // A counter never scheduled in any call has no value: leave it out
      // rather than report zero.
      if (values.empty()) continue;
      tandem::v1::Counter* counter = p->add_counters();
      counter->set_name(infos[c].name);
      counter->set_value(Median(values));
      counter->set_unit(infos[c].unit);
      counter->set_source(infos[c].source);
    }
    samples_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status CpuProfiledDevice::MeasurePeaks(tandem::v1::DeviceProfile* out) {
  TANDEM_ASSIGN_OR_RETURN(const double gemm, MeasureGemmFlopsPerSecond(options_.gemm));
  TANDEM_ASSIGN_OR_RETURN(const double triad, MeasureTriadBytesPerSecond(options_.triad));
  TANDEM_ASSIGN_OR_RETURN(const double bf16, MeasureNativeBf16GemmFlopsPerSecond(options_.gemm));
  double single = gemm;
  if (omp_get_max_threads() > 1) {
    // A one-thread region docks no workers on this thread.
    ScopedThreads one(1);
    TANDEM_ASSIGN_OR_RETURN(single, MeasureGemmFlopsPerSecond(options_.gemm));
  }
  out->set_gemm_flops_per_second(gemm);
  out->set_single_thread_gemm_flops_per_second(single);
  out->set_bf16_gemm_flops_per_second(bf16);
  out->set_memory_bandwidth_bytes_per_second(triad);
  return absl::OkStatus();
}

void CpuProfiledDevice::FinishProfile(tandem::v1::DeviceProfile* out) {
  out->set_counter_source(counters_->source());
  out->set_counter_note(counters_->note());
}

}  // namespace tandem::profile
