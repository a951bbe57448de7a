// The CUDA ProfiledDevice. In every build: how a missing toolkit or device is
// reported, and that the node's devices are then the host alone. On a GPU (the
// rest skips itself here: "no CUDA device"): a small MLP and a small GPT
// profiled through ProfileModel on {cpu, cuda:0}, with every layer's phases,
// GPU counters (or the note saying why there are none), measured bytes as the
// CPU test checks them, four links and positive peaks.
#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"
#include "runtime/profile/cuda_device_factory.h"
#include "runtime/profile/node_devices.h"
#include "runtime/train/job_model.h"
#include "runtime/train/profile_model.h"

namespace tandem::profile {
namespace {

TEST(CreateCudaProfiledDeviceTest, WithoutADeviceIsAFailedPreconditionSayingWhy) {
  std::string why;
  if (!cuda::QueryCudaDevices(&why).empty()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<ProfiledDevice>> d = CreateCudaProfiledDevice(0);
  ASSERT_FALSE(d.ok());
  std::cout << "without a device: " << d.status() << "\n";
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition) << d.status();
  if (cuda::BuiltWithCuda()) {
    // The runtime's own reason, exactly as the device query gives it.
    EXPECT_EQ(d.status().message(), why);
    EXPECT_EQ(why.rfind("no CUDA device", 0), 0u) << why;
  } else {
    EXPECT_EQ(d.status().message(),
              "built without CUDA: this binary was compiled without the CUDA toolkit, so it has "
              "no GPU to profile");
  }
}

TEST(CreateCudaProfiledDeviceTest, ANegativeOrdinalIsInvalidInEveryBuild) {
  absl::StatusOr<std::unique_ptr<ProfiledDevice>> d = CreateCudaProfiledDevice(-1);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  EXPECT_EQ(d.status().message(), "CUDA device ordinal -1 is negative");
}

TEST(OpenNodeProfiledDevicesTest, TheHostFirstAndTheGpuWhenThereIsOne) {
  const NodeProfiledDevices node = OpenNodeProfiledDevices(1);
  const std::vector<ProfiledDevice*> devices = node.devices();
  ASSERT_FALSE(devices.empty());
  EXPECT_EQ(devices[0]->id(), "cpu");
  if (cuda::QueryCudaDevices().empty()) {
    // Nothing found, nothing to explain.
    EXPECT_EQ(devices.size(), 1u);
    EXPECT_TRUE(node.notes.empty());
  } else {
    ASSERT_EQ(devices.size(), 2u) << (node.notes.empty() ? "" : node.notes[0]);
    EXPECT_EQ(devices[1]->id(), "cuda:0");
    EXPECT_EQ(devices[1]->kind(), DeviceKind::kCuda);
    EXPECT_TRUE(devices[1]->has_host_link());
  }
}

constexpr char kMlp[] = R"(
model: {mlp: {hidden_sizes: [64, 32], dropout: 0.1}}
data: {synthetic: {sample_shape: [16], num_classes: 5}}
optimizer: {kind: OPTIMIZER_KIND_ADAM}
training: {batch_size: 32, steps: 1})";

constexpr char kGpt[] = R"(
model: {gpt: {n_layer: 2, n_head: 2, d_model: 32, context: 16}}
data: {synthetic: {sample_shape: [16], num_classes: 50, tokens: true}}
optimizer: {kind: OPTIMIZER_KIND_ADAMW}
training: {batch_size: 4, steps: 1})";

const tandem::v1::Counter* Find(const tandem::v1::PhaseProfile& phase, const std::string& name) {
  for (const tandem::v1::Counter& c : phase.counters()) {
    if (c.name() == name) return &c;
  }
  return nullptr;
}

class CudaProfileTest : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaProfileTest, EveryLayerHasItsPhasesCountersAndBytesOnTheGpu) {
  if (cuda::QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CudaProfiledDeviceOptions small;
  small.gemm_size = 1024;
  small.copy_bytes = int64_t{32} << 20;
  small.peak_repeats = 3;
  absl::StatusOr<std::unique_ptr<ProfiledDevice>> gpu = CreateCudaProfiledDevice(0, small);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ProfilerEnvironment env;
  env.cpu.triad.elements = 1 << 16;
  env.cpu.triad.repeats = 1;
  env.cpu.gemm.size = 64;
  env.cpu.gemm.repeats = 1;
  env.links.sizes_bytes = {4096, 1 << 20};
  env.links.repeats = 3;
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(env.cpu);
  env.devices = {cpu.get(), gpu->get()};

  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(GetParam(), "test.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  tandem::v1::ProfileModelRequest request;
  *request.mutable_spec() = *spec;
  request.set_iterations(3);
  request.set_warmup_iterations(1);
  request.set_include_trace(true);
  absl::StatusOr<ProfileResult> r = ProfileModel(request, env);
  ASSERT_TRUE(r.ok()) << r.status();
  const tandem::v1::Profile& p = r->profile;

  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(*spec, true);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  absl::StatusOr<JobModel> job = BuildJobModel(*resolved);
  ASSERT_TRUE(job.ok()) << job.status();
  const Model& model = *job->model;
  const int64_t batch = p.batch_size();

  ASSERT_EQ(p.devices_size(), 2);
  const tandem::v1::DeviceProfile& d = p.devices(1);
  std::cout << d.name() << ": " << d.counter_note() << "\n"
            << "GEMM " << d.gemm_flops_per_second() / 1e12 << " TFLOP/s, copy "
            << d.memory_bandwidth_bytes_per_second() / 1e9 << " GB/s, iteration peak "
            << d.iteration_peak_bytes() << " bytes, CUPTI overhead "
            << d.profiler_overhead_seconds() << " s, dropped " << d.dropped_records() << "\n";
  EXPECT_EQ(d.id(), "cuda:0");
  EXPECT_EQ(d.kind(), tandem::v1::DEVICE_KIND_CUDA);
  EXPECT_GT(d.threads(), 0);
  EXPECT_GT(d.memory_bytes(), 0);
  EXPECT_GT(d.gemm_flops_per_second(), 0);
  EXPECT_GT(d.memory_bandwidth_bytes_per_second(), 0);
  EXPECT_GT(d.iteration_peak_bytes(), 0);
  EXPECT_NE(d.counter_note().find("TF32 allowed"), std::string::npos) << d.counter_note();
  const bool cupti = d.counter_source() == tandem::v1::COUNTER_SOURCE_CUPTI;
  if (!cupti) {
    // No kernel counts, and the note says why.
    EXPECT_EQ(d.counter_source(), tandem::v1::COUNTER_SOURCE_CUDA_EVENT);
    EXPECT_NE(d.counter_note().find("CUPTI"), std::string::npos) << d.counter_note();
  }
  for (const char* library : {"cuda_runtime", "cuda_driver", "cublas", "cudnn", "cuda_tf32"}) {
    EXPECT_TRUE(p.provenance().versions().count(library)) << library;
  }

  for (int l = 0; l < model.num_layers(); ++l) {
    const Layer& layer = model.layer(l);
    const tandem::v1::LayerProfile& lp = p.layers(l);
    ASSERT_EQ(lp.devices_size(), 2) << layer.name();
    const tandem::v1::LayerDeviceProfile& g = lp.devices(1);
    ASSERT_EQ(g.device_id(), "cuda:0");
    EXPECT_EQ(g.has_update(), layer.ParamCount() > 0) << layer.name();
    std::vector<const tandem::v1::PhaseProfile*> phases = {&g.forward(), &g.backward()};
    if (g.has_update()) phases.push_back(&g.update());
    for (const tandem::v1::PhaseProfile* phase : phases) {
      EXPECT_EQ(phase->timing().samples(), 3) << layer.name();
      EXPECT_GT(phase->timing().median_seconds(), 0) << layer.name();
      const tandem::v1::Counter* events = Find(*phase, "cuda_event_seconds");
      ASSERT_NE(events, nullptr) << layer.name();
      EXPECT_GT(events->value(), 0) << layer.name();
      EXPECT_EQ(events->source(), tandem::v1::COUNTER_SOURCE_CUDA_EVENT);
      const tandem::v1::Counter* kernels = Find(*phase, "kernel_count");
      EXPECT_EQ(kernels != nullptr, cupti) << layer.name();
      if (kernels != nullptr) {
        EXPECT_EQ(kernels->source(), tandem::v1::COUNTER_SOURCE_CUPTI);
      }
    }
    // A layer with parameters runs a GEMM or a kernel of its own in every phase.
    if (cupti && layer.ParamCount() > 0) {
      for (const tandem::v1::PhaseProfile* phase : phases) {
        EXPECT_GE(Find(*phase, "kernel_count")->value(), 1) << layer.name();
      }
    }

    // As on the CPU: the state is the allocator's accounting, slices padded to
    // 16 floats; output, activations and workspace are what the layer wrote.
    const tandem::v1::LayerMemory& a = lp.analytic_memory();
    const tandem::v1::LayerMemory& m = g.measured_memory();
    EXPECT_EQ(m.parameter_bytes(),
              AlignElements(layer.ParamCount()) * 4 + AlignElements(layer.BufferCount()) * 4)
        << layer.name();
    EXPECT_EQ(m.gradient_bytes(), AlignElements(layer.ParamCount()) * 4) << layer.name();
    EXPECT_EQ(m.optimizer_state_bytes(),
              p.optimizer_state_per_parameter() * AlignElements(layer.ParamCount()) * 4);
    // SavedBytes holds the same values on every device (layer.h; max pooling's
    // argmax, the exception, is in neither model), so the saved region is
    // written to its end, short of at most its last tensor's 64-byte alignment.
    EXPECT_EQ(m.output_bytes(), a.output_bytes()) << layer.name();
    const int64_t saved_written = m.activation_bytes() - m.output_bytes();
    EXPECT_LE(saved_written, layer.SavedBytes(batch)) << layer.name();
    EXPECT_GT(saved_written, layer.SavedBytes(batch) - 64) << layer.name();
    EXPECT_LE(m.workspace_bytes(), a.workspace_bytes()) << layer.name();
    for (const tandem::v1::PhaseProfile* phase : {&g.forward(), &g.backward()}) {
      if (const tandem::v1::Counter* c = Find(*phase, "saved_bytes_written")) {
        EXPECT_LE(c->value(), layer.SavedBytes(batch)) << layer.name();
      }
      if (const tandem::v1::Counter* c = Find(*phase, "workspace_bytes_written")) {
        EXPECT_LE(c->value(), layer.WorkspaceBytes(batch)) << layer.name();
      }
    }
  }

  ASSERT_EQ(p.links_size(), 4);
  int pinned = 0;
  for (const tandem::v1::LinkProfile& link : p.links()) {
    pinned += link.pinned();
    EXPECT_TRUE(link.from_device_id() == "cuda:0" || link.to_device_id() == "cuda:0");
    ASSERT_EQ(link.samples_size(), 2);
    EXPECT_GT(link.bandwidth_bytes_per_second(), 0);
    EXPECT_GT(link.latency_seconds(), 0);
  }
  EXPECT_EQ(pinned, 2);
  // The trace is the GPU iteration's.
  EXPECT_NE(r->chrome_trace_json.find("cuda:0"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaProfileTest, ::testing::Values(kMlp, kGpt),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param == kMlp ? "mlp" : "gpt");
                         });

}  // namespace
}  // namespace tandem::profile
