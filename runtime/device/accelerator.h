// The accelerator side of a node as the plan executor sees it: memory with
// byte accounting and a hard budget, a compute context for layers, and copies
// between host and device. The emulated accelerator (runtime/emulated/) and the
// CUDA GPU (runtime/cuda/cuda_accelerator.h) implement it; code built with or
// without the CUDA toolkit opens a GPU with CreateCudaAccelerator
// (runtime/cuda/accelerator_factory.h).
//
// Execution model: the executor runs each resource (compute, H2D, D2H) on its
// own thread and calls these methods from it; every method returns when its
// work is complete (a CUDA implementation synchronises its stream), so the
// executor's dependency tracking sees real completion times. Methods may be
// called concurrently from different resource threads, one call per thread at a
// time. Thread-safe in that sense.
#ifndef TANDEM_RUNTIME_DEVICE_ACCELERATOR_H_
#define TANDEM_RUNTIME_DEVICE_ACCELERATOR_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/core/allocator.h"
#include "runtime/core/device_kind.h"
#include "runtime/layers/layer.h"
#include "runtime/optim/optimizer.h"

namespace tandem {

class Accelerator {
 public:
  virtual ~Accelerator() = default;

  virtual DeviceKind kind() const = 0;
  // "emulated:0", "cuda:0".
  virtual const std::string& id() const = 0;
  // Device memory; its budget is the device's capacity for this job.
  virtual Allocator* allocator() = 0;
  // Host memory to stage copies from and to (pinned on CUDA).
  virtual Allocator* host_staging_allocator() = 0;

  // A LayerContext whose device fields point at this accelerator; the caller
  // fills in the layer's slices, workspace and randomness.
  virtual LayerContext ComputeContext() = 0;
  // Waits until the compute work issued from the calling thread is done, and
  // returns its first error (a CUDA kernel failure), if any.
  virtual absl::Status FinishCompute() = 0;

  // Copies, each complete on return. `dst`/`src` are device pointers from
  // allocator() on the device side.
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;
  // Device memory to device memory of this accelerator (compute context).
  // By default through staging host memory; a device that copies in place
  // overrides it.
  virtual absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) {
    absl::StatusOr<Buffer> staged =
        Buffer::Allocate(host_staging_allocator(), bytes, MemoryCategory::kWorkspace);
    if (!staged.ok()) return staged.status();
    if (absl::Status s = CopyToHost(staged->data(), src, bytes); !s.ok()) return s;
    return CopyToDevice(dst, staged->data(), bytes);
  }
  // Whether CopyFromPeer reads `from`'s device memory directly: a peer link
  // between two accelerators of the node (NVLink or PCIe peer-to-peer between
  // GPUs, the same GPU, the emulated accelerators' link). False: the caller
  // stages through host memory (CopyToHost on `from`, then CopyToDevice).
  virtual bool HasPeerLink(Accelerator& from) { return false; }
  // Device memory of `from` (HasPeerLink(from)) to device memory of this
  // accelerator, complete on return. Called from a thread of this
  // accelerator's (a pipeline stage pulling what the stage before left on
  // its device); `from` must not free `src` before it returns.
  virtual absl::Status CopyFromPeer(void* dst, Accelerator& from, const void* src, int64_t bytes) {
    return absl::UnimplementedError(absl::StrCat(id(), " has no peer link to ", from.id()));
  }
  // Makes [ptr, ptr + bytes) of host memory (the executor's long-lived copy
  // sources and targets) fast to copy from and to until UnregisterHost(ptr):
  // page-locked on CUDA, where a pageable copy is staged by the driver (on an
  // H100, 7.9 GB/s pageable against 54 GB/s pinned). Ranges must not overlap.
  // RESOURCE_EXHAUSTED past the accelerator's pinned budget, UNAVAILABLE when
  // the driver refuses; the memory then stays pageable and copies still work.
  // A no-op where copies do not care.
  virtual absl::Status RegisterHost(void* ptr, int64_t bytes) { return absl::OkStatus(); }
  virtual void UnregisterHost(void* ptr) {}
  // Host bytes page-locked for this accelerator: staging plus registered.
  virtual int64_t pinned_host_bytes() {
    return host_staging_allocator()->stats().total_in_use_bytes;
  }
  // Sets `n` floats of device memory to `value` (compute context).
  virtual absl::Status Fill(float* dst, float value, int64_t n) = 0;
  // An optimizer step over a slice of device buffers (compute context).
  virtual absl::Status UpdateSlice(const StepConstants& step, float* params, const float* grads,
                                   float* const* states, int64_t n) = 0;
  // sum_i x[i]^2 over device memory, in double (gradient clipping).
  virtual absl::StatusOr<double> SumOfSquares(const float* x, int64_t n) = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DEVICE_ACCELERATOR_H_
