// The CUPTI path. Without a GPU: synthetic activity records (the header's own
// structs) through the attribution, the per-phase counters, the loader against
// real and wrong libraries, and the tracer's and probe's failure paths. With a
// GPU: a kernel launched inside a pushed phase is traced and attributed end to
// end. Without the toolkit: the CUPTI code is left out of the build.
#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstring>
#include <iostream>

#include "runtime/cuda/kernels/elementwise.h"
#include "runtime/profile/cupti/activity_attribution.h"
#include "runtime/profile/cupti/cupti_api.h"
#include "runtime/profile/cupti/cupti_tracer.h"
#include "runtime/profile/cupti/gpu_phase_probe.h"
#endif

namespace tandem::profile {
namespace {

#ifdef TANDEM_HAVE_CUDA

KernelRecord Kernel(uint32_t correlation, uint64_t start, uint64_t end) {
  KernelRecord k;
  std::memset(&k, 0, sizeof(k));
  k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
  k.correlationId = correlation;
  k.start = start;
  k.end = end;
  return k;
}

ExternalCorrelationRecord Correlation(
    uint32_t correlation, uint64_t external,
    CUpti_ExternalCorrelationKind kind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0) {
  ExternalCorrelationRecord e;
  std::memset(&e, 0, sizeof(e));
  e.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
  e.externalKind = kind;
  e.externalId = external;
  e.correlationId = correlation;
  return e;
}

template <typename R>
void Feed(ActivityAttributor& a, const R& record) {
  a.OnRecord(reinterpret_cast<const CUpti_Activity*>(&record));
}

TEST(ActivityAttributionTest, AttributesKernelsCopiesAndSetsToTheirPhaseCall) {
  ActivityAttributor a;
  const PhaseKey bwd{2, Phase::kBackward, 5};
  const PhaseKey fwd{0, Phase::kForward, 3};
  // Kernels may arrive before their correlation records.
  Feed(a, Kernel(100, 1000, 3000));
  Feed(a, Kernel(101, 3500, 4000));
  Feed(a, Correlation(100, PackExternalId(bwd)));
  Feed(a, Correlation(101, PackExternalId(bwd)));
  MemcpyRecord m;
  std::memset(&m, 0, sizeof(m));
  m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
  m.correlationId = 101;
  m.bytes = 4096;
  m.start = 5000;
  m.end = 6000;
  Feed(a, m);
  MemsetRecord s;
  std::memset(&s, 0, sizeof(s));
  s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
  s.correlationId = 102;
  s.bytes = 64;
  s.start = 10;
  s.end = 20;
  Feed(a, s);
  Feed(a, Correlation(102, PackExternalId(fwd)));
  // Launched outside any phase, and correlated by someone else's id kind.
  Feed(a, Kernel(200, 0, 10));
  Feed(a, Kernel(300, 0, 10));
  Feed(a, Correlation(300, PackExternalId(fwd), CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM1));

  const std::map<PhaseKey, GpuPhaseTotals> totals = a.Attribute();
  ASSERT_EQ(totals.size(), 2u);
  const GpuPhaseTotals& b = totals.at(bwd);
  EXPECT_EQ(b.kernels, 2);
  EXPECT_DOUBLE_EQ(b.kernel_seconds, 2500e-9);
  EXPECT_EQ(b.memcpys, 1);
  EXPECT_EQ(b.memcpy_bytes, 4096);
  EXPECT_DOUBLE_EQ(b.memcpy_seconds, 1000e-9);
  EXPECT_DOUBLE_EQ(b.span_seconds(), 5000e-9);
  const GpuPhaseTotals& f = totals.at(fwd);
  EXPECT_EQ(f.kernels, 0);
  EXPECT_EQ(f.memsets, 1);
  EXPECT_EQ(f.memset_bytes, 64);
  EXPECT_EQ(a.Unattributed(), 2);
  EXPECT_EQ(a.records(), 10);
}

TEST(ActivityAttributionTest, SumsCuptiOverheadByKindAcrossClears) {
  ActivityAttributor a;
  OverheadRecord o;
  std::memset(&o, 0, sizeof(o));
  o.kind = CUPTI_ACTIVITY_KIND_OVERHEAD;
  o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_BUFFER_FLUSH;
  o.start = 100;
  o.end = 600;
  Feed(a, o);
  a.Clear();
  o.overheadKind = CUPTI_ACTIVITY_OVERHEAD_CUPTI_INSTRUMENTATION;
  o.end = 300;
  Feed(a, o);
  EXPECT_DOUBLE_EQ(a.overhead_seconds(), 700e-9);
  EXPECT_DOUBLE_EQ(a.overhead_by_kind().at("cupti_buffer_flush"), 500e-9);
  EXPECT_DOUBLE_EQ(a.overhead_by_kind().at("cupti_instrumentation"), 200e-9);
}

TEST(ActivityAttributionTest, StopsStoringAtItsCapAndCountsTheRest) {
  ActivityAttributor a(/*max_activities=*/2);
  for (uint32_t c = 0; c < 5; ++c) Feed(a, Kernel(c, 0, 10));
  EXPECT_EQ(a.dropped(), 3);
  a.Clear();
  Feed(a, Kernel(9, 0, 10));
  EXPECT_EQ(a.dropped(), 3);
  EXPECT_EQ(a.Unattributed(), 1);
}

const tandem::v1::Counter* Find(const std::vector<tandem::v1::Counter>& cs, const std::string& n) {
  for (const auto& c : cs) {
    if (c.name() == n) return &c;
  }
  return nullptr;
}

TEST(GpuPhaseCountersTest, MediansOfCuptiFiguresAndTheEventCrossCheck) {
  std::vector<GpuPhaseTotals> calls(3);
  for (int i = 0; i < 3; ++i) {
    calls[i].kernels = 4 + i;
    calls[i].kernel_seconds = 1e-3 * (i + 1);
    calls[i].first_start_ns = 1000;
    calls[i].last_end_ns = 1000 + 2000000 * (i + 1);
  }
  calls[2].kernel_seconds = 9e-3;  // An outlier does not move the median.
  const auto counters = GpuPhaseCounters(calls, {2.1e-3, 2.2e-3, 9.0e-3});
  ASSERT_NE(Find(counters, "kernel_count"), nullptr);
  EXPECT_DOUBLE_EQ(Find(counters, "kernel_count")->value(), 5);
  EXPECT_DOUBLE_EQ(Find(counters, "kernel_seconds")->value(), 2e-3);
  EXPECT_EQ(Find(counters, "kernel_seconds")->source(), tandem::v1::COUNTER_SOURCE_CUPTI);
  EXPECT_DOUBLE_EQ(Find(counters, "gpu_span_seconds")->value(), 4e-3);
  EXPECT_DOUBLE_EQ(Find(counters, "cuda_event_seconds")->value(), 2.2e-3);
  EXPECT_EQ(Find(counters, "cuda_event_seconds")->source(), tandem::v1::COUNTER_SOURCE_CUDA_EVENT);
  // No copies or sets happened: no such counters rather than zeros.
  EXPECT_EQ(Find(counters, "memcpy_bytes"), nullptr);
  EXPECT_EQ(Find(counters, "memset_seconds"), nullptr);
}

TEST(GpuPhaseCountersTest, WithoutCuptiOnlyTheEventTime) {
  const auto counters = GpuPhaseCounters({}, {1e-3});
  ASSERT_EQ(counters.size(), 1u);
  EXPECT_EQ(counters[0].name(), "cuda_event_seconds");
}

TEST(CuptiApiTest, LoadsTheToolkitsCuptiOrSaysWhereItLooked) {
  absl::StatusOr<CuptiApi> api = LoadCuptiApi(DefaultCuptiLibraries());
  if (api.ok()) {
    EXPECT_FALSE(api->library.empty());
    EXPECT_NE(api->ActivityRegisterCallbacks, nullptr);
    EXPECT_NE(api->ActivityPushExternalCorrelationId, nullptr);
    EXPECT_NE(api->ActivityGetNextRecord, nullptr);
    uint32_t version = 0;
    EXPECT_EQ(api->GetVersion(&version), CUPTI_SUCCESS);
    EXPECT_GT(version, 0u);
    std::cout << "CUPTI " << version << " from " << api->library << "\n";
  } else {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kNotFound);
    for (const std::string& path : DefaultCuptiLibraries()) {
      EXPECT_NE(api.status().message().find(path), std::string::npos) << api.status();
    }
  }
}

TEST(CuptiApiTest, ExplainsAMissingOrWrongLibrary) {
  absl::StatusOr<CuptiApi> missing = LoadCuptiApi({"/nonexistent/libcupti.so"});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/libcupti.so"), std::string::npos);
  absl::StatusOr<CuptiApi> wrong = LoadCuptiApi({"libz.so.1"});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kFailedPrecondition) << wrong.status();
  EXPECT_NE(wrong.status().message().find("lacks cuptiActivityRegisterCallbacks"),
            std::string::npos)
      << wrong.status();
}

TEST(CuptiTracerTest, StartsWithAGpuAndExplainsWhyNotWithout) {
  absl::StatusOr<const CuptiApi*> api = GetCuptiApi();
  if (!api.ok()) GTEST_SKIP() << api.status();
  ActivityAttributor sink;
  absl::StatusOr<std::unique_ptr<CuptiTracer>> tracer = CuptiTracer::Start(*api, &sink);
  if (cuda::QueryCudaDevices().empty()) {
    // CUPTI without a driver or device: the error names the call and CUPTI's reason.
    ASSERT_FALSE(tracer.ok());
    std::cout << "without a device: " << tracer.status() << "\n";
    EXPECT_EQ(tracer.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(tracer.status().message().find("cuptiActivity"), std::string::npos)
        << tracer.status();
    EXPECT_NE(tracer.status().message().find("CUPTI_ERROR"), std::string::npos) << tracer.status();
    // A failed start leaves no tracer active behind it.
    absl::StatusOr<std::unique_ptr<CuptiTracer>> again = CuptiTracer::Start(*api, &sink);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable) << again.status();
    return;
  }
  ASSERT_TRUE(tracer.ok()) << tracer.status();
  absl::StatusOr<std::unique_ptr<CuptiTracer>> second = CuptiTracer::Start(*api, &sink);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GpuPhaseProbeTest, NeedsADevice) {
  absl::StatusOr<std::unique_ptr<GpuPhaseProbe>> probe = GpuPhaseProbe::Create(nullptr);
  if (cuda::QueryCudaDevices().empty()) {
    std::cout << "without a device: " << probe.status() << "\n";
    EXPECT_EQ(probe.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(probe.status().message().find("CUDA events"), std::string::npos) << probe.status();
  } else {
    EXPECT_TRUE(probe.ok()) << probe.status();
  }
}

// On a GPU: kernels launched inside pushed phases come back attributed to the
// right phase call, and the CUDA-event time brackets them.
TEST(GpuPhaseProbeTest, AttributesKernelsToTheirLayerPhaseOnAGpu) {
  if (cuda::QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  absl::StatusOr<std::unique_ptr<GpuPhaseProbe>> probe = GpuPhaseProbe::Create(stream);
  ASSERT_TRUE(probe.ok()) << probe.status();
  constexpr int64_t n = 1 << 24;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  for (int r = 0; r < 4; ++r) {
    const bool timed = r >= 1;
    (*probe)->BeginPhase(3, Phase::kForward, r, timed);
    ASSERT_EQ(cuda::FillF32(d, 1.0f, n, stream), cudaSuccess);
    ASSERT_EQ(cuda::ScaleF32(d, 2.0f, n, stream), cudaSuccess);
    (*probe)->EndPhase(3, Phase::kForward, r, timed);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    (*probe)->BeginPhase(3, Phase::kBackward, r, timed);
    ASSERT_EQ(cuda::ScaleF32(d, 0.5f, n, stream), cudaSuccess);
    (*probe)->EndPhase(3, Phase::kBackward, r, timed);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  tandem::v1::LayerDeviceProfile out;
  ASSERT_TRUE((*probe)->CollectLayer(3, &out).ok());
  tandem::v1::DeviceProfile device;
  (*probe)->FinishProfile(&device);
  std::cout << "device note: " << device.counter_note() << "\n"
            << "forward: " << out.forward().ShortDebugString() << "\n"
            << "backward: " << out.backward().ShortDebugString() << "\n"
            << "overhead " << device.profiler_overhead_seconds() << " s, dropped "
            << device.dropped_records() << "\n";
  const std::vector<tandem::v1::Counter> fwd(out.forward().counters().begin(),
                                             out.forward().counters().end());
  const std::vector<tandem::v1::Counter> bwd(out.backward().counters().begin(),
                                             out.backward().counters().end());
  ASSERT_NE(Find(fwd, "cuda_event_seconds"), nullptr);
  EXPECT_GT(Find(fwd, "cuda_event_seconds")->value(), 0);
  if ((*probe)->tracing()) {
    EXPECT_EQ(device.counter_source(), tandem::v1::COUNTER_SOURCE_CUPTI);
    ASSERT_NE(Find(fwd, "kernel_count"), nullptr);
    EXPECT_EQ(Find(fwd, "kernel_count")->value(), 2);
    EXPECT_EQ(Find(bwd, "kernel_count")->value(), 1);
    EXPECT_GT(Find(fwd, "kernel_seconds")->value(), 0);
    // The kernels ran inside the events' bracket.
    EXPECT_LE(Find(fwd, "kernel_seconds")->value(),
              Find(fwd, "cuda_event_seconds")->value() * 1.05 + 5e-6);
    EXPECT_EQ(device.dropped_records(), 0);
  } else {
    EXPECT_EQ(device.counter_source(), tandem::v1::COUNTER_SOURCE_CUDA_EVENT);
  }
  cudaFree(d);
  cudaStreamDestroy(stream);
}

#else  // !TANDEM_HAVE_CUDA

TEST(CuptiTest, LeftOutWithoutTheToolkit) { EXPECT_FALSE(cuda::BuiltWithCuda()); }

#endif

}  // namespace
}  // namespace tandem::profile
