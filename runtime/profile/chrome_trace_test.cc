// Chrome trace JSON: parsed back with protobuf's JSON parser (a strict one),
// with every field Perfetto and chrome://tracing need, from a hand-made
// timeline and from a measured CPU iteration written to a file.
#include "runtime/profile/chrome_trace.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "runtime/exec/profiled_iteration.h"
#include "runtime/profile/cpu_device.h"
#include "runtime/train/job_model.h"

namespace tandem::profile {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

Struct Parse(const std::string& json) {
  Struct root;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &root);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return root;
}

const google::protobuf::ListValue& Events(const Struct& root) {
  return root.fields().at("traceEvents").list_value();
}

bool IsNumber(const Struct& e, const std::string& field) {
  auto it = e.fields().find(field);
  return it != e.fields().end() && it->second.kind_case() == Value::kNumberValue;
}

std::string Str(const Struct& e, const std::string& field) {
  auto it = e.fields().find(field);
  return it == e.fields().end() ? "" : it->second.string_value();
}

// Checks what every viewer needs; returns the complete ("X") events.
std::vector<Struct> CheckTrace(const std::string& json) {
  const Struct root = Parse(json);
  EXPECT_TRUE(root.fields().count("traceEvents"));
  std::vector<Struct> complete;
  std::set<std::pair<int, int>> named_threads;
  std::set<int> named_processes;
  for (const Value& v : Events(root).values()) {
    EXPECT_EQ(v.kind_case(), Value::kStructValue);
    const Struct& e = v.struct_value();
    const std::string ph = Str(e, "ph");
    EXPECT_FALSE(Str(e, "name").empty());
    EXPECT_TRUE(IsNumber(e, "pid"));
    if (ph == "X") {
      EXPECT_TRUE(IsNumber(e, "ts")) << Str(e, "name");
      EXPECT_TRUE(IsNumber(e, "dur")) << Str(e, "name");
      EXPECT_TRUE(IsNumber(e, "tid")) << Str(e, "name");
      EXPECT_GE(e.fields().at("dur").number_value(), 0);
      EXPECT_FALSE(Str(e, "cat").empty());
      complete.push_back(e);
    } else if (ph == "M") {
      const int pid = static_cast<int>(e.fields().at("pid").number_value());
      const int tid = static_cast<int>(e.fields().at("tid").number_value());
      if (Str(e, "name") == "thread_name") named_threads.insert({pid, tid});
      if (Str(e, "name") == "process_name") named_processes.insert(pid);
    } else {
      EXPECT_EQ(ph, "C");
      EXPECT_TRUE(IsNumber(e, "ts"));
    }
  }
  for (const Struct& e : complete) {
    const int pid = static_cast<int>(e.fields().at("pid").number_value());
    const int tid = static_cast<int>(e.fields().at("tid").number_value());
    EXPECT_TRUE(named_threads.count({pid, tid})) << Str(e, "name");
    EXPECT_TRUE(named_processes.count(pid)) << Str(e, "name");
  }
  return complete;
}

tandem::v1::TimelineSpan* AddSpan(tandem::v1::Timeline* t, tandem::v1::TimelineResource r, int lane,
                                  int layer, tandem::v1::TimelinePhase phase, double start,
                                  double end) {
  tandem::v1::TimelineSpan* s = t->add_spans();
  s->set_resource(r);
  s->set_lane(lane);
  s->set_layer(layer);
  s->set_phase(phase);
  s->set_start_seconds(start);
  s->set_end_seconds(end);
  return s;
}

TEST(ChromeTraceTest, OneTrackPerDeviceStreamAndWorker) {
  tandem::v1::Timeline t;
  t.set_source("simulated");
  t.set_iteration_seconds(0.01);
  AddSpan(&t, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, 0, 0,
          tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.001);
  AddSpan(&t, tandem::v1::TIMELINE_RESOURCE_COPY_D2H, 0, 1, tandem::v1::TIMELINE_PHASE_GRADIENT_D2H,
          0.002, 0.0025)
      ->set_bytes(4096);
  AddSpan(&t, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, 0, 1, tandem::v1::TIMELINE_PHASE_UPDATE,
          0.003, 0.004);
  AddSpan(&t, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, 1, 0, tandem::v1::TIMELINE_PHASE_UPDATE,
          0.003, 0.005);
  tandem::v1::MemorySample* m = t.add_accelerator_memory();
  m->set_time_seconds(0.001);
  m->set_bytes(1 << 20);
  ChromeTraceOptions options;
  options.layer_names = {"embed \"tok\"", "block0"};
  options.accelerator_id = "cuda:0";
  const std::vector<Struct> events = CheckTrace(TimelineToChromeTrace(t, options));
  ASSERT_EQ(events.size(), 4u);
  // Names carry the layer (escaped) and the phase; times are microseconds.
  EXPECT_EQ(Str(events[0], "name"), "embed \"tok\" forward");
  EXPECT_EQ(Str(events[0], "cat"), "forward");
  EXPECT_DOUBLE_EQ(events[0].fields().at("dur").number_value(), 1000);
  EXPECT_DOUBLE_EQ(events[1].fields().at("ts").number_value(), 2000);
  EXPECT_EQ(events[1].fields().at("args").struct_value().fields().at("bytes").number_value(), 4096);
  // The accelerator and the host are separate processes; each worker its own thread.
  EXPECT_NE(events[0].fields().at("pid").number_value(),
            events[2].fields().at("pid").number_value());
  EXPECT_NE(events[2].fields().at("tid").number_value(),
            events[3].fields().at("tid").number_value());
  EXPECT_NE(events[0].fields().at("tid").number_value(),
            events[1].fields().at("tid").number_value());
}

// 64 pipeline stages: every stage's compute stream and copy engines are
// tracks of their own (stage 50's compute stream once shared stage 0's copy
// H2D track).
TEST(ChromeTraceTest, SixtyFourStagesHaveDistinctTracks) {
  tandem::v1::Timeline t;
  t.set_iteration_seconds(0.01);
  for (int lane = 0; lane < 64; ++lane) {
    for (auto r :
         {tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE, tandem::v1::TIMELINE_RESOURCE_COPY_H2D,
          tandem::v1::TIMELINE_RESOURCE_COPY_D2H}) {
      AddSpan(&t, r, lane, 0, tandem::v1::TIMELINE_PHASE_FORWARD, 0, 0.001);
    }
  }
  const std::vector<Struct> events = CheckTrace(TimelineToChromeTrace(t, {}));
  ASSERT_EQ(events.size(), 64u * 3);
  std::set<std::pair<int, int>> tracks;
  for (const Struct& e : events) {
    tracks.insert({static_cast<int>(e.fields().at("pid").number_value()),
                   static_cast<int>(e.fields().at("tid").number_value())});
  }
  EXPECT_EQ(tracks.size(), 64u * 3);
}

TEST(ChromeTraceTest, EmptyTimelineIsStillAValidTrace) {
  EXPECT_TRUE(CheckTrace(TimelineToChromeTrace(tandem::v1::Timeline())).empty());
}

// A measured CPU iteration of a small CNN, written to a file as `tandem profile
// --trace_out` does and loaded back.
TEST(ChromeTraceTest, MeasuredCpuIterationFileLoadsAsChromeTrace) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {cnn: {conv1_channels: 4, conv2_channels: 8, hidden_size: 16}}
data: {synthetic: {sample_shape: [12, 12, 1], num_classes: 5}}
training: {batch_size: 8, steps: 1})",
                                                          "cnn.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> job = BuildJobModel(*resolved);
  ASSERT_TRUE(job.ok()) << job.status();
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create();
  absl::StatusOr<IterationRecord> it =
      RunProfiledIteration(*cpu, *job->model, resolved->optimizer(), 8, 1);
  ASSERT_TRUE(it.ok()) << it.status();
  ChromeTraceOptions options;
  for (int l = 0; l < job->model->num_layers(); ++l)
    options.layer_names.push_back(job->model->layer(l).name());

  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir ? dir : "/tmp") + "/iteration.trace.json";
  {
    std::ofstream f(path);
    f << TimelineToChromeTrace(it->timeline, options);
  }
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<Struct> events = CheckTrace(ss.str());
  // Forward and backward of every layer, and the optimizer step.
  const int L = job->model->num_layers();
  ASSERT_EQ(static_cast<int>(events.size()), 2 * L + 1);
  std::map<std::string, int> by_cat;
  double last_end = 0;
  for (const Struct& e : events) {
    ++by_cat[Str(e, "cat")];
    last_end = std::max(last_end,
                        e.fields().at("ts").number_value() + e.fields().at("dur").number_value());
  }
  EXPECT_EQ(by_cat["forward"], L);
  EXPECT_EQ(by_cat["backward"], L);
  EXPECT_EQ(by_cat["update"], 1);
  EXPECT_EQ(Str(events[0], "name"), options.layer_names[0] + " forward");
  EXPECT_EQ(Str(events.back(), "name"), "optimizer update");
  // Spans lie within the iteration.
  EXPECT_LE(last_end, it->timeline.iteration_seconds() * 1e6 + 1);
  EXPECT_GT(it->peak_bytes, 0);
}

}  // namespace
}  // namespace tandem::profile
