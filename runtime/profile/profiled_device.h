// A device as the profiler sees it: an Accelerator plus measurement, composed
// the way LevelDB's EnvWrapper composes an Env. The Accelerator
// (runtime/device/accelerator.h) is what the executor runs on: memory, a
// compute context, the optimizer step, copies across its link. ProfiledDevice
// forwards those to it, and adds what only the profiler needs: fresh
// accounting per layer, per-phase measurements beyond wall time (perf
// counters on the CPU; CUPTI kernels and CUDA events on a GPU), peak rates,
// pinned host buffers for link measurements, and a description.
//
// The profiler (layer_profiler.h) owns the method: it allocates through
// NewAllocator(), fills inputs on the host and copies them over, brackets every
// phase call with BeginPhase / EndPhase after Synchronize(), times it on the
// wall clock, and asks CollectLayer() for what the device measured besides.
// A whole training iteration is not the device's business: the executor runs
// it on accelerator() through the IterationRunner seam (layer_profiler.h).
// CpuProfiledDevice (cpu_device.h) composes the host (HostAccelerator);
// CudaProfiledDevice (cuda_device.h, opened through cuda_device_factory.h) a
// CudaAccelerator, with runtime/profile/cupti/gpu_phase_probe.h for the CUPTI
// and CUDA-event part; testing/fakes.h has one over an EmulatedAccelerator.
//
// A ProfiledDevice is driven by one thread at a time (the profiler's).
#ifndef TANDEM_RUNTIME_PROFILE_PROFILED_DEVICE_H_
#define TANDEM_RUNTIME_PROFILE_PROFILED_DEVICE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/core/allocator.h"
#include "runtime/core/device_kind.h"
#include "runtime/device/accelerator.h"
#include "runtime/device/timing_sink.h"
#include "runtime/layers/layer.h"
#include "runtime/optim/optimizer.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// One training iteration of a whole model on a device.
struct IterationRecord {
  // Peak bytes the device allocator held during the iteration, all categories.
  int64_t peak_bytes = 0;
  // A span per layer phase, relative to the start of the iteration.
  tandem::v1::Timeline timeline;
};

// The phase of `out` that `phase` names, for devices filling CollectLayer.
inline tandem::v1::PhaseProfile* MutablePhase(Phase phase, tandem::v1::LayerDeviceProfile* out) {
  switch (phase) {
    case Phase::kForward:
      return out->mutable_forward();
    case Phase::kBackward:
      return out->mutable_backward();
    case Phase::kUpdate:
      return out->mutable_update();
  }
  return out->mutable_forward();
}

class ProfiledDevice {
 public:
  // `target` runs the device's work; not owned, and must outlive this.
  explicit ProfiledDevice(Accelerator* target) : target_(target) {}
  virtual ~ProfiledDevice() = default;
  ProfiledDevice(const ProfiledDevice&) = delete;
  ProfiledDevice& operator=(const ProfiledDevice&) = delete;

  // The composed accelerator: what the executor runs a whole iteration on.
  Accelerator* accelerator() const { return target_; }

  // Forwarded to the accelerator unless a device overrides them.
  // "cpu", "cuda:0", "emulated:0".
  virtual const std::string& id() const { return target_->id(); }
  virtual DeviceKind kind() const { return target_->kind(); }
  // Sets the device fields of a layer call's context (device kind, CUDA
  // context) from the accelerator's compute context.
  virtual void PrepareContext(LayerContext* ctx) {
    const LayerContext device = target_->ComputeContext();
    ctx->device = device.device;
    ctx->cuda = device.cuda;
  }
  // The optimizer step of one contiguous slice of `n` elements in this
  // device's memory (`states` has c's state count pointers).
  virtual absl::Status UpdateSlice(const StepConstants& c, float* params, const float* grads,
                                   float* const* states, int64_t n) {
    return target_->UpdateSlice(c, params, grads, states, n);
  }
  // Returns when all work issued to the device so far has finished.
  virtual absl::Status Synchronize() { return target_->FinishCompute(); }
  // Copies between host memory and this device's memory, synchronously. The
  // host side may be pageable or from AllocatePinnedHost.
  virtual absl::Status CopyToDevice(void* device_dst, const void* host_src, int64_t bytes) {
    return target_->CopyToDevice(device_dst, host_src, bytes);
  }
  virtual absl::Status CopyToHost(void* host_dst, const void* device_src, int64_t bytes) {
    return target_->CopyToHost(host_dst, device_src, bytes);
  }
  // Whether this device is separate from the host (false for the CPU itself):
  // only then are its links measured.
  virtual bool has_host_link() const { return target_->kind() != DeviceKind::kCpu; }

  // Measurement, the device's own.
  // What is known without measuring: id, kind, name, threads, memory_bytes.
  virtual tandem::v1::DeviceProfile Describe() const = 0;
  // Libraries whose versions change this device's figures, for the profile's
  // provenance and cache key: {"onednn": "2.7.3"}, {"cuda": "13.0", ...}.
  virtual std::map<std::string, std::string> Versions() const = 0;
  // A fresh allocator of this device's memory with its own accounting (peaks
  // from zero), so one layer's bytes can be measured alone.
  virtual std::unique_ptr<Allocator> NewAllocator() = 0;
  // Called before every optimizer-update call, untimed: leaves the device's
  // caches holding none of the layer's state, as in training, where a layer's
  // weights and moments were last touched an iteration ago. Without it a slice
  // smaller than the last-level cache would be timed from the cache. Default:
  // nothing.
  virtual void EvictCaches() {}
  // Page-locked host memory for pinned transfers; UNIMPLEMENTED where the
  // device has no such notion.
  virtual absl::StatusOr<void*> AllocatePinnedHost(int64_t bytes) {
    return absl::UnimplementedError(id() + " has no pinned host memory");
  }
  virtual void FreePinnedHost(void* ptr, int64_t bytes) {}

  // Bracket each call of a layer's phase, warm-up included (`timed` false).
  // EndPhase comes right after the phase's work was issued and before
  // Synchronize() (so a GPU records its end event on the stream); the host
  // time EndPhase itself takes is left out of the phase's wall time. `layer` is
  // the chain index.
  virtual void BeginPhase(int layer, Phase phase, int repetition, bool timed) = 0;
  virtual void EndPhase(int layer, Phase phase, int repetition, bool timed) = 0;
  // After all of a layer's phases: adds what the device measured around the
  // timed calls (counters, thread CPU time) to the phases of `out` that ran.
  // Phases that did not run stay absent.
  virtual absl::Status CollectLayer(int layer, tandem::v1::LayerDeviceProfile* out) = 0;

  // Device-wide figures: GEMM FLOP/s and memory bandwidth.
  virtual absl::Status MeasurePeaks(tandem::v1::DeviceProfile* out) = 0;
  // Called before the executor runs a whole iteration on accelerator(): a
  // device that holds the accelerator's stream for its own probes lets go of
  // it. Default: nothing.
  virtual void BeforeIteration() {}
  // Last: the counter source and its note, profiler overhead, dropped records.
  virtual void FinishProfile(tandem::v1::DeviceProfile* out) = 0;

 private:
  Accelerator* const target_;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_PROFILED_DEVICE_H_
