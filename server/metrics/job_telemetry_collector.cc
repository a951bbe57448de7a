#include "server/metrics/job_telemetry_collector.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// At most kMaxLabelValueBytes, cut where a UTF-8 character begins (a value
// cut inside one is not UTF-8, and Prometheus drops the whole scrape), and
// with any byte that is not part of valid UTF-8 replaced by '?'.
std::string Bounded(const std::string& value) {
  std::string out;
  size_t i = 0;
  while (i < value.size()) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    const size_t n = c < 0x80           ? 1
                     : (c >> 5) == 0x6  ? 2
                     : (c >> 4) == 0xE  ? 3
                     : (c >> 3) == 0x1E ? 4
                                        : 0;
    bool valid = n > 0 && i + n <= value.size();
    for (size_t k = 1; valid && k < n; ++k) {
      valid = (static_cast<unsigned char>(value[i + k]) & 0xC0) == 0x80;
    }
    const size_t take = valid ? n : 1;
    if (out.size() + take > kMaxLabelValueBytes) break;
    if (valid) {
      out.append(value, i, n);
    } else {
      out.push_back('?');
    }
    i += take;
  }
  return out;
}

// The families this collector serves, each present (HELP and TYPE) even
// before any job fed it, so dashboards and `promtool check metrics` see them.
struct Families {
  MetricFamily layer_step{
      "tandem_layer_step_seconds",
      "Wall time of one layer's phase (forward, backward, update) in a training "
      "step, from the always-on profiler.",
      MetricType::Histogram,
      {}};
  MetricFamily busy{"tandem_resource_busy_seconds_total",
                    "Seconds each resource of a hybrid plan spent running work (the accelerator's "
                    "compute stream and copy engines, the host's update pool and compute).",
                    MetricType::Counter,
                    {}};
  MetricFamily wait{"tandem_resource_wait_seconds_total",
                    "Seconds a resource sat idle waiting on work of another resource: the "
                    "accelerator on host updates (update stalls), the host on gradients.",
                    MetricType::Counter,
                    {}};
  MetricFamily link{"tandem_link_transferred_bytes_total",
                    "Bytes copied between host and accelerator memory, by direction.",
                    MetricType::Counter,
                    {}};
  MetricFamily pinned{"tandem_pinned_host_memory_bytes",
                      "Pinned (page-locked) host memory the job's accelerator stages copies "
                      "through, in use.",
                      MetricType::Gauge,
                      {}};
  MetricFamily accelerator_memory{
      "tandem_job_accelerator_memory_bytes",
      "The job's accelerator memory in use at the end of its latest step, by category "
      "(parameters, gradients, optimizer_state, activations, workspace).",
      MetricType::Gauge,
      {}};
  MetricFamily accelerator_peak{
      "tandem_job_accelerator_memory_peak_bytes",
      "The most accelerator memory the job has had in use at once since it started here.",
      MetricType::Gauge,
      {}};
};

ClientMetric Sample(std::vector<ClientMetric::Label> labels) {
  ClientMetric m;
  m.label = std::move(labels);
  return m;
}

// The snapshot's series for at most kMaxLayerSeriesPerJob layers, the
// others' merged phase by phase under kOtherLayersLabel (same bucket bounds:
// counts and sums add), merged series first. `kept` is the job's own set of
// layers with series, sticky across scrapes so that no series (the merged
// one above all, which Prometheus reads as counters) ever loses history: it
// is filled once, with the optimizer step and then the layers with the most
// time over all phases (ties to the earlier layer).
std::vector<profile::LayerPhaseHistogram> BoundedLayers(
    std::vector<profile::LayerPhaseHistogram> series, std::set<int>& kept) {
  std::map<int, double> total;
  for (const auto& h : series) total[h.layer] += h.sum_seconds;
  if (total.size() <= kMaxLayerSeriesPerJob && kept.empty()) return series;
  if (kept.empty()) {
    if (total.count(-1) > 0) kept.insert(-1);
    std::vector<std::pair<double, int>> ranked;
    for (const auto& [layer, seconds] : total) ranked.push_back({-seconds, layer});
    std::sort(ranked.begin(), ranked.end());
    for (const auto& [minus_seconds, layer] : ranked) {
      if (kept.size() + 1 >= kMaxLayerSeriesPerJob) break;
      kept.insert(layer);
    }
  }
  std::vector<profile::LayerPhaseHistogram> out, own;
  std::map<Phase, profile::LayerPhaseHistogram> other;
  for (auto& h : series) {
    if (kept.count(h.layer) > 0) {
      own.push_back(std::move(h));
      continue;
    }
    profile::LayerPhaseHistogram& o = other[h.phase];
    o.layer = kOtherLayersIndex;
    o.phase = h.phase;
    o.layer_name = kOtherLayersLabel;
    o.cumulative_counts.resize(std::max(o.cumulative_counts.size(), h.cumulative_counts.size()));
    for (size_t b = 0; b < h.cumulative_counts.size(); ++b) {
      o.cumulative_counts[b] += h.cumulative_counts[b];
    }
    o.count += h.count;
    o.sum_seconds += h.sum_seconds;
  }
  for (auto& [phase, o] : other) out.push_back(std::move(o));
  for (auto& h : own) out.push_back(std::move(h));
  return out;
}

void AddLayerSeries(const std::string& job_id, const profile::LayerHistogramSnapshot& s,
                    std::set<int>& kept, Families& f) {
  // Layer names are the model's, not checked for uniqueness: a repeated
  // (layer, phase) label set would make Prometheus drop the whole scrape, so
  // a repeat takes its chain index as a suffix.
  std::set<std::pair<std::string, Phase>> emitted;
  for (const profile::LayerPhaseHistogram& h : BoundedLayers(s.series, kept)) {
    std::string layer = Bounded(h.layer_name);
    if (!emitted.insert({layer, h.phase}).second) {
      layer = absl::StrCat(layer, "#", h.layer);
      emitted.insert({layer, h.phase});
    }
    ClientMetric m =
        Sample({{"job_id", job_id}, {"layer", layer}, {"phase", profile::PhaseLabel(h.phase)}});
    m.histogram.sample_count = h.count;
    m.histogram.sample_sum = h.sum_seconds;
    for (size_t b = 0; b < h.cumulative_counts.size(); ++b) {
      const double bound = b < s.upper_bounds_seconds.size()
                               ? s.upper_bounds_seconds[b]
                               : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(
          {.cumulative_count = h.cumulative_counts[b], .upper_bound = bound});
    }
    f.layer_step.metric.push_back(std::move(m));
  }
}

void AddResourceSeries(const std::string& job_id, const profile::ResourceUsageSnapshot& s,
                       Families& f) {
  const std::string accelerator = Bounded(s.accelerator);
  auto device = [&](tandem::v1::TimelineResource r) {
    return profile::OnAccelerator(r) ? accelerator : std::string("cpu");
  };
  for (const auto& r : s.resources) {
    ClientMetric busy = Sample({{"device", device(r.resource)},
                                {"job_id", job_id},
                                {"resource", profile::ResourceLabel(r.resource)}});
    busy.counter.value = r.busy_seconds;
    f.busy.metric.push_back(std::move(busy));
    const bool h2d = r.resource == tandem::v1::TIMELINE_RESOURCE_COPY_H2D;
    if (h2d || r.resource == tandem::v1::TIMELINE_RESOURCE_COPY_D2H) {
      ClientMetric bytes = Sample({{"device", accelerator},
                                   {"direction", h2d ? "host_to_device" : "device_to_host"},
                                   {"job_id", job_id}});
      bytes.counter.value = static_cast<double>(r.bytes);
      f.link.metric.push_back(std::move(bytes));
    }
  }
  for (const auto& w : s.waits) {
    ClientMetric wait = Sample({{"device", device(w.resource)},
                                {"job_id", job_id},
                                {"resource", profile::ResourceLabel(w.resource)},
                                {"waited_on", profile::ResourceLabel(w.waited_on)}});
    wait.counter.value = w.seconds;
    f.wait.metric.push_back(std::move(wait));
  }
  if (!accelerator.empty()) {
    ClientMetric pinned = Sample({{"device", accelerator}, {"job_id", job_id}});
    pinned.gauge.value = static_cast<double>(s.pinned_host_bytes);
    f.pinned.metric.push_back(std::move(pinned));
  }
  if (!accelerator.empty() && s.accelerator_memory) {
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      ClientMetric m = Sample({{"category", MemoryCategoryName(static_cast<MemoryCategory>(c))},
                               {"device", accelerator},
                               {"job_id", job_id}});
      m.gauge.value = static_cast<double>(s.accelerator_memory->in_use_bytes[c]);
      f.accelerator_memory.metric.push_back(std::move(m));
    }
    ClientMetric peak = Sample({{"device", accelerator}, {"job_id", job_id}});
    peak.gauge.value = static_cast<double>(s.accelerator_memory->peak_total_bytes);
    f.accelerator_peak.metric.push_back(std::move(peak));
  }
}

}  // namespace

void JobTelemetryCollector::Track(const std::string& job_id,
                                  std::shared_ptr<const profile::JobTelemetry> telemetry) {
  absl::MutexLock lock(&mu_);
  jobs_[job_id] = std::move(telemetry);
}

void JobTelemetryCollector::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  kept_layers_.erase(job_id);
}

std::vector<MetricFamily> JobTelemetryCollector::Collect() const {
  std::map<std::string, std::shared_ptr<const profile::JobTelemetry>> jobs;
  std::map<std::string, std::set<int>> kept;
  {
    absl::MutexLock lock(&mu_);
    jobs = jobs_;
    kept = kept_layers_;
  }
  Families f;
  for (const auto& [id, telemetry] : jobs) {
    AddLayerSeries(id, telemetry->LayerSnapshot(), kept[id], f);
    AddResourceSeries(id, telemetry->ResourceSnapshot(), f);
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, layers] : kept) {
      // A job forgotten meanwhile stays forgotten; one chosen by a concurrent
      // scrape keeps that scrape's choice.
      if (jobs_.count(id) > 0 && kept_layers_[id].empty()) kept_layers_[id] = std::move(layers);
    }
  }
  std::vector<MetricFamily> out;
  for (MetricFamily* family : {&f.layer_step, &f.busy, &f.wait, &f.link, &f.pinned,
                               &f.accelerator_memory, &f.accelerator_peak}) {
    out.push_back(std::move(*family));
  }
  return out;
}

}  // namespace tandem::metrics
