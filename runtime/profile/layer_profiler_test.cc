// Layer-by-layer profiles of small gpt and cnn models on the CPU and on a fake
// accelerator: every layer present with every phase it has, analytic figures
// from the layers, and measured memory that is what the layers wrote: checked
// against bytes worked out by hand for concrete layers, and against a probe
// layer that writes less, or more, than it declares.
#include "runtime/profile/layer_profiler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/cpu/onednn.h"
#include "runtime/exec/profiled_iteration.h"
#include "runtime/layers/layer.h"
#include "runtime/layers/loss.h"
#include "runtime/model/model.h"
#include "runtime/profile/cpu_device.h"
#include "runtime/profile/cpu_peaks.h"
#include "runtime/profile/testing/fakes.h"
#include "runtime/train/job_model.h"
#include "spec/precision.h"

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
  o.run_iteration = RunProfiledIteration;
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
    // The batch-independent workspace counts with the staging, the rest
    // scales with the batch.
    const int64_t fixed = FixedWorkspaceBytes(layer, 8);
    EXPECT_EQ(lp.analytic_memory().workspace_bytes(), layer.WorkspaceBytes(8) - fixed);
    EXPECT_EQ(lp.analytic_memory().staging_bytes(), fixed);
    EXPECT_EQ(lp.input_shape(0), 8);
    EXPECT_EQ(lp.output_shape(0), 8);
    EXPECT_EQ(lp.devices_size(), 0);
  }
  EXPECT_EQ(p.layers(0).kind(), "conv2d");
  EXPECT_EQ(p.layers(p.layers_size() - 1).kind(), "cross_entropy");
}

// A bf16 model is counted as the executor holds it on an accelerator
// (StateBytesOf): bf16 weights and gradients, fp32 master weights with the
// state, and the fp32 staging of a call in the workspace; activations are the
// bf16 layers' own (outputs fp32, and what they save for backward, which for a
// transformer block is less than in fp32: its products' inputs in bf16).
TEST(AnalyticProfileTest, Bf16ModelCountsWorkingCopiesAndMasterWeights) {
  const Job job = Load(kSmallGpt);
  absl::StatusOr<JobModel> bf16 = BuildJobModel(job.resolved, nullptr, DType::kBF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const Model& model = *bf16->model;
  const tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 4);
  const tandem::v1::Profile f = AnalyticProfile(*job.model.model, job.resolved.optimizer(), 4);
  EXPECT_EQ(p.precision(), tandem::v1::PRECISION_BF16);
  EXPECT_NE(f.precision(), tandem::v1::PRECISION_BF16);
  for (int l = 0; l < model.num_layers(); ++l) {
    const int64_t n = model.layer(l).ParamCount();
    const tandem::v1::LayerMemory& m = p.layers(l).analytic_memory();
    EXPECT_EQ(m.parameter_bytes(), 2 * n) << l;
    EXPECT_EQ(m.gradient_bytes(), 2 * n) << l;
    EXPECT_EQ(m.optimizer_state_bytes(), 12 * n) << l;  // AdamW's m and v, the master
    const Layer& layer = model.layer(l);
    const int64_t fixed = FixedWorkspaceBytes(layer, 4);
    EXPECT_EQ(m.workspace_bytes(), layer.WorkspaceBytes(4) - fixed) << l;
    EXPECT_EQ(m.staging_bytes(), 8 * n + fixed) << l;
    const std::string kind = layer.kind();
    if (kind == "linear" || kind == "transformer_block") {
      // Their products' 16-bit weight copies are among the fixed bytes.
      EXPECT_GT(fixed, 0) << l << " " << kind;
    }
    EXPECT_EQ(m.activation_bytes(), layer.OutputBytes(4) + layer.SavedBytes(4)) << l;
    if (kind == "transformer_block") {
      EXPECT_LT(m.activation_bytes(), f.layers(l).analytic_memory().activation_bytes()) << l;
    }
    // Model state per parameter is 16 bytes either way.
    const tandem::v1::LayerMemory& m32 = f.layers(l).analytic_memory();
    EXPECT_EQ(m.parameter_bytes() + m.gradient_bytes() + m.optimizer_state_bytes(),
              m32.parameter_bytes() + m32.gradient_bytes() + m32.optimizer_state_bytes())
        << l;
  }
}

// The bf16 GEMM rate the planner times a bf16 job's products at: measured
// where oneDNN computes bf16 natively, 0 (none) where it would emulate it.
TEST(CpuPeaksTest, Bf16GemmRateIsMeasuredWhereBf16IsNative) {
  GemmOptions gemm;
  gemm.size = 256;
  gemm.repeats = 2;
  absl::StatusOr<double> any = MeasureBf16GemmFlopsPerSecond(gemm);
  if (Bf16ProductsIsa(cpu::OneDnnIsa())) {
    ASSERT_TRUE(any.ok()) << any.status();
    EXPECT_GT(*any, 0);
  } else {
    // avx2: no bf16 products to time, said so rather than thrown.
    EXPECT_EQ(any.status().code(), absl::StatusCode::kFailedPrecondition) << any.status();
  }
  absl::StatusOr<double> native = MeasureNativeBf16GemmFlopsPerSecond(gemm);
  ASSERT_TRUE(native.ok()) << native.status();
  if (NativeBf16Isa(cpu::OneDnnIsa())) {
    EXPECT_GT(*native, 0) << cpu::OneDnnIsa();
  } else {
    EXPECT_EQ(*native, 0) << cpu::OneDnnIsa();
  }
  gemm.size = 0;
  if (Bf16ProductsIsa(cpu::OneDnnIsa())) {
    EXPECT_EQ(MeasureBf16GemmFlopsPerSecond(gemm).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
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
  // On one thread too (the whole rate where one thread is all there is).
  EXPECT_GT(cpu.single_thread_gemm_flops_per_second(), 0);
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
    if (d.has_update()) {
      EXPECT_EQ(d.update().timing().samples(), iterations);
    }
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

    // Measured state: the allocator's accounting. Parameter, gradient and
    // optimizer slices are padded to 16 floats (64 bytes).
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
    // Measured output, activations and workspace: what the layer's calls
    // wrote, against what it declares. Every layer writes its whole output;
    // on the CPU it writes its saved region to the end, short of at most the
    // 64-byte alignment of its last saved tensor; no layer writes past a
    // declaration or uses more workspace than it declares.
    EXPECT_EQ(m.output_bytes(), a.output_bytes()) << layer.name();
    const int64_t saved_written = m.activation_bytes() - m.output_bytes();
    const int64_t saved_declared = layer.SavedBytes(p.batch_size());
    EXPECT_LE(saved_written, saved_declared) << layer.name();
    EXPECT_GT(saved_written, saved_declared - 64) << layer.name();
    EXPECT_LE(m.workspace_bytes(), layer.WorkspaceBytes(p.batch_size())) << layer.name();
    // The scan counters are the same measurement, per phase.
    double workspace_written = 0;
    for (const auto* phase : {&d.forward(), &d.backward()}) {
      for (const tandem::v1::Counter& c : phase->counters()) {
        if (c.name() == "saved_bytes_written") {
          EXPECT_EQ(c.value(), saved_written) << layer.name();
        }
        if (c.name() == "workspace_bytes_written") {
          workspace_written = std::max(workspace_written, c.value());
        }
      }
    }
    EXPECT_EQ(workspace_written, m.workspace_bytes()) << layer.name();
  }
}

// Bytes of a layer's memory worked out by hand from the model's shapes, not
// from the layer's SavedBytes or OutputBytes: what its profile must say, both
// analytically and as measured.
struct ExpectedBytes {
  int index;
  const char* kind;
  int64_t output;
  // Output + saved.
  int64_t activations;
};

void ExpectBytes(const tandem::v1::Profile& p, const std::vector<ExpectedBytes>& expected) {
  for (const ExpectedBytes& e : expected) {
    const tandem::v1::LayerProfile& lp = p.layers(e.index);
    EXPECT_EQ(lp.kind(), e.kind) << lp.name();
    EXPECT_EQ(lp.analytic_memory().output_bytes(), e.output) << lp.name();
    EXPECT_EQ(lp.analytic_memory().activation_bytes(), e.activations) << lp.name();
    ASSERT_EQ(lp.devices_size(), 1) << lp.name();
    EXPECT_EQ(lp.devices(0).measured_memory().output_bytes(), e.output) << lp.name();
    EXPECT_EQ(lp.devices(0).measured_memory().activation_bytes(), e.activations) << lp.name();
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
  // B = 4 sequences of T = 16 tokens, C = 32, 2 heads, vocabulary 50: a
  // [B, T, C] tensor is 4 * 16 * 32 floats = 8192 bytes, every region below a
  // multiple of 64 bytes.
  ExpectBytes(p, {
                     // The token and position sum; nothing saved.
                     {0, "embedding", 8192, 8192},
                     // Saved: ln1 out 8192, ln1 mean and variance per row 2 * 64 * 4 = 512,
                     // attention q, k, v and the projection's input 4 * 8192 and its
                     // probabilities [B, H, T, T] 4 * 2 * 16 * 16 * 4 = 8192, the first
                     // residual 8192, ln2 out 8192 and statistics 512, fc1 and gelu outs
                     // [B, T, 4C] 2 * 32768: 132096.
                     {1, "transformer_block", 8192, 8192 + 132096},
                     {2, "transformer_block", 8192, 8192 + 132096},
                     // Mean and variance of 64 rows.
                     {3, "layer_norm", 8192, 8192 + 512},
                     // Logits [B, T, 50]; a linear layer saves nothing (backward
                     // reads x and y).
                     {4, "linear", 12800, 12800},
                     // Per-sequence loss [B, 1]; saved: the log-softmax, as big as the
                     // logits.
                     {5, "cross_entropy", 16, 16 + 12800},
                 });
  EXPECT_EQ(iteration.timeline.spans_size(), 2 * model.num_layers() + 1);
  EXPECT_EQ(iteration.peak_bytes, p.devices(0).iteration_peak_bytes());
  EXPECT_EQ(progress.front(), "cpu: layer 1 of " + std::to_string(model.num_layers()) + " (" +
                                  model.layer(0).name() + ")");
}

// A caller that has gone stops the measurement at its next call: CANCELLED,
// saying where, and no layer after it is measured.
TEST(MeasureOnDeviceTest, AStopEndsItAtTheNextCall) {
  const Job job = Load(kSmallGpt);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 4);
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(SmallPeaks());
  LayerProfilerOptions options = Quick();
  int layers_started = 0;
  options.on_progress = [&](const std::string&) { ++layers_started; };
  options.stop = [&] { return layers_started == 2; };
  const absl::Status s = MeasureOnDevice(model, job.resolved.optimizer(), 4, options, *cpu, &p);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  // Layer 1 (the second) was being measured when the stop came.
  EXPECT_NE(s.message().find("cpu: layer 1 ("), std::string::npos) << s;
  EXPECT_NE(s.message().find("stopped between calls"), std::string::npos) << s;
  EXPECT_EQ(layers_started, 2);
  EXPECT_EQ(p.layers(2).devices_size(), 0);
}

TEST(MeasureOnDeviceTest, SmallCnnOnTheCpuHasEveryLayer) {
  const Job job = Load(kSmallCnn);
  const Model& model = *job.model.model;
  tandem::v1::Profile p = AnalyticProfile(model, job.resolved.optimizer(), 8);
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(SmallPeaks());
  ASSERT_TRUE(MeasureOnDevice(model, job.resolved.optimizer(), 8, Quick(), *cpu, &p).ok());
  ExpectCompleteCpuProfile(model, p, 3);
  // B = 8 images of 12 x 12 x 1; 5 x 5 convolutions padded to keep the size,
  // 2 x 2 max pooling.
  ExpectBytes(p, {
                     // [B, 12, 12, 4]; a convolution saves nothing.
                     {0, "conv2d", 8 * 12 * 12 * 4 * 4, 8 * 12 * 12 * 4 * 4},
                     // [B, 6, 6, 4], and the argmax oneDNN keeps for backward: a byte
                     // per output element (its windows have under 256 positions).
                     {2, "max_pool2d", 4608, 4608 + 1152},
                     {3, "conv2d", 8 * 6 * 6 * 8 * 4, 8 * 6 * 6 * 8 * 4},
                     {5, "max_pool2d", 2304, 2304 + 576},
                     // 72 -> 16, then 16 -> 10.
                     {7, "linear", 8 * 16 * 4, 8 * 16 * 4},
                     {9, "linear", 8 * 10 * 4, 8 * 10 * 4},
                     {10, "cross_entropy", 8 * 4, 8 * 4 + 8 * 10 * 4},
                 });
  // linear9's 16 * 10 + 10 = 170 parameters take 176 floats in the model's
  // 64-byte-aligned layout: the report's "+24 B".
  EXPECT_EQ(p.layers(9).analytic_memory().parameter_bytes(), 680);
  EXPECT_EQ(p.layers(9).devices(0).measured_memory().parameter_bytes(), 704);
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

// A layer that declares one size for its saved and workspace regions and
// writes another, so a measurement that repeats the declaration shows.
struct ProbeBytes {
  int64_t saved_declared = 0, saved_written = 0;
  int64_t workspace_declared = 0, workspace_forward = 0, workspace_backward = 0;
};

class ProbeLayer final : public Layer {
 public:
  explicit ProbeLayer(ProbeBytes bytes) : bytes_(bytes) {}
  const char* kind() const override { return "probe"; }
  LayerCost Cost(int64_t batch) const override { return {}; }
  int64_t SavedBytes(int64_t batch) const override { return bytes_.saved_declared; }
  int64_t WorkspaceBytes(int64_t batch) const override { return bytes_.workspace_declared; }
  void Forward(const LayerContext& ctx, const Tensor& x, const Tensor& y,
               void* saved) const override {
    std::memcpy(y.data, x.data, x.bytes());
    Write(saved, bytes_.saved_written);
    Write(ctx.workspace, bytes_.workspace_forward);
  }
  void Backward(const LayerContext& ctx, const Tensor& x, const Tensor& y, const void* saved,
                const Tensor& dy, const Tensor& dx) const override {
    if (dx.data != nullptr) std::memcpy(dx.data, dy.data, dy.bytes());
    Write(ctx.workspace, bytes_.workspace_backward);
  }

 protected:
  absl::StatusOr<Shape> InferOutput(const Shape& input) override { return input; }

 private:
  static void Write(void* region, int64_t bytes) {
    std::vector<float> ones(bytes / 4, 1.0f);
    if (bytes > 0) std::memcpy(region, ones.data(), bytes);
  }

  const ProbeBytes bytes_;
};

// Profiles probe -> loss at batch 2 on the fake accelerator, with no whole
// iteration, so a probe writing past its declaration touches only the
// profiler's guarded regions.
tandem::v1::Profile ProfileProbe(const ProbeBytes& bytes) {
  std::vector<std::unique_ptr<Layer>> layers;
  layers.push_back(std::make_unique<ProbeLayer>(bytes));
  layers.push_back(std::make_unique<CrossEntropy>());
  DataInfo data;
  data.sample_shape = Shape({4});
  data.num_classes = 4;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::FromLayers(std::move(layers), data);
  EXPECT_TRUE(model.ok()) << model.status();
  tandem::v1::OptimizerSpec sgd;
  sgd.set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  tandem::v1::Profile p = AnalyticProfile(**model, sgd, 2);
  testing::FakeAccelerator device;
  LayerProfilerOptions options = Quick();
  options.run_iteration = nullptr;
  const absl::Status s = MeasureOnDevice(**model, sgd, 2, options, device, &p);
  EXPECT_TRUE(s.ok()) << s;
  return p;
}

double ScanCounter(const tandem::v1::PhaseProfile& phase, const std::string& name) {
  for (const tandem::v1::Counter& c : phase.counters()) {
    if (c.name() == name) return c.value();
  }
  return -1;
}

TEST(MeasureOnDeviceTest, MeasuredBytesAreWhatALayerWroteNotWhatItDeclares) {
  const tandem::v1::Profile p = ProfileProbe({.saved_declared = 320,
                                              .saved_written = 256,
                                              .workspace_declared = 512,
                                              .workspace_forward = 128,
                                              .workspace_backward = 256});
  ASSERT_EQ(p.layers_size(), 2);
  const tandem::v1::LayerMemory& a = p.layers(0).analytic_memory();
  ASSERT_EQ(p.layers(0).devices_size(), 1);
  const tandem::v1::LayerDeviceProfile& d = p.layers(0).devices(0);
  const tandem::v1::LayerMemory& m = d.measured_memory();
  // The output: 2 samples of 4 floats, all written.
  EXPECT_EQ(a.output_bytes(), 32);
  EXPECT_EQ(m.output_bytes(), 32);
  // Declared: output + 320 saved; written: output + 256.
  EXPECT_EQ(a.activation_bytes(), 32 + 320);
  EXPECT_EQ(m.activation_bytes(), 32 + 256);
  // Declared 512 at every batch (so all of it fixed, with the staging);
  // forward used 128, backward 256.
  EXPECT_EQ(a.workspace_bytes(), 0);
  EXPECT_EQ(a.staging_bytes(), 512);
  EXPECT_EQ(m.workspace_bytes(), 256);
  EXPECT_EQ(ScanCounter(d.forward(), "saved_bytes_written"), 256);
  EXPECT_EQ(ScanCounter(d.forward(), "workspace_bytes_written"), 128);
  EXPECT_EQ(ScanCounter(d.backward(), "workspace_bytes_written"), 256);
}

TEST(MeasureOnDeviceTest, ALayerWritingPastItsDeclarationMeasuresMore) {
  const tandem::v1::Profile p = ProfileProbe({.saved_declared = 128,
                                              .saved_written = 192,
                                              .workspace_declared = 0,
                                              .workspace_forward = 0,
                                              .workspace_backward = 64});
  const tandem::v1::LayerMemory& a = p.layers(0).analytic_memory();
  const tandem::v1::LayerDeviceProfile& d = p.layers(0).devices(0);
  EXPECT_EQ(a.activation_bytes(), 32 + 128);
  EXPECT_EQ(d.measured_memory().activation_bytes(), 32 + 192);
  EXPECT_EQ(a.workspace_bytes(), 0);
  EXPECT_EQ(d.measured_memory().workspace_bytes(), 64);
  // A region declared empty but written still gets its scan counter; one
  // declared empty and left alone does not.
  EXPECT_EQ(ScanCounter(d.backward(), "workspace_bytes_written"), 64);
  EXPECT_EQ(ScanCounter(d.forward(), "workspace_bytes_written"), -1);
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
