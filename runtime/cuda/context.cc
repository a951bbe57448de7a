#include "runtime/cuda/context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error), " (", cudaGetErrorName(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInitializationError:
    case cudaErrorDevicesUnavailable:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": ", cublasGetStatusString(status));
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::FailedPreconditionError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CudnnStatus(cudnnStatus_t status, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return absl::OkStatus();
  char detail[256] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  std::string message = absl::StrCat(what, ": ", cudnnGetErrorString(status));
  if (detail[0] != 0) absl::StrAppend(&message, " (", detail, ")");
  // cuDNN 9 codes are a category (thousands) plus a specific error.
  if (status == CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED ||
      status == CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED) {
    return absl::ResourceExhaustedError(message);
  }
  switch (CUDNN_STATUS_CATEGORY(status)) {
    case CUDNN_STATUS_BAD_PARAM:
      return absl::InvalidArgumentError(message);
    case CUDNN_STATUS_NOT_SUPPORTED:
      return absl::UnimplementedError(message);
    default:
      break;
  }
  if (status == CUDNN_STATUS_NOT_INITIALIZED) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

absl::StatusOr<std::unique_ptr<CudaContext>> CudaContext::Create(
    int ordinal, CudaAllocator* allocator, const CudaContextOptions& options) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    const char* why = err != cudaSuccess ? cudaGetErrorString(err) : "no device found";
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  }
  if (ordinal < 0 || ordinal >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", count, " found)"));
  }
  if (allocator == nullptr || allocator->ordinal() != ordinal) {
    return absl::InvalidArgumentError(
        absl::StrCat("the allocator of a context on cuda:", ordinal, " must be that device's"));
  }
  std::unique_ptr<CudaContext> ctx(new CudaContext(options));
  ctx->device = ordinal;
  ctx->allocator = allocator;
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking),
                                    "cudaStreamCreate"));
  TANDEM_RETURN_IF_ERROR(CublasStatus(cublasCreate(&ctx->cublas), "cublasCreate"));
  TANDEM_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(ctx->cublas, ctx->stream), "cublasSetStream"));
  if (options.cublas_workspace_bytes > 0) {
    TANDEM_ASSIGN_OR_RETURN(
        ctx->cublas_workspace_,
        Buffer::Allocate(allocator, options.cublas_workspace_bytes, MemoryCategory::kWorkspace));
    TANDEM_RETURN_IF_ERROR(
        CublasStatus(cublasSetWorkspace(ctx->cublas, ctx->cublas_workspace_.data(),
                                        static_cast<size_t>(options.cublas_workspace_bytes)),
                     "cublasSetWorkspace"));
  }
  TANDEM_RETURN_IF_ERROR(ctx->SetAllowTf32(options.allow_tf32));
  TANDEM_RETURN_IF_ERROR(CudnnStatus(cudnnCreate(&ctx->cudnn), "cudnnCreate"));
  TANDEM_RETURN_IF_ERROR(CudnnStatus(cudnnSetStream(ctx->cudnn, ctx->stream), "cudnnSetStream"));
  return ctx;
}

CudaContext::~CudaContext() {
  if (stream != nullptr) {
    cudaSetDevice(device);
    // Queued kernels may still use the scratch and cuBLAS workspace.
    cudaStreamSynchronize(stream);
  }
  scratch_.Reset();
  if (cudnn != nullptr) cudnnDestroy(cudnn);
  if (cublas != nullptr) cublasDestroy(cublas);
  cublas_workspace_.Reset();
  if (stream != nullptr) cudaStreamDestroy(stream);
}

absl::Status CudaContext::MakeCurrent() const {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return absl::OkStatus();
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

absl::Status CudaContext::SetAllowTf32(bool allow) {
  TANDEM_RETURN_IF_ERROR(CublasStatus(
      cublasSetMathMode(cublas, allow ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
      "cublasSetMathMode"));
  options_.allow_tf32 = allow;
  return absl::OkStatus();
}

void* CudaContext::Scratch(int64_t bytes) {
  if (bytes <= scratch_.bytes()) return scratch_.data();
  // Grow by half again so a sequence of slightly larger requests reallocates
  // rarely. The old block goes back to the cache, from which another thread may
  // take it at once for a copy on another stream (CudaAccelerator's copy
  // workers): stream order alone does not protect the kernels still queued on
  // `stream` that use it, so they finish first. Growth is rare; the wait is too.
  const int64_t want = std::max(bytes, scratch_.bytes() + scratch_.bytes() / 2);
  if (!scratch_.empty()) Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  scratch_.Reset();
  absl::StatusOr<Buffer> grown = Buffer::Allocate(allocator, want, MemoryCategory::kWorkspace);
  if (!grown.ok()) grown = Buffer::Allocate(allocator, bytes, MemoryCategory::kWorkspace);
  if (!grown.ok()) {
    RecordError(grown.status());
    return nullptr;
  }
  scratch_ = std::move(grown).value();
  return scratch_.data();
}

void CudaContext::RecordError(const absl::Status& status) {
  if (status.ok()) return;
  absl::MutexLock lock(&mu_);
  if (error_.ok()) error_ = status;
}

bool CudaContext::Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  RecordError(CudaStatus(error, what));
  return false;
}

bool CudaContext::Check(const absl::Status& status) {
  RecordError(status);
  return status.ok();
}

absl::Status CudaContext::status() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

absl::Status CudaContext::Synchronize() {
  Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return status();
}

// ---------------------------------------------------------------------------
// CudaStream, CudaEvent

absl::StatusOr<CudaStream> CudaStream::Create(int ordinal, int priority) {
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"));
  CudaStream s;
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, priority),
                 "cudaStreamCreateWithPriority"));
  return s;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = other.stream_;
    other.stream_ = nullptr;
  }
  return *this;
}

absl::Status CudaStream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::StatusOr<CudaEvent> CudaEvent::Create(bool timing) {
  CudaEvent e;
  TANDEM_RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&e.event_, timing ? cudaEventDefault : cudaEventDisableTiming),
      "cudaEventCreate"));
  return e;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = other.event_;
    other.event_ = nullptr;
  }
  return *this;
}

absl::Status CudaEvent::Record(cudaStream_t stream) const {
  return CudaStatus(cudaEventRecord(event_, stream), "cudaEventRecord");
}

absl::Status CudaEvent::WaitOn(cudaStream_t stream) const {
  return CudaStatus(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent");
}

absl::Status CudaEvent::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

absl::StatusOr<bool> CudaEvent::Done() const {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  return CudaStatus(err, "cudaEventQuery");
}

absl::StatusOr<double> CudaEvent::ElapsedSeconds(const CudaEvent& start, const CudaEvent& end) {
  float ms = 0;
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaEventElapsedTime(&ms, start.event_, end.event_), "cudaEventElapsedTime"));
  return static_cast<double>(ms) * 1e-3;
}

absl::Status CopyAsync(void* dst, const void* src, int64_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  return CudaStatus(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, stream),
      "cudaMemcpyAsync");
}

// ---------------------------------------------------------------------------
// PinnedHostAllocator

PinnedHostAllocator::PinnedHostAllocator(int64_t budget_bytes)
    : AccountingAllocator("cpu:pinned", budget_bytes) {}

void* PinnedHostAllocator::RawAllocate(int64_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;  // Page-aligned.
}

void PinnedHostAllocator::RawFree(void* ptr, int64_t) { cudaFreeHost(ptr); }

}  // namespace tandem::cuda
