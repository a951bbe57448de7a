// The GPU half of a CUDA ProfiledDevice's per-phase measurements: what the
// CUDA backend's device forwards BeginPhase / EndPhase / CollectLayer /
// FinishProfile to (profiled_device.h).
//
//   - CUPTI (cupti_tracer.h), when libcupti loads and starts: an external
//     correlation id is pushed around every call of every phase, so each
//     kernel, copy and set is attributed to its layer and phase; per phase the
//     profile gets kernel count, summed kernel time, the span from the first
//     kernel's start to the last one's end, and copy and set bytes and time.
//   - CUDA events recorded on the device's stream around every timed call: the
//     cross-check ("cuda_event_seconds"), also the only GPU figure when CUPTI
//     is unavailable (the DeviceProfile's note then says why).
//
// Figures are medians over the timed calls. CUPTI's overhead records and
// dropped records go to the DeviceProfile. CUDA builds only; driven by one
// thread, like the device.
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_GPU_PHASE_PROBE_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_GPU_PHASE_PROBE_H_

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/profile/cupti/activity_attribution.h"
#include "runtime/profile/cupti/cupti_tracer.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// The counters of one phase from its timed calls: CUPTI's figures (when
// `cupti_calls` is not empty; one entry per timed call, zeros for a call that
// launched nothing) and the CUDA-event time of each call, as medians.
std::vector<tandem::v1::Counter> GpuPhaseCounters(const std::vector<GpuPhaseTotals>& cupti_calls,
                                                  const std::vector<double>& event_seconds);

class GpuPhaseProbe {
 public:
  // Measures work issued on `stream` of the current CUDA device. CUPTI is
  // optional: without it the probe times with events alone.
  // FAILED_PRECONDITION when CUDA events cannot be created (no device).
  static absl::StatusOr<std::unique_ptr<GpuPhaseProbe>> Create(cudaStream_t stream,
                                                               CuptiTracerOptions options = {});
  ~GpuPhaseProbe();

  void BeginPhase(int layer, Phase phase, int repetition, bool timed);
  void EndPhase(int layer, Phase phase, int repetition, bool timed);
  // Waits for the layer's events, flushes CUPTI, and adds the counters of each
  // phase that ran to `out`.
  absl::Status CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out);
  // counter_source (CUPTI, or CUDA_EVENT when CUPTI is unavailable) and its
  // note, CUPTI's overhead and dropped records.
  void FinishProfile(tandem::v1::DeviceProfile* out);

  bool tracing() const { return tracer_ != nullptr; }

 private:
  explicit GpuPhaseProbe(cudaStream_t stream) : stream_(stream) {}

  struct Call {
    int repetition;
    cudaEvent_t start;
    cudaEvent_t end;
  };

  const cudaStream_t stream_;
  // Before the tracer: the tracer feeds it until destroyed.
  ActivityAttributor attributor_;
  std::unique_ptr<CuptiTracer> tracer_;
  std::string cupti_note_;
  std::map<std::pair<int, Phase>, std::vector<Call>> calls_;
  int64_t unattributed_ = 0;
  std::string first_error_;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_GPU_PHASE_PROBE_H_
