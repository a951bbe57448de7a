// The jobs' telemetry as Prometheus families: names, labels and values from
// what the runner recorded, bounded label values, and a job's series gone once
// it is forgotten.
#include "server/metrics/job_telemetry_collector.h"

#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

using tandem::v1::TimelineResource;

std::string Text(const JobTelemetryCollector& c) {
  return prometheus::TextSerializer().Serialize(c.Collect());
}

TEST(JobTelemetryCollectorTest, EveryFamilyIsDeclaredBeforeAnyJob) {
  JobTelemetryCollector c;
  const std::string text = Text(c);
  for (const char* family :
       {"tandem_layer_step_seconds histogram", "tandem_resource_busy_seconds_total counter",
        "tandem_resource_wait_seconds_total counter", "tandem_link_transferred_bytes_total counter",
        "tandem_pinned_host_memory_bytes gauge", "tandem_job_accelerator_memory_bytes gauge",
        "tandem_job_accelerator_memory_peak_bytes gauge"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + family), std::string::npos) << family << " in\n"
                                                                             << text;
  }
}

TEST(JobTelemetryCollectorTest, ResourceTotalsBecomeLabelledSeries) {
  auto t = std::make_shared<profile::JobTelemetry>(std::vector<std::string>{"linear0", "linear1"});
  ResourceSpanBatch batch;
  batch.accelerator = "emulated:0";
  batch.pinned_host_bytes = 4096;
  batch.spans = {
      {TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, 0.25, 0, 0.5,
       TimelineResource::TIMELINE_RESOURCE_HOST_UPDATE},
      {TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, 0.5, 0, 0,
       TimelineResource::TIMELINE_RESOURCE_UNSPECIFIED},
      {TimelineResource::TIMELINE_RESOURCE_COPY_H2D, 0.125, 1000, 0,
       TimelineResource::TIMELINE_RESOURCE_UNSPECIFIED},
      {TimelineResource::TIMELINE_RESOURCE_COPY_D2H, 0.0625, 3000, 0,
       TimelineResource::TIMELINE_RESOURCE_UNSPECIFIED},
      {TimelineResource::TIMELINE_RESOURCE_HOST_UPDATE, 1.0, 0, 0.75,
       TimelineResource::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE},
  };
  t->RecordSpans(batch);
  // The accelerator's memory: the latest batch's, not a sum.
  MemoryStats memory;
  memory.in_use_bytes[static_cast<int>(MemoryCategory::kParameters)] = 1 << 20;
  memory.in_use_bytes[static_cast<int>(MemoryCategory::kOptimizerState)] = 3 << 20;
  memory.peak_total_bytes = 9 << 20;
  batch.accelerator_memory = memory;
  t->RecordSpans(batch);  // totals add up across batches
  t->Record(1, Phase::kBackward, 0.003);
  JobTelemetryCollector c;
  c.Track("job-000001", t);
  const std::string text = Text(c);
  for (
      const char* line : {
          "tandem_resource_busy_seconds_total{device=\"emulated:0\",job_id=\"job-000001\",resource="
          "\"accelerator_compute\"} 1.5",
          "tandem_resource_busy_seconds_total{device=\"emulated:0\",job_id=\"job-000001\",resource="
          "\"copy_h2d\"} 0.25",
          "tandem_resource_busy_seconds_total{device=\"cpu\",job_id=\"job-000001\",resource=\"host_"
          "update\"} 2",
          "tandem_resource_wait_seconds_total{device=\"emulated:0\",job_id=\"job-000001\",resource="
          "\"accelerator_compute\",waited_on=\"host_update\"} 1",
          "tandem_resource_wait_seconds_total{device=\"cpu\",job_id=\"job-000001\",resource=\"host_"
          "update\","
          "waited_on=\"accelerator_compute\"} 1.5",
          "tandem_link_transferred_bytes_total{device=\"emulated:0\",direction=\"host_to_device\","
          "job_id="
          "\"job-000001\"} 2000",
          "tandem_link_transferred_bytes_total{device=\"emulated:0\",direction=\"device_to_host\","
          "job_id="
          "\"job-000001\"} 6000",
          "tandem_pinned_host_memory_bytes{device=\"emulated:0\",job_id=\"job-000001\"} 4096",
          "tandem_job_accelerator_memory_bytes{category=\"parameters\",device=\"emulated:0\","
          "job_id=\"job-000001\"} 1048576",
          "tandem_job_accelerator_memory_bytes{category=\"optimizer_state\",device=\"emulated:0\","
          "job_id=\"job-000001\"} 3145728",
          "tandem_job_accelerator_memory_bytes{category=\"activations\",device=\"emulated:0\","
          "job_id=\"job-000001\"} 0",
          "tandem_job_accelerator_memory_peak_bytes{device=\"emulated:0\",job_id=\"job-000001\"} "
          "9437184",
          "tandem_layer_step_seconds_bucket{job_id=\"job-000001\",layer=\"linear1\",phase="
          "\"backward\",le="
          "\"0.0025\"} 0",
          "tandem_layer_step_seconds_bucket{job_id=\"job-000001\",layer=\"linear1\",phase="
          "\"backward\",le="
          "\"0.005\"} 1",
          "tandem_layer_step_seconds_count{job_id=\"job-000001\",layer=\"linear1\",phase="
          "\"backward\"} 1",
      }) {
    EXPECT_NE(text.find(std::string(line) + "\n"), std::string::npos) << line << "\nnot in\n"
                                                                      << text;
  }
  // No wait series for resources that never waited.
  EXPECT_EQ(text.find("resource=\"copy_h2d\",waited_on"), std::string::npos) << text;

  c.Forget("job-000001");
  EXPECT_EQ(Text(c).find("job-000001"), std::string::npos);
}

TEST(JobTelemetryCollectorTest, LongLayerNamesAreCut) {
  auto t =
      std::make_shared<profile::JobTelemetry>(std::vector<std::string>{std::string(5000, 'n')});
  t->Record(0, Phase::kForward, 0.001);
  JobTelemetryCollector c;
  c.Track("job-000002", t);
  const std::string text = Text(c);
  EXPECT_NE(text.find("layer=\"" + std::string(kMaxLabelValueBytes, 'n') + "\""),
            std::string::npos);
  EXPECT_EQ(text.find(std::string(kMaxLabelValueBytes + 1, 'n')), std::string::npos);
}

// A name of two-byte characters is cut between characters, never inside one,
// and a byte that is not UTF-8 becomes '?': an invalid label value would make
// Prometheus drop the whole scrape.
TEST(JobTelemetryCollectorTest, CutLayerNamesStayUtf8) {
  std::string e_acute;
  for (int i = 0; i < 100; ++i) e_acute += "\xC3\xA9";  // 200 bytes of é
  auto t = std::make_shared<profile::JobTelemetry>(
      std::vector<std::string>{"x" + e_acute, std::string("bad\xFFname")});
  t->Record(0, Phase::kForward, 0.001);
  t->Record(1, Phase::kForward, 0.001);
  JobTelemetryCollector c;
  c.Track("job-000003", t);
  const std::string text = Text(c);
  // "x" and 63 whole characters: 127 bytes, the 64th would make 129.
  EXPECT_NE(text.find("layer=\"x" + e_acute.substr(0, 126) + "\""), std::string::npos);
  EXPECT_NE(text.find("layer=\"bad?name\""), std::string::npos);
}

// A job of many layers exports its own series for the 63 layers with the
// most time and merges the others, phase by phase, into "other layers": the
// scrape stays bounded however deep the model.
TEST(JobTelemetryCollectorTest, ManyLayersKeepTheSlowestAndMergeTheRest) {
  constexpr int kLayers = 100;
  std::vector<std::string> names;
  for (int i = 0; i < kLayers; ++i) names.push_back("layer" + std::to_string(i));
  auto t = std::make_shared<profile::JobTelemetry>(names);
  // Layer i takes (i + 1) ms forward and backward: layers 37..99 are the slowest 63.
  for (int i = 0; i < kLayers; ++i) {
    t->Record(i, Phase::kForward, 0.001 * (i + 1));
    t->Record(i, Phase::kBackward, 0.001 * (i + 1));
  }
  JobTelemetryCollector c;
  c.Track("job-000004", t);
  const std::vector<prometheus::MetricFamily> families = c.Collect();
  const prometheus::MetricFamily* layers = nullptr;
  for (const auto& f : families) {
    if (f.name == "tandem_layer_step_seconds") layers = &f;
  }
  ASSERT_NE(layers, nullptr);
  std::set<std::string> kept;
  uint64_t other_forward = 0;
  double other_forward_sum = 0;
  for (const prometheus::ClientMetric& m : layers->metric) {
    std::string layer, phase;
    for (const auto& l : m.label) {
      if (l.name == "layer") layer = l.value;
      if (l.name == "phase") phase = l.value;
    }
    if (layer == kOtherLayersLabel) {
      if (phase == "forward") {
        other_forward = m.histogram.sample_count;
        other_forward_sum = m.histogram.sample_sum;
        EXPECT_EQ(m.histogram.bucket.back().cumulative_count, 37u);
      }
      continue;
    }
    kept.insert(layer);
  }
  EXPECT_EQ(kept.size(), kMaxLayerSeriesPerJob - 1);
  EXPECT_EQ(kept.count("layer99"), 1u);
  EXPECT_EQ(kept.count("layer37"), 1u);
  EXPECT_EQ(kept.count("layer36"), 0u);
  // Layers 0..36, one forward each: 1 + 2 + ... + 37 ms.
  EXPECT_EQ(other_forward, 37u);
  EXPECT_NEAR(other_forward_sum, 0.001 * 37 * 38 / 2, 1e-9);
  // The choice is kept for the job's life: a merged layer that becomes the
  // slowest stays merged, so no series loses history between scrapes.
  t->Record(0, Phase::kForward, 10.0);
  const std::string text = Text(c);
  EXPECT_EQ(text.find("layer=\"layer0\""), std::string::npos);
  EXPECT_NE(text.find("layer=\"layer37\""), std::string::npos);
  EXPECT_NE(text.find("tandem_layer_step_seconds_count{job_id=\"job-000004\",layer=\"other "
                      "layers\",phase=\"forward\"} 38"),
            std::string::npos)
      << text;
}

// Layer names are the model's: a repeated one (or one named like the merged
// series) takes its chain index as a suffix, since a repeated label set makes
// Prometheus drop the whole scrape.
TEST(JobTelemetryCollectorTest, RepeatedLayerNamesGetDistinctSeries) {
  auto t = std::make_shared<profile::JobTelemetry>(std::vector<std::string>{"same", "same"});
  t->Record(0, Phase::kForward, 0.001);
  t->Record(1, Phase::kForward, 0.001);
  JobTelemetryCollector c;
  c.Track("job-000005", t);
  const std::string text = Text(c);
  EXPECT_NE(text.find("layer=\"same\",phase=\"forward\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("layer=\"same#1\",phase=\"forward\"} 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace tandem::metrics
