// The profiler's always-on mode: a LayerTimingSink that a running job's step
// runner feeds with every layer phase's wall time, kept as fixed-bucket
// histograms per (layer, phase) for the daemon's metrics
// (tandem_layer_step_seconds{job_id, layer, phase}, a Prometheus histogram).
//
// Record() is on the training thread's hot path, once per layer per phase per
// step: it finds the bucket by a short scan of constant bounds and does two
// relaxed atomic additions, no locks and no allocation, so it costs tens of
// nanoseconds against layer phases of microseconds to seconds
// (bench/profiler/ measures the overhead on whole steps). Snapshot() may run
// concurrently on any thread (the metrics scrape); it reads each counter once,
// so a snapshot taken mid-step can miss that step's latest observations but
// is internally consistent: count is the sum of the buckets. Thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_LAYER_HISTOGRAMS_H_
#define TANDEM_RUNTIME_PROFILE_LAYER_HISTOGRAMS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/timing_sink.h"

namespace tandem::profile {

// Upper bounds of the buckets, in seconds (10 us to 10 s, 1-2.5-5 steps);
// observations above the last land in the implicit +Inf bucket.
inline constexpr std::array<double, 19> kLayerStepBucketsSeconds = {
    1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
    2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0,  2.5,  5.0,    10.0};

struct LayerPhaseHistogram {
  // Chain index, or -1 for the whole-model optimizer step (CpuRunner's).
  int layer = 0;
  // The layer's name ("conv2d0"), "optimizer" for layer -1.
  std::string layer_name;
  Phase phase = Phase::kForward;
  // Prometheus `le` buckets: observations <= upper_bounds_seconds[i], cumulative;
  // one more entry than the bounds, the last being +Inf (== count).
  std::vector<uint64_t> cumulative_counts;
  uint64_t count = 0;
  double sum_seconds = 0;
};

struct LayerHistogramSnapshot {
  std::vector<double> upper_bounds_seconds;
  // Only series with at least one observation, by layer then phase.
  std::vector<LayerPhaseHistogram> series;
};

// "forward", "backward", "update": the `phase` label.
const char* PhaseLabel(Phase phase);

class LayerHistograms final : public LayerTimingSink {
 public:
  // One name per chain layer; Record ignores layers outside [-1, size).
  explicit LayerHistograms(std::vector<std::string> layer_names);
  ~LayerHistograms() override;

  void Record(int layer, Phase phase, double seconds) override;
  LayerHistogramSnapshot Snapshot() const;

 private:
  static constexpr int kPhases = 3;
  static constexpr int kBuckets = static_cast<int>(kLayerStepBucketsSeconds.size()) + 1;
  struct Series {
    std::array<std::atomic<uint64_t>, kBuckets> buckets{};
    // Nanoseconds, so the sum can be added atomically without a CAS loop.
    std::atomic<uint64_t> sum_nanoseconds{0};
  };

  const std::vector<std::string> layer_names_;
  // Index (layer + 1) * kPhases + phase; slot 0 holds layer -1.
  std::unique_ptr<Series[]> series_;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_LAYER_HISTOGRAMS_H_
