#include "runtime/profile/layer_histograms.h"

#include <cmath>

namespace tandem::profile {

const char* PhaseLabel(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kUpdate:
      return "update";
  }
  return "unknown";
}

LayerHistograms::LayerHistograms(std::vector<std::string> layer_names)
    : layer_names_(std::move(layer_names)),
      series_(new Series[(layer_names_.size() + 1) * kPhases]) {}

LayerHistograms::~LayerHistograms() = default;

void LayerHistograms::Record(int layer, Phase phase, double seconds) {
  if (layer < -1 || layer >= static_cast<int>(layer_names_.size())) return;
  if (!(seconds >= 0)) seconds = 0;  // NaN or a clock step backwards.
  Series& s = series_[(layer + 1) * kPhases + static_cast<int>(phase)];
  int bucket = 0;
  while (bucket < kBuckets - 1 && seconds > kLayerStepBucketsSeconds[bucket]) ++bucket;
  s.buckets[bucket].fetch_add(1, std::memory_order_relaxed);
  s.sum_nanoseconds.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)),
                              std::memory_order_relaxed);
}

LayerHistogramSnapshot LayerHistograms::Snapshot() const {
  LayerHistogramSnapshot snapshot;
  snapshot.upper_bounds_seconds.assign(kLayerStepBucketsSeconds.begin(),
                                       kLayerStepBucketsSeconds.end());
  for (int layer = -1; layer < static_cast<int>(layer_names_.size()); ++layer) {
    for (int p = 0; p < kPhases; ++p) {
      const Series& s = series_[(layer + 1) * kPhases + p];
      LayerPhaseHistogram h;
      h.layer = layer;
      h.layer_name = layer < 0 ? "optimizer" : layer_names_[layer];
      h.phase = static_cast<Phase>(p);
      uint64_t running = 0;
      for (const std::atomic<uint64_t>& b : s.buckets) {
        running += b.load(std::memory_order_relaxed);
        h.cumulative_counts.push_back(running);
      }
      h.count = running;
      if (h.count == 0) continue;
      h.sum_seconds = 1e-9 * static_cast<double>(s.sum_nanoseconds.load(std::memory_order_relaxed));
      snapshot.series.push_back(std::move(h));
    }
  }
  return snapshot;
}

}  // namespace tandem::profile
