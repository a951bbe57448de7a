// The jobs' telemetry as Prometheus families: names, labels and values from
// what the runner recorded, bounded label values, and a job's series gone once
// it is forgotten.
#include "server/metrics/job_telemetry_collector.h"

#include <string>

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
        "tandem_pinned_host_memory_bytes gauge"}) {
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

}  // namespace
}  // namespace tandem::metrics
