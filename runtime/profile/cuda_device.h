// A CUDA GPU as a ProfiledDevice: what the profiler (layer_profiler.h) measures
// each layer's phases on, beside the host's CpuProfiledDevice. Compiled and
// linked, but never yet run on a GPU (runtime/cuda/README.md, "What is verified
// where").
//
// It composes a CudaAccelerator (runtime/cuda/cuda_accelerator.h), the one the
// executor runs on: layers are measured on that accelerator's CudaContext, and
// the whole iteration (the IterationRunner seam, layer_profiler.h) runs on the
// same accelerator.
//
// Memory and work:
//   - NewAllocator() is a fresh CudaAllocator (caching, with its own accounting
//     and no budget), so a layer's measured bytes are its own. Library scratch
//     whose size only cuDNN or CUB knows at run time comes from the device's
//     accelerator's CudaContext (CudaContext::Scratch), not from that allocator: it is not in
//     a layer's measured workspace, as it is not in the analytic figure; the
//     DeviceProfile's counter_note gives its high-water mark.
//   - Layers run their CUDA paths (LayerContext::device = kCuda) on one
//     CudaContext: its non-blocking stream, cuBLAS (TF32 as the options say,
//     allowed by default, like CudaAccelerator) and cuDNN. Updates run
//     cuda::UpdateSlice on the same stream (issued only, unlike the
//     accelerator's UpdateSlice, which waits). Calls only issue work; the
//     profiler's Synchronize() waits for the stream and returns the first
//     error a layer recorded in the context. That error is sticky, as in
//     CudaAccelerator: open a new device to go on after one.
//   - EvictCaches() writes a buffer of twice the L2 cache (cudaMemsetAsync) and
//     waits for it, so an update is timed on state last touched an iteration
//     ago and its wall time does not include the eviction.
//   - Copies go through the context's stream (cuda::CopyAsync, then a stream
//     synchronisation), so they are ordered with the layers' kernels and the
//     link figures (link_bandwidth.h) are those of a synchronous copy from
//     pageable memory or from AllocatePinnedHost's page-locked memory
//     (cudaHostAlloc, through a PinnedHostAllocator).
//
// Per phase, besides the profiler's wall time (issue to synchronised), a
// GpuPhaseProbe (cupti/gpu_phase_probe.h) on the context's stream: CUDA events
// around every timed call ("cuda_event_seconds"), and where libcupti loads and
// starts, CUPTI activity records attributed to the layer and phase by external
// correlation id (kernel count, kernel time, GPU span, copy and set bytes and
// time). Without CUPTI the DeviceProfile's counter_source is CUDA_EVENT and its
// note says why; nothing is reported as zero that was not measured. The probe
// (and with it CUPTI's process-wide tracing) starts at the first BeginPhase of
// a profile and stops at MeasurePeaks, BeforeIteration or FinishProfile,
// whichever comes first, so peaks and the iteration are timed untraced and no
// tracing is left running between profiles. Harness work between phases (the
// profiler's uploads, canary fills and scans, cache evictions) is outside
// every phase: the note counts it among the "GPU activities outside any
// profiled phase".
//
// MeasurePeaks: the fp32 GEMM rate of a square cuBLAS SGEMM (2 m n k FLOPs,
// TF32 as the options say, inputs uniform in [0, 1)) and the memory bandwidth
// of a device-to-device copy (counting the bytes read and the bytes written),
// each the median of `peak_repeats` CUDA-event timings after a warm-up; the
// note states the sizes and the TF32 setting.
//
// BeforeIteration: stops the probe and gives the cache-eviction buffer back, so
// the executor's iteration on the accelerator (runtime/exec/
// profiled_iteration.h) is untraced and its peak is the iteration's own plus
// the context's fixed workspace (cuBLAS's 32 MiB).
//
// Only in CUDA builds; elsewhere use CreateCudaProfiledDevice
// (cuda_device_factory.h). Driven by one thread at a time, like every
// ProfiledDevice; every method makes the device current on the calling thread.
#ifndef TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_H_
#define TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cuda_accelerator.h"
#include "runtime/cuda/device_query.h"
#include "runtime/profile/cuda_device_factory.h"
#include "runtime/profile/cupti/gpu_phase_probe.h"
#include "runtime/profile/profiled_device.h"

namespace tandem::profile {

class CudaProfiledDevice final : public ProfiledDevice {
 public:
  // Arguments and errors as CreateCudaProfiledDevice's.
  static absl::StatusOr<std::unique_ptr<CudaProfiledDevice>> Create(
      int ordinal, const CudaProfiledDeviceOptions& options = {});
  // Waits for queued work. Allocators from NewAllocator() must be gone.
  ~CudaProfiledDevice() override;

  // Name "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)", threads = SMs, memory_bytes
  // the device's total.
  tandem::v1::DeviceProfile Describe() const override;
  // cuda_runtime, cuda_driver, cublas, cudnn and cuda_tf32 ("allowed"/"off").
  std::map<std::string, std::string> Versions() const override;

  std::unique_ptr<Allocator> NewAllocator() override;
  // Issues cuda::UpdateSlice on the context's stream; Synchronize waits.
  absl::Status UpdateSlice(const StepConstants& c, float* params, const float* grads,
                           float* const* states, int64_t n) override;
  void EvictCaches() override;

  absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) override;
  absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) override;
  void FreePinnedHost(void* ptr, int64_t bytes) override;

  void BeginPhase(int layer, Phase phase, int repetition, bool timed) override;
  void EndPhase(int layer, Phase phase, int repetition, bool timed) override;
  absl::Status CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) override;

  absl::Status MeasurePeaks(tandem::v1::DeviceProfile* out) override;
  void BeforeIteration() override;
  void FinishProfile(tandem::v1::DeviceProfile* out) override;

  int ordinal() const { return info_.ordinal; }
  // The layers' context (the accelerator's); same threading rule as the device.
  cuda::CudaContext* context() const { return accelerator_->context(); }

 private:
  CudaProfiledDevice(const cuda::CudaDeviceInfo& info, int64_t l2_cache_bytes,
                     const CudaProfiledDeviceOptions& options,
                     std::unique_ptr<cuda::CudaAccelerator> accelerator);
  // Ends the probe of the current profile, keeping what FinishProfile reports.
  void StopProbe();
  // The median seconds, by CUDA events on the context's stream, of
  // `issue` (which queues work on that stream), after one untimed call.
  template <typename F>
  absl::StatusOr<double> MedianEventSeconds(F issue);

  const cuda::CudaDeviceInfo info_;
  const int64_t l2_cache_bytes_;
  const CudaProfiledDeviceOptions options_;
  // Declared first: destroyed after everything that holds its memory.
  std::unique_ptr<cuda::CudaAccelerator> accelerator_;
  cuda::PinnedHostAllocator pinned_;
  // EvictCaches' buffer, from the accelerator's allocator.
  Buffer eviction_;
  int eviction_generation_ = 0;
  // The current profile's probe (null between profiles), the error that kept
  // one from being made, and what the last one reported when it stopped.
  std::unique_ptr<GpuPhaseProbe> probe_;
  absl::Status probe_error_;
  bool probe_stopped_ = false;
  tandem::v1::DeviceProfile probe_summary_;
  // What MeasurePeaks measured and how, for the counter note.
  std::string peaks_note_;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_H_
