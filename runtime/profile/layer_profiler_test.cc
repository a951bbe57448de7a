// Layer-by-layer profiles of small gpt and cnn models on the CPU and on a fake
// accelerator: every layer present with every phase it has, analytic figures
// from the layers, measured memory agreeing with them up to slice padding.
#include "runtime/profile/layer_profiler.h"

#include <cmath>

#include "gtest/gtest.h"
#include "runtime/profile/cpu_device.h"
#include "runtime/profile/testing/fakes.h"
#include "runtime/train/job_spec.h"

namespace tandem::profile {
namespace {

struct Job {
  tandem::v1::JobSpec resolved;
  JobModel model;
};

Job Load(const std::string& yaml) {
  Job job;
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(*spec, false);
  EXPECT_TRUE(resolved.ok()) << resolved.status();
  job.resolved = *resolved;
  absl::StatusOr<JobModel> model = BuildJobModel(job.resolved);
  EXPECT_TRUE(model.ok()) << model.status();
  job.model = std::move(*model);
  return job;
}

constexpr char kSmallGpt[] = R"(
model: {gpt: {n_layer: 2, n_head: 2, d_model: 32, context: 16}}
data: {synthetic: {sample_shape: [16], num_classes: 50, tokens: true}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW}
training: {batch_size: 4, steps: 1})";

constexpr char kSmallCnn[] = R"(
model: {cnn: {conv1_channels: 4, conv2_channels: 8, hidden_size: 16}}
data: {synthetic: {sample_shape: [12, 12, 1], num_classes: 10}}
training: {batch_size: 8, steps: 1})";

CpuDeviceOptions SmallPeaks() {
  CpuDeviceOptions o;
  o.triad.elements = 1 << 16;
  o.triad.repeats = 1;
  o.gemm.size = 64;
  o.gemm.repeats = 1;
  return o;
}

LayerProfilerOptions Quick() {
  LayerProfilerOptions o;
  o.iterations = 3;
  o.warmup = 1;
  return o;
}

TEST(AnalyticProfileTest, TakesEveryFigureFromTheLayers) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  const tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  EXPECT_EQ(p.model_fingerprint(), model.fingerprint());
  EXPECT_EQ(p.batch_size(), 8);
  EXPECT_EQ(p.sample_shape_size(), 3);
  EXPECT_EQ(p.optimizer_state_per_parameter(), 2);  // Adam's m and v.
  EXPECT_EQ(p.provenance().source(), "analytic");
  EXPECT_EQ(p.devices_size(), 0);
  ASSERT_EQ(p.layers_size(), model.num_layers());
  for (int l = 0; l < model.num_layers(); ++l) {
    const Layer& layer = model.layer(l);
    const tandem::v1::LayerProfile& lp = p.layers(l);
    EXPECT_EQ(lp.index(), l);
    EXPECT_EQ(lp.name(), layer.name());
    EXPECT_EQ(lp.kind(), layer.kind());
    EXPECT_EQ(lp.parameter_count(), layer.ParamCount());
    EXPECT_EQ(lp.forward_flops(), layer.Cost(8).forward_flops);
    EXPECT_EQ(lp.backward_memory_bytes(), layer.Cost(8).backward_bytes);
    EXPECT_EQ(lp.analytic_memory().optimizer_state_bytes(), 8 * layer.ParamCount());
    EXPECT_EQ(lp.analytic_memory().activation_bytes(), layer.OutputBytes(8) + layer.SavedBytes(8));
    EXPECT_EQ(lp.analytic_memory().workspace_bytes(), layer.WorkspaceBytes(8));
    EXPECT_EQ(lp.input_shape(0), 8);
    EXPECT_EQ(lp.output_shape(0), 8);
    EXPECT_EQ(lp.devices_size(), 0);
  }
  EXPECT_EQ(p.layers(0).kind(), "conv2d");
  EXPECT_EQ(p.layers(p.layers_size() - 1).kind(), "cross_entropy");
}

TEST(AnalyticProfileTest, SgdWithoutMomentumHasNoOptimizerState) {
  Job job = Load(kSmallCnn);
  tandem::v1::OptimizerSpec sgd;
  sgd.set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  const tandem::v1::Profile p = AnalyticProfile(*job.model.model, sgd, 8);
  EXPECT_EQ(p.optimizer_state_per_parameter(), 0);
  EXPECT_EQ(p.layers(0).analytic_memory().optimizer_state_bytes(), 0);
}

// What a measured layer on the CPU must show, for any model.
void ExpectCompleteCpuProfile(const Model& model, const tandem::v1::Profile& p, int iterations) {
  ASSERT_EQ(p.devices_size(), 1);
  const tandem::v1::DeviceProfile& cpu = p.devices(0);
  EXPECT_EQ(cpu.id(), "cpu");
  EXPECT_EQ(cpu.kind(), tandem::v1::DEVICE_KIND_CPU);
  EXPECT_GT(cpu.gemm_flops_per_second(), 0);
  EXPECT_GT(cpu.memory_bandwidth_bytes_per_second(), 0);
  EXPECT_GT(cpu.iteration_peak_bytes(), 0);
  EXPECT_FALSE(cpu.counter_note().empty());
  for (int l = 0; l < model.num_layers(); ++l) {
    const Layer& layer = model.layer(l);
    const tandem::v1::LayerProfile& lp = p.layers(l);
    ASSERT_EQ(lp.devices_size(), 1) << layer.name();
    const tandem::v1::LayerDeviceProfile& d = lp.devices(0);
    EXPECT_EQ(d.device_id(), "cpu");
    EXPECT_EQ(d.forward().timing().samples(), iterations) << layer.name();
    EXPECT_EQ(d.backward().timing().samples(), iterations) << layer.name();
    EXPECT_GT(d.forward().timing().median_seconds(), 0) << layer.name();
    EXPECT_LE(d.forward().timing().min_seconds(), d.forward().timing().median_seconds());
    EXPECT_LE(d.forward().timing().median_seconds(), d.forward().timing().max_seconds());
    // Only layers with parameters have an update; the others show none, not zero.
    EXPECT_EQ(d.has_update(), layer.ParamCount() > 0) << layer.name();
    if (d.has_update()) EXPECT_EQ(d.update().timing().samples(), iterations);
    // Counters carry their source; a source that counted nothing adds none.
    for (const tandem::v1::Counter& c : d.forward().counters()) {
      if (c.source() == tandem::v1::COUNTER_SOURCE_MEMORY_SCAN) continue;
      EXPECT_EQ(c.source(), cpu.counter_source()) << c.name();
    }
    if (cpu.counter_source() == tandem::v1::COUNTER_SOURCE_UNSPECIFIED) {
      for (const tandem::v1::Counter& c : d.forward().counters()) {
        EXPECT_EQ(c.source(), tandem::v1::COUNTER_SOURCE_MEMORY_SCAN);
      }
    }

    // Measured memory: the allocator's accounting. Parameter, gradient and
    // optimizer slices are padded to 16 floats (64 bytes); the rest is exact.
    const tandem::v1::LayerMemory& a = lp.analytic_memory();
    const tandem::v1::LayerMemory& m = d.measured_memory();
    const int64_t padded =
        AlignElements(layer.ParamCount()) * 4 + AlignElements(layer.BufferCount()) * 4;
    EXPECT_EQ(m.parameter_bytes(), padded) << layer.name();
    EXPECT_EQ(m.parameter_bytes() - a.parameter_bytes(), padded - layer.ParamCount() * 4)
        << layer.name();
    EXPECT_EQ(m.gradient_bytes(), AlignElements(layer.ParamCount()) * 4) << layer.name();
    EXPECT_EQ(m.optimizer_state_bytes(),
              p.optimizer_state_per_parameter() * AlignElements(layer.ParamCount()) * 4);
    EXPECT_EQ(m.activation_bytes(), a.activation_bytes()) << layer.name();
    EXPECT_EQ(m.workspace_bytes(), a.workspace_bytes()) << layer.name();
    EXPECT_EQ(m.output_bytes(), a.output_bytes()) << layer.name();
    // The scan never finds more written than declared.
    for (const auto* phase : {&d.forward(), &d.backward()}) {
      for (const tandem::v1::Counter& c : phase->counters()) {
        if (c.name() == "saved_bytes_written") {
          EXPECT_LE(c.value(), layer.SavedBytes(p.batch_size())) << layer.name();
        }
        if (c.name() == "workspace_bytes_written") {
          EXPECT_LE(c.value(), layer.WorkspaceBytes(p.batch_size())) << layer.name();
        }
      }
    }
  }
}

TEST(MeasureOnDeviceTest, SmallGptOnTheCpuHasEveryLayer) {
  const Job job = Load(kSmallGpt);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 4);
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(SmallPeaks());
  IterationRecord iteration;
  std::vector<std::string> progress;
  LayerProfilerOptions options = Quick();
  options.on_progress = [&](const std::string& line) { progress.push_back(line); };
  ASSERT_TRUE(
      MeasureOnDevice(model, job.resolved.optimizer(), 4, options, *cpu, &p, &iteration).ok());
  ExpectCompleteCpuProfile(model, p, 3);
  EXPECT_EQ(p.layers(0).kind(), "embedding");
  EXPECT_EQ(p.layers(1).kind(), "transformer_block");
  EXPECT_EQ(iteration.timeline.spans_size(), 2 * model.num_layers() + 1);
  EXPECT_EQ(iteration.peak_bytes, p.devices(0).iteration_peak_bytes());
  EXPECT_EQ(progress.front(), "cpu: layer 1 of " + std::to_string(model.num_layers()) + " (" +
                                  model.layer(0).name() + ")");
}

TEST(MeasureOnDeviceTest, SmallCnnOnTheCpuHasEveryLayer) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(SmallPeaks());
  ASSERT_TRUE(MeasureOnDevice(model, job.resolved.optimizer(), 8, Quick(), *cpu, &p).ok());
  ExpectCompleteCpuProfile(model, p, 3);
  // A convolution writes its saved state and uses its workspace (weight
  // reorders) in backward; the scan sees it.
  const tandem::v1::LayerDeviceProfile& conv = p.layers(0).devices(0);
  bool scanned = false;
  for (const tandem::v1::Counter& c : conv.backward().counters()) {
    if (c.name() == "workspace_bytes_written") {
      scanned = true;
      EXPECT_GT(c.value(), 0);
    }
  }
  EXPECT_TRUE(scanned);
}

// Counters from the device land in the phase, as medians of per-call deltas.
TEST(MeasureOnDeviceTest, CountersAreMediansPerCallWithTheirSource) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  auto counters = std::make_unique<testing::FakeCounterSource>(
      std::vector<CounterInfo>{{"task_clock", "seconds", tandem::v1::COUNTER_SOURCE_SOFTWARE},
                               {"page_faults", "events", tandem::v1::COUNTER_SOURCE_SOFTWARE}},
      tandem::v1::COUNTER_SOURCE_SOFTWARE, "hardware events refused: fake",
      std::vector<double>{0.5, 7});
  CpuProfiledDevice cpu(std::move(counters), SmallPeaks());
  ASSERT_TRUE(MeasureOnDevice(model, job.resolved.optimizer(), 8, Quick(), cpu, &p).ok());
  EXPECT_EQ(p.devices(0).counter_source(), tandem::v1::COUNTER_SOURCE_SOFTWARE);
  EXPECT_EQ(p.devices(0).counter_note(), "hardware events refused: fake");
  for (const tandem::v1::LayerProfile& layer : p.layers()) {
    int found = 0;
    for (const tandem::v1::Counter& c : layer.devices(0).forward().counters()) {
      if (c.name() == "task_clock") {
        EXPECT_DOUBLE_EQ(c.value(), 0.5);
        EXPECT_EQ(c.unit(), "seconds");
        ++found;
      }
      if (c.name() == "page_faults") {
        EXPECT_DOUBLE_EQ(c.value(), 7);
        EXPECT_EQ(c.source(), tandem::v1::COUNTER_SOURCE_SOFTWARE);
        ++found;
      }
    }
    EXPECT_EQ(found, 2) << layer.name();
    EXPECT_GT(layer.devices(0).forward().timing().thread_cpu_seconds(), 0);
  }
}

// The fake accelerator's count of timed calls of a phase.
double Calls(const tandem::v1::PhaseProfile& phase) {
  for (const tandem::v1::Counter& c : phase.counters()) {
    if (c.name() == "calls") return c.value();
  }
  return -1;
}

TEST(MeasureOnDeviceTest, AnAcceleratorGetsEveryPhaseBracketed) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  testing::FakeAccelerator device;
  ASSERT_TRUE(MeasureOnDevice(model, job.resolved.optimizer(), 8, Quick(), device, &p).ok());
  EXPECT_EQ(device.mismatched_brackets(), 0);
  int updates = 0;
  for (const tandem::v1::LayerProfile& layer : p.layers()) {
    ASSERT_EQ(layer.devices_size(), 1);
    const tandem::v1::LayerDeviceProfile& d = layer.devices(0);
    EXPECT_EQ(d.device_id(), "emulated:0");
    // Warm-up calls are bracketed but not counted.
    EXPECT_EQ(Calls(d.forward()), 3) << layer.name();
    EXPECT_EQ(Calls(d.backward()), 3) << layer.name();
    if (d.has_update()) {
      ++updates;
      EXPECT_EQ(Calls(d.update()), 3) << layer.name();
    }
  }
  EXPECT_EQ(updates, 4);  // conv, conv, linear, linear.
  EXPECT_EQ(device.begun(), (1 + 3) * (2 * model.num_layers() + updates));
  // Caches are evicted before every update call, and only then.
  EXPECT_EQ(device.evictions(), (1 + 3) * updates);
  EXPECT_EQ(p.devices(0).kind(), tandem::v1::DEVICE_KIND_EMULATED);
}

TEST(MeasureOnDeviceTest, ALayerThatDoesNotFitFailsNamingIt) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  testing::FakeAccelerator device;
  device.set_budget_bytes(1024);
  const absl::Status s = MeasureOnDevice(model, job.resolved.optimizer(), 8, Quick(), device, &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("emulated:0: layer 0 (conv2d0)"), std::string::npos) << s;
}

TEST(MeasureOnDeviceTest, ACopyFaultIsAnError) {
  const Job job = Load(kSmallCnn);
  tandem::v1::Profile p = AnalyticProfile(*job.model.model, job.resolved.optimizer(), 8);
  testing::FakeAccelerator device;
  device.set_fail_copies(true);
  const absl::Status s =
      MeasureOnDevice(*job.model.model, job.resolved.optimizer(), 8, Quick(), device, &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("copy engine fault"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem::profile
