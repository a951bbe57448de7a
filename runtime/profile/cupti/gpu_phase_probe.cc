#include "runtime/profile/cupti/gpu_phase_probe.h"

#include "absl/strings/str_cat.h"
#include "runtime/profile/profiled_device.h"
#include "runtime/profile/timing_stats.h"

namespace tandem::profile {
namespace {

tandem::v1::Counter MakeCounter(const std::string& name, double value, const std::string& unit,
                                tandem::v1::CounterSource source) {
  tandem::v1::Counter c;
  c.set_name(name);
  c.set_value(value);
  c.set_unit(unit);
  c.set_source(source);
  return c;
}

template <typename F>
double MedianOf(const std::vector<GpuPhaseTotals>& calls, F field) {
  std::vector<double> values;
  for (const GpuPhaseTotals& t : calls) values.push_back(static_cast<double>(field(t)));
  return Median(values);
}

}  // namespace

std::vector<tandem::v1::Counter> GpuPhaseCounters(const std::vector<GpuPhaseTotals>& cupti_calls,
                                                  const std::vector<double>& event_seconds) {
  constexpr auto kCupti = tandem::v1::COUNTER_SOURCE_CUPTI;
  std::vector<tandem::v1::Counter> out;
  if (!cupti_calls.empty()) {
    out.push_back(MakeCounter("kernel_count",
                              MedianOf(cupti_calls, [](const auto& t) { return t.kernels; }),
                              "events", kCupti));
    out.push_back(MakeCounter("kernel_seconds",
                              MedianOf(cupti_calls, [](const auto& t) { return t.kernel_seconds; }),
                              "seconds", kCupti));
    out.push_back(MakeCounter("gpu_span_seconds",
                              MedianOf(cupti_calls, [](const auto& t) { return t.span_seconds(); }),
                              "seconds", kCupti));
    bool copies = false, sets = false;
    for (const GpuPhaseTotals& t : cupti_calls) {
      copies |= t.memcpys > 0;
      sets |= t.memsets > 0;
    }
    if (copies) {
      out.push_back(MakeCounter("memcpy_bytes",
                                MedianOf(cupti_calls, [](const auto& t) { return t.memcpy_bytes; }),
                                "bytes", kCupti));
      out.push_back(MakeCounter(
          "memcpy_seconds", MedianOf(cupti_calls, [](const auto& t) { return t.memcpy_seconds; }),
          "seconds", kCupti));
    }
    if (sets) {
      out.push_back(MakeCounter(
          "memset_seconds", MedianOf(cupti_calls, [](const auto& t) { return t.memset_seconds; }),
          "seconds", kCupti));
    }
  }
  if (!event_seconds.empty()) {
    out.push_back(MakeCounter("cuda_event_seconds", Median(event_seconds), "seconds",
                              tandem::v1::COUNTER_SOURCE_CUDA_EVENT));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<GpuPhaseProbe>> GpuPhaseProbe::Create(cudaStream_t stream,
                                                                     CuptiTracerOptions options) {
  cudaEvent_t probe;
  const cudaError_t err = cudaEventCreate(&probe);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create CUDA events: ", cudaGetErrorString(err)));
  }
  cudaEventDestroy(probe);
  std::unique_ptr<GpuPhaseProbe> p(new GpuPhaseProbe(stream));
  absl::StatusOr<const CuptiApi*> api = GetCuptiApi();
  if (!api.ok()) {
    p->cupti_note_ = absl::StrCat("CUPTI unavailable (", api.status().message(),
                                  "); GPU phases timed with CUDA events only");
    return p;
  }
  absl::StatusOr<std::unique_ptr<CuptiTracer>> tracer =
      CuptiTracer::Start(*api, &p->attributor_, options);
  if (!tracer.ok()) {
    p->cupti_note_ = absl::StrCat("CUPTI did not start (", tracer.status().message(),
                                  "); GPU phases timed with CUDA events only");
    return p;
  }
  p->tracer_ = std::move(*tracer);
  p->cupti_note_ = absl::StrCat("CUPTI activity from ", (*api)->library,
                                ": kernels, copies and sets attributed to layer phases by external "
                                "correlation id; CUDA events as a cross-check");
  return p;
}

GpuPhaseProbe::~GpuPhaseProbe() {
  tracer_.reset();
  for (auto& [key, calls] : calls_) {
    for (Call& c : calls) {
      cudaEventDestroy(c.start);
      cudaEventDestroy(c.end);
    }
  }
}

void GpuPhaseProbe::BeginPhase(int layer, Phase phase, int repetition, bool timed) {
  if (tracer_ != nullptr) {
    const absl::Status s = tracer_->PushPhase({layer, phase, repetition});
    if (!s.ok() && first_error_.empty()) first_error_ = std::string(s.message());
  }
  if (!timed) return;
  Call call{repetition, nullptr, nullptr};
  if (cudaEventCreate(&call.start) != cudaSuccess || cudaEventCreate(&call.end) != cudaSuccess ||
      cudaEventRecord(call.start, stream_) != cudaSuccess) {
    if (first_error_.empty()) first_error_ = cudaGetErrorString(cudaGetLastError());
  }
  calls_[{layer, phase}].push_back(call);
}

void GpuPhaseProbe::EndPhase(int layer, Phase phase, int repetition, bool timed) {
  if (timed) {
    std::vector<Call>& calls = calls_[{layer, phase}];
    if (!calls.empty() && calls.back().repetition == repetition &&
        cudaEventRecord(calls.back().end, stream_) != cudaSuccess && first_error_.empty()) {
      first_error_ = cudaGetErrorString(cudaGetLastError());
    }
  }
  if (tracer_ != nullptr) {
    const absl::Status s = tracer_->PopPhase();
    if (!s.ok() && first_error_.empty()) first_error_ = std::string(s.message());
  }
}

absl::Status GpuPhaseProbe::CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) {
  if (!first_error_.empty()) {
    return absl::InternalError(absl::StrCat("GPU phase measurement: ", first_error_));
  }
  std::map<PhaseKey, GpuPhaseTotals> attributed;
  if (tracer_ != nullptr) {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) {
      return absl::InternalError(cudaGetErrorString(cudaGetLastError()));
    }
    absl::Status flushed = tracer_->Flush();
    if (!flushed.ok()) return flushed;
    tracer_->WithSinkLocked([&] {
      attributed = attributor_.Attribute();
      unattributed_ += attributor_.Unattributed();
      attributor_.Clear();
    });
  }
  for (Phase phase : {Phase::kForward, Phase::kBackward, Phase::kUpdate}) {
    auto it = calls_.find({layer, phase});
    if (it == calls_.end()) continue;
    std::vector<double> event_seconds;
    std::vector<GpuPhaseTotals> cupti_calls;
    for (Call& c : it->second) {
      float ms = 0;
      if (cudaEventSynchronize(c.end) == cudaSuccess &&
          cudaEventElapsedTime(&ms, c.start, c.end) == cudaSuccess) {
        event_seconds.push_back(1e-3 * ms);
      }
      cudaEventDestroy(c.start);
      cudaEventDestroy(c.end);
      if (tracer_ != nullptr) {
        auto found = attributed.find({layer, phase, c.repetition});
        cupti_calls.push_back(found == attributed.end() ? GpuPhaseTotals() : found->second);
      }
    }
    calls_.erase(it);
    tandem::v1::PhaseProfile* p = MutablePhase(phase, out);
    for (tandem::v1::Counter& c : GpuPhaseCounters(cupti_calls, event_seconds)) {
      *p->add_counters() = std::move(c);
    }
  }
  return absl::OkStatus();
}

void GpuPhaseProbe::FinishProfile(tandem::v1::DeviceProfile* out) {
  out->set_counter_source(tracer_ != nullptr ? tandem::v1::COUNTER_SOURCE_CUPTI
                                             : tandem::v1::COUNTER_SOURCE_CUDA_EVENT);
  std::string note = cupti_note_;
  if (tracer_ != nullptr) {
    (void)tracer_->Flush();
    tracer_->WithSinkLocked([&] {
      out->set_profiler_overhead_seconds(attributor_.overhead_seconds());
      out->set_dropped_records(tracer_->dropped_records() + attributor_.dropped());
    });
    if (tracer_->refused_buffers() > 0 || out->dropped_records() > 0) {
      absl::StrAppend(&note, "; buffer cap reached: ", tracer_->refused_buffers(),
                      " buffer requests refused, ", out->dropped_records(), " records dropped");
    }
    if (unattributed_ > 0) {
      absl::StrAppend(&note, "; ", unattributed_, " GPU activities outside any profiled phase");
    }
  }
  out->set_counter_note(note);
}

}  // namespace tandem::profile
