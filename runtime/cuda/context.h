// The execution context of one CUDA device: the compute stream every kernel of
// a step is queued on, the cuBLAS and cuDNN handles bound to that stream, the
// caching allocator and a growable scratch buffer; plus owning wrappers for
// extra streams and events, and a pinned (page-locked) host allocator for the
// transfers between host and device.
//
// Errors. Layer::Forward/Backward return nothing and CUDA work is asynchronous,
// so the CUDA code paths of the layers record the first failure in the context
// (RecordError/Check), skip the rest of that layer call, and return; later calls
// still run (on meaningless data). The executor reads the error with status() or
// Synchronize() after a step and discards the step. A kernel fault that surfaces
// only at the next synchronisation is reported there.
//
// Streams. `stream` is non-blocking: it is not ordered with the legacy default
// stream, so host<->device copies for its kernels go on `stream` (CopyAsync), not
// through plain cudaMemcpy/cudaMemset.
//
// Threads. A CudaContext is used by one host thread at a time (its scratch and
// handles are not synchronised), and that thread's current device must be
// `device` (MakeCurrent()). The error slot is thread-safe, so a watchdog may read
// status() concurrently. CudaStream, CudaEvent and PinnedHostAllocator are
// thread-safe as the CUDA runtime is.
//
// Only in CUDA builds (TANDEM_HAVE_CUDA).
#ifndef TANDEM_RUNTIME_CUDA_CONTEXT_H_
#define TANDEM_RUNTIME_CUDA_CONTEXT_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/core/allocator.h"
#include "runtime/cuda/allocator.h"

namespace tandem::cuda {

// OK, or the error named with `what`: RESOURCE_EXHAUSTED for out-of-memory,
// FAILED_PRECONDITION for a missing device or driver, INTERNAL otherwise; the
// message carries cudaGetErrorString's text.
absl::Status CudaStatus(cudaError_t error, const char* what);
absl::Status CublasStatus(cublasStatus_t status, const char* what);
absl::Status CudnnStatus(cudnnStatus_t status, const char* what);

struct CudaContextOptions {
  // TF32 tensor cores for fp32 GEMMs (cuBLAS) and convolutions (cuDNN): ~8x the
  // fp32 throughput with a 10-bit mantissa in the products.
  bool allow_tf32 = true;
  // cuBLAS workspace taken from the allocator (so it is accounted); NVIDIA
  // recommends 32 MiB on Hopper.
  int64_t cublas_workspace_bytes = int64_t{32} << 20;
  // Upper bound on the scratch a cuDNN convolution algorithm may use; faster
  // algorithms that need more are skipped.
  int64_t max_conv_workspace_bytes = int64_t{256} << 20;
  // Convolutions of bf16 layers in cuDNN's bf16 configuration. Off: on an H100
  // the algorithms the legacy heuristics give were 1.5x to 100x slower than
  // TF32 for every convolution of the presets (bench/gpu/conv_precision,
  // bench/gpu/RESULTS.md), so bf16 jobs convolve in fp32/TF32 unless this is set.
  bool bf16_convolutions = false;
};

struct CudaContext {
  // A context on device `ordinal` drawing memory from `allocator` (which must be
  // that device's and outlive the context); makes `ordinal` current on the
  // calling thread. FAILED_PRECONDITION without a usable device, INVALID_ARGUMENT
  // for an ordinal out of range.
  static absl::StatusOr<std::unique_ptr<CudaContext>> Create(
      int ordinal, CudaAllocator* allocator, const CudaContextOptions& options = {});
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  // Set by Create and never changed: read them, do not assign them.
  int device = 0;
  cudaStream_t stream = nullptr;
  // Math mode CUBLAS_TF32_TENSOR_OP_MATH while allow_tf32(); bound to `stream`.
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;
  CudaAllocator* allocator = nullptr;

  // Makes `device` the calling thread's current device.
  absl::Status MakeCurrent() const;

  bool allow_tf32() const { return options_.allow_tf32; }
  // Switches TF32 on or off for later cuBLAS and cuDNN calls (tests compare
  // against the CPU with it off).
  absl::Status SetAllowTf32(bool allow);
  const CudaContextOptions& options() const { return options_; }

  // Device memory of at least `bytes`, valid until the next Scratch call; grown
  // (from the allocator, as workspace) when too small, after waiting for
  // `stream`, since the old block may go to another stream. For the library calls
  // whose scratch size is only known at run time (cuDNN algorithms, CUB sorts).
  // Null, with the error recorded, when the allocator refuses.
  void* Scratch(int64_t bytes);
  int64_t scratch_bytes() const { return scratch_.bytes(); }

  // Keeps the first error; later ones are dropped (they usually follow from it).
  void RecordError(const absl::Status& status);
  // Records `error` (if any) under `what`; returns whether it was cudaSuccess.
  bool Check(cudaError_t error, const char* what);
  bool Check(const absl::Status& status);
  // The first recorded error, or OK.
  absl::Status status() const;
  // Waits for the stream; returns the first recorded error, else the wait's.
  absl::Status Synchronize();

 private:
  explicit CudaContext(const CudaContextOptions& options) : options_(options) {}

  CudaContextOptions options_;
  Buffer scratch_;
  Buffer cublas_workspace_;
  mutable absl::Mutex mu_;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
};

// An owned CUDA stream (non-blocking with respect to the legacy default stream).
// Move-only.
class CudaStream {
 public:
  // On device `ordinal`; priority as cudaStreamCreateWithPriority (lower is
  // higher priority; 0 is the default).
  static absl::StatusOr<CudaStream> Create(int ordinal, int priority = 0);
  CudaStream() = default;
  ~CudaStream();
  CudaStream(CudaStream&& other) noexcept : stream_(other.stream_) { other.stream_ = nullptr; }
  CudaStream& operator=(CudaStream&& other) noexcept;

  cudaStream_t get() const { return stream_; }
  absl::Status Synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// An owned CUDA event: ordering between streams and, with timing, elapsed time.
// Move-only.
class CudaEvent {
 public:
  // Without timing the event is cheaper (cudaEventDisableTiming).
  static absl::StatusOr<CudaEvent> Create(bool timing = false);
  CudaEvent() = default;
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept : event_(other.event_) { other.event_ = nullptr; }
  CudaEvent& operator=(CudaEvent&& other) noexcept;

  cudaEvent_t get() const { return event_; }
  // Captures the work queued on `stream` so far.
  absl::Status Record(cudaStream_t stream) const;
  // Makes `stream` wait (on the device, not the host) for the recorded work.
  absl::Status WaitOn(cudaStream_t stream) const;
  // Blocks the host until the recorded work is done.
  absl::Status Synchronize() const;
  // Whether the recorded work is done; never blocks.
  absl::StatusOr<bool> Done() const;
  // Seconds between two recorded timing events (both complete).
  static absl::StatusOr<double> ElapsedSeconds(const CudaEvent& start, const CudaEvent& end);

 private:
  cudaEvent_t event_ = nullptr;
};

// Asynchronous copy of `bytes` on `stream` in whichever direction the pointers
// imply (unified addressing). Host memory must be pinned for the copy to overlap
// with compute; pageable memory makes it synchronous.
absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, cudaStream_t stream);

// Page-locked host memory (cudaHostAlloc, portable across devices) with the
// shared accounting and budget; device_id "cpu:pinned". For the staging buffers
// of host<->device transfers and host-resident optimizer state that the GPU
// streams. Without a CUDA driver allocations are refused (RESOURCE_EXHAUSTED).
class PinnedHostAllocator final : public AccountingAllocator {
 public:
  explicit PinnedHostAllocator(int64_t budget_bytes = 0);

 protected:
  void* RawAllocate(int64_t bytes) override;
  void RawFree(void* ptr, int64_t bytes) override;
};

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_CONTEXT_H_
