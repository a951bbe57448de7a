// The always-on per-layer histograms: Prometheus buckets, concurrency, and a
// real runner feeding them.
#include "runtime/profile/layer_histograms.h"

#include <thread>

#include "gtest/gtest.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/profile/synthetic_inputs.h"
#include "runtime/train/job_model.h"

namespace tandem::profile {
namespace {

const LayerPhaseHistogram* Find(const LayerHistogramSnapshot& s, int layer, Phase phase) {
  for (const LayerPhaseHistogram& h : s.series) {
    if (h.layer == layer && h.phase == phase) return &h;
  }
  return nullptr;
}

TEST(LayerHistogramsTest, BucketsAreCumulativeUpperBounds) {
  LayerHistograms h({"linear0", "relu1"});
  h.Record(0, Phase::kForward, 5e-6);  // <= 1e-5
  h.Record(0, Phase::kForward, 1e-5);  // <= 1e-5 (le is inclusive)
  h.Record(0, Phase::kForward, 3e-5);  // <= 5e-5
  h.Record(0, Phase::kForward, 20.0);  // +Inf only
  const LayerHistogramSnapshot s = h.Snapshot();
  ASSERT_EQ(s.upper_bounds_seconds.size(), kLayerStepBucketsSeconds.size());
  const LayerPhaseHistogram* f = Find(s, 0, Phase::kForward);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->layer_name, "linear0");
  ASSERT_EQ(f->cumulative_counts.size(), kLayerStepBucketsSeconds.size() + 1);
  EXPECT_EQ(f->cumulative_counts[0], 2u);                                    // le 1e-5
  EXPECT_EQ(f->cumulative_counts[1], 2u);                                    // le 2.5e-5
  EXPECT_EQ(f->cumulative_counts[2], 3u);                                    // le 5e-5
  EXPECT_EQ(f->cumulative_counts[kLayerStepBucketsSeconds.size() - 1], 3u);  // le 10
  EXPECT_EQ(f->cumulative_counts.back(), 4u);                                // +Inf
  EXPECT_EQ(f->count, 4u);
  EXPECT_NEAR(f->sum_seconds, 5e-6 + 1e-5 + 3e-5 + 20.0, 1e-9);
  // Series without observations are left out.
  EXPECT_EQ(Find(s, 1, Phase::kForward), nullptr);
  EXPECT_EQ(s.series.size(), 1u);
}

TEST(LayerHistogramsTest, KeepsLayersPhasesAndTheModelUpdateApart) {
  LayerHistograms h({"a", "b"});
  h.Record(1, Phase::kBackward, 1e-3);
  h.Record(-1, Phase::kUpdate, 2e-3);
  h.Record(2, Phase::kForward, 1e-3);   // Not a layer: ignored.
  h.Record(-2, Phase::kForward, 1e-3);  // Not a layer: ignored.
  const LayerHistogramSnapshot s = h.Snapshot();
  ASSERT_EQ(s.series.size(), 2u);
  EXPECT_EQ(s.series[0].layer, -1);
  EXPECT_EQ(s.series[0].layer_name, "optimizer");
  EXPECT_EQ(s.series[0].phase, Phase::kUpdate);
  EXPECT_EQ(s.series[1].layer_name, "b");
  EXPECT_EQ(s.series[1].phase, Phase::kBackward);
  EXPECT_STREQ(PhaseLabel(Phase::kUpdate), "update");
}

TEST(LayerHistogramsTest, ConcurrentRecordsAndSnapshotsLoseNothing) {
  LayerHistograms h({"a"});
  constexpr int kThreads = 4, kRecords = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done.load()) {
      const LayerHistogramSnapshot s = h.Snapshot();
      for (const auto& series : s.series) {
        // Internally consistent even mid-update.
        ASSERT_EQ(series.cumulative_counts.back(), series.count);
      }
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRecords; ++i) h.Record(0, Phase::kForward, 1e-4 * (t + 1));
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  scraper.join();
  const LayerPhaseHistogram* f = Find(h.Snapshot(), 0, Phase::kForward);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->count, static_cast<uint64_t>(kThreads * kRecords));
  EXPECT_NEAR(f->sum_seconds, kRecords * 1e-4 * (1 + 2 + 3 + 4), 1e-6);
}

// The CPU engine feeds every layer's forward and backward, and its whole-model
// update as layer -1, once per step.
TEST(LayerHistogramsTest, CountsEveryPhaseOfEveryStepOfARunner) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {mlp: {hidden_sizes: [16]}}
data: {synthetic: {sample_shape: [8], num_classes: 3}}
training: {batch_size: 4, steps: 1})",
                                                          "mlp.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> job = BuildJobModel(*resolved);
  ASSERT_TRUE(job.ok()) << job.status();
  const Model& model = *job->model;
  HostAllocator allocator;
  auto runner = CpuRunner::Create(model, resolved->optimizer(), 4, 1, &allocator);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::vector<std::string> names;
  for (int l = 0; l < model.num_layers(); ++l) names.push_back(model.layer(l).name());
  LayerHistograms histograms(names);
  (*runner)->set_timing_sink(&histograms);
  const Batch batch = SyntheticBatch(model.data(), 4, 1);
  for (int step = 0; step < 3; ++step) {
    StepOptions options;
    options.step = step;
    ASSERT_TRUE((*runner)->TrainStep(batch, options).ok());
  }
  const LayerHistogramSnapshot s = histograms.Snapshot();
  EXPECT_EQ(s.series.size(), static_cast<size_t>(2 * model.num_layers() + 1));
  for (int l = 0; l < model.num_layers(); ++l) {
    for (Phase phase : {Phase::kForward, Phase::kBackward}) {
      const LayerPhaseHistogram* h = Find(s, l, phase);
      ASSERT_NE(h, nullptr) << l;
      EXPECT_EQ(h->count, 3u) << names[l];
      EXPECT_GT(h->sum_seconds, 0) << names[l];
    }
  }
  const LayerPhaseHistogram* update = Find(s, -1, Phase::kUpdate);
  ASSERT_NE(update, nullptr);
  EXPECT_EQ(update->count, 3u);
}

}  // namespace
}  // namespace tandem::profile
