// A CUDA GPU as the plan executor's Accelerator (runtime/device/accelerator.h):
// device memory from the caching CudaAllocator under a hard budget, pinned host
// memory for staging, layers run on one CudaContext (compute stream, cuBLAS,
// cuDNN), and copies on two streams of their own, one per direction, so that a
// gradient going down and weights coming up overlap each other and the compute.
//
// Every method returns when its work is complete: compute methods synchronise
// the compute stream, copies their copy stream. So the executor's span
// timestamps are real completion times, and memory a finished span frees is no
// longer used by any queued work when the allocator hands it out again, on
// whichever stream (the allocator's stream rule, allocator.h).
//
// Threads. The CUDA current device is per host thread, so every method makes
// this device current on its calling thread first.
//   - Compute methods (ComputeContext and the layer calls made with its
//     LayerContext, FinishCompute, Fill, UpdateSlice, SumOfSquares) use the one
//     CudaContext, which is single-threaded: one thread at a time (the
//     executor's compute worker, or the driving thread while the executor is
//     idle).
//   - CopyToDevice and CopyToHost touch only their direction's stream and may be
//     called from any thread, concurrently with each other and with compute.
//
// Errors. Layers record CUDA failures in the context (CudaContext::RecordError);
// FinishCompute returns the first one, and so does every compute method after
// it: the context's error is sticky, because a failed step leaves device state
// undefined. Copies return their own errors.
//
// Only in CUDA builds (TANDEM_HAVE_CUDA); elsewhere use CreateCudaAccelerator
// (accelerator_factory.h), which compiles everywhere.
#ifndef TANDEM_RUNTIME_CUDA_CUDA_ACCELERATOR_H_
#define TANDEM_RUNTIME_CUDA_CUDA_ACCELERATOR_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/core/allocator.h"
#include "runtime/cuda/accelerator_factory.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/device/accelerator.h"

namespace tandem::cuda {

class CudaAccelerator final : public Accelerator {
 public:
  // Arguments and errors as CreateCudaAccelerator's (accelerator_factory.h).
  // Makes `ordinal` current on the calling thread.
  static absl::StatusOr<std::unique_ptr<CudaAccelerator>> Create(
      int ordinal, int64_t memory_budget_bytes, const CudaAcceleratorOptions& options = {});
  // Waits for all queued work. Buffers from allocator() must be freed before.
  ~CudaAccelerator() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  // "cuda:<ordinal>".
  const std::string& id() const override { return allocator_->device_id(); }
  Allocator* allocator() override { return allocator_.get(); }
  Allocator* host_staging_allocator() override { return &pinned_; }

  // device = kCuda, cuda = context().
  LayerContext ComputeContext() override;
  absl::Status FinishCompute() override;

  // `dst` (to device) or `src` (to host) must be memory of this device; the host
  // side may be pageable or pinned (pinned copies are faster and asynchronous
  // with respect to other copies and compute).
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  // Another CudaAccelerator on the same GPU (a device-to-device copy), or on
  // a GPU this one can access as a peer (cudaDeviceCanAccessPeer; peer
  // access is enabled on first use). Any thread.
  bool HasPeerLink(Accelerator& from) override;
  // cudaMemcpyPeerAsync (cudaMemcpyAsync on the same GPU) on the
  // host-to-device stream; `dst` must be this device's memory.
  absl::Status CopyFromPeer(void* dst, Accelerator& from, const void* src, int64_t bytes) override;
  // FillF32, UpdateSlice (optimizer.h) and the deterministic SumOfSquares
  // kernel, on the compute stream.
  absl::Status Fill(float* dst, float value, int64_t n) override;
  absl::Status UpdateSlice(const StepConstants& step, float* params, const float* grads,
                           float* const* states, int64_t n) override;
  absl::StatusOr<double> SumOfSquares(const float* x, int64_t n) override;

  // cudaHostRegister, counted with the staging memory against
  // CudaAcceleratorOptions::pinned_host_budget_bytes. Any thread.
  absl::Status RegisterHost(void* ptr, int64_t bytes) override;
  void UnregisterHost(void* ptr) override;
  int64_t pinned_host_bytes() override;

  int ordinal() const { return allocator_->ordinal(); }
  CudaAllocator* cuda_allocator() { return allocator_.get(); }
  // The compute context; same threading rule as the compute methods.
  CudaContext* context() { return ctx_.get(); }

 private:
  explicit CudaAccelerator(const CudaAcceleratorOptions& options);
  // Makes the device current on this thread and checks that `device_side` is
  // this device's memory; then copies on `stream` and waits for it.
  absl::Status Copy(void* dst, const void* src, int64_t bytes, const void* device_side,
                    const CudaStream& stream, const char* direction);

  // Declared first: destroyed last, after everything that holds its memory.
  std::unique_ptr<CudaAllocator> allocator_;
  PinnedHostAllocator pinned_;
  std::unique_ptr<CudaContext> ctx_;
  CudaStream h2d_, d2h_;
  // SumOfSquares: kSumOfSquaresPartials partial sums, then the result (doubles).
  Buffer reduction_;
  // RegisterHost's ranges (start, bytes); the staging allocator has its own
  // count and holds the pinned budget.
  absl::Mutex registered_mu_;
  absl::flat_hash_map<void*, int64_t> registered_ ABSL_GUARDED_BY(registered_mu_);
  int64_t registered_bytes_ ABSL_GUARDED_BY(registered_mu_) = 0;
  // HasPeerLink's answers by the other device's ordinal.
  absl::Mutex peers_mu_;
  absl::flat_hash_map<int, bool> peers_ ABSL_GUARDED_BY(peers_mu_);
};

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_CUDA_ACCELERATOR_H_
