#include "runtime/cuda/cuda_accelerator.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/cuda/kernels/elementwise.h"
#include "runtime/cuda/kernels/optimizer.h"
#include "runtime/cuda/optimizer.h"

namespace tandem::cuda {

absl::StatusOr<std::unique_ptr<CudaAccelerator>> CudaAccelerator::Create(
    int ordinal, int64_t memory_budget_bytes, const CudaAcceleratorOptions& options) {
  if (ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", ordinal, " is negative"));
  }
  if (memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA memory budget ", memory_budget_bytes, " bytes is negative"));
  }
  std::unique_ptr<CudaAccelerator> a(new CudaAccelerator(options));
  a->allocator_ = std::make_unique<CudaAllocator>(ordinal, memory_budget_bytes);
  CudaContextOptions context_options;
  context_options.allow_tf32 = options.allow_tf32;
  // Checks the device (FAILED_PRECONDITION without one) and makes it current.
  TANDEM_ASSIGN_OR_RETURN(a->ctx_,
                          CudaContext::Create(ordinal, a->allocator_.get(), context_options));
  TANDEM_ASSIGN_OR_RETURN(a->h2d_, CudaStream::Create(ordinal));
  TANDEM_ASSIGN_OR_RETURN(a->d2h_, CudaStream::Create(ordinal));
  TANDEM_ASSIGN_OR_RETURN(a->reduction_,
                          Buffer::Allocate(a->allocator_.get(), (kSumOfSquaresPartials + 1) * 8,
                                           MemoryCategory::kWorkspace));
  if (memory_budget_bytes == 0) {
    // Whatever the device has left, plus what the accelerator itself already took.
    size_t free_bytes = 0, total_bytes = 0;
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    a->allocator_->set_budget_bytes(static_cast<int64_t>(free_bytes) +
                                    a->allocator_->stats().total_in_use_bytes);
  }
  return a;
}

CudaAccelerator::CudaAccelerator(const CudaAcceleratorOptions& options)
    : pinned_(options.pinned_host_budget_bytes) {}

CudaAccelerator::~CudaAccelerator() {
  if (ctx_ == nullptr) return;
  cudaSetDevice(ordinal());
  {
    // Whoever registered should have unregistered; the pages are theirs.
    absl::MutexLock lock(&registered_mu_);
    for (const auto& [ptr, bytes] : registered_) cudaHostUnregister(ptr);
    registered_.clear();
  }
  // Copies are complete on return, but a failed call may have left one queued.
  if (h2d_.get() != nullptr) cudaStreamSynchronize(h2d_.get());
  if (d2h_.get() != nullptr) cudaStreamSynchronize(d2h_.get());
  reduction_.Reset();
  // ~CudaContext waits for the compute stream before releasing its memory.
}

absl::Status CudaAccelerator::RegisterHost(void* ptr, int64_t bytes) {
  if (ptr == nullptr || bytes <= 0) return absl::OkStatus();
  absl::MutexLock lock(&registered_mu_);
  if (registered_.contains(ptr)) {
    return absl::InvalidArgumentError(absl::StrCat(id(), ": host memory registered twice"));
  }
  const MemoryStats staging = pinned_.stats();
  const int64_t in_use = staging.total_in_use_bytes + registered_bytes_;
  if (staging.budget_bytes > 0 && in_use + bytes > staging.budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(id(), ": page-locking ", bytes, " bytes would pass the pinned host budget of ",
                     staging.budget_bytes, " bytes (", in_use, " in use)"));
  }
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal()), "cudaSetDevice"));
  const cudaError_t err =
      cudaHostRegister(ptr, static_cast<size_t>(bytes), cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Not sticky: the memory stays pageable and usable.
    return absl::UnavailableError(
        absl::StrCat(id(), ": cudaHostRegister of ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  registered_.emplace(ptr, bytes);
  registered_bytes_ += bytes;
  return absl::OkStatus();
}

void CudaAccelerator::UnregisterHost(void* ptr) {
  absl::MutexLock lock(&registered_mu_);
  auto it = registered_.find(ptr);
  if (it == registered_.end()) return;
  cudaSetDevice(ordinal());
  if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
  registered_bytes_ -= it->second;
  registered_.erase(it);
}

int64_t CudaAccelerator::pinned_host_bytes() {
  absl::MutexLock lock(&registered_mu_);
  return pinned_.stats().total_in_use_bytes + registered_bytes_;
}

LayerContext CudaAccelerator::ComputeContext() {
  // The executor's compute worker is a thread of its own: CUDA's current device
  // is per thread. A failure here surfaces at FinishCompute.
  ctx_->RecordError(ctx_->MakeCurrent());
  LayerContext c;
  c.device = DeviceKind::kCuda;
  c.cuda = ctx_.get();
  return c;
}

absl::Status CudaAccelerator::FinishCompute() {
  TANDEM_RETURN_IF_ERROR(ctx_->MakeCurrent());
  return ctx_->Synchronize();
}

absl::Status CudaAccelerator::Fill(float* dst, float value, int64_t n) {
  TANDEM_RETURN_IF_ERROR(ctx_->MakeCurrent());
  ctx_->Check(FillF32(dst, value, n, ctx_->stream), "FillF32");
  return ctx_->Synchronize();
}

absl::Status CudaAccelerator::UpdateSlice(const StepConstants& step, float* params,
                                          const float* grads, float* const* states, int64_t n) {
  TANDEM_RETURN_IF_ERROR(ctx_->MakeCurrent());
  ctx_->Check(cuda::UpdateSlice(ctx_.get(), step, params, grads, states, n));
  return ctx_->Synchronize();
}

absl::StatusOr<double> CudaAccelerator::SumOfSquares(const float* x, int64_t n) {
  TANDEM_RETURN_IF_ERROR(ctx_->MakeCurrent());
  double* partials = static_cast<double*>(reduction_.data());
  double* result = partials + kSumOfSquaresPartials;
  double host = 0;
  if (ctx_->Check(cuda::SumOfSquares(result, x, n, partials, ctx_->stream), "SumOfSquares")) {
    ctx_->Check(
        cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, ctx_->stream),
        "cudaMemcpyAsync");
  }
  // Also waits for the copy into `host` before it goes out of scope.
  TANDEM_RETURN_IF_ERROR(ctx_->Synchronize());
  return host;
}

absl::Status CudaAccelerator::Copy(void* dst, const void* src, int64_t bytes,
                                   const void* device_side, const CudaStream& stream,
                                   const char* direction) {
  if (bytes == 0) return absl::OkStatus();
  // Copy workers are threads of their own, and each has its current device.
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != ordinal()) {
    TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal()), "cudaSetDevice"));
  }
  // cudaMemcpyDefault would copy host to host without complaint: a swapped
  // pointer must be an error, as on the emulated device.
  cudaPointerAttributes attributes{};
  const cudaError_t query = cudaPointerGetAttributes(&attributes, device_side);
  if (query != cudaSuccess) {
    cudaGetLastError();  // Not sticky unless the device has failed, which the status says.
    return CudaStatus(query, "cudaPointerGetAttributes");
  }
  if (attributes.type != cudaMemoryTypeDevice || attributes.device != ordinal()) {
    return absl::InternalError(
        absl::StrCat(id(), ": copy ", direction, " a pointer outside device memory"));
  }
  TANDEM_RETURN_IF_ERROR(CopyAsync(dst, src, bytes, stream.get()));
  return stream.Synchronize();
}

absl::Status CudaAccelerator::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  return Copy(dst, src, bytes, dst, h2d_, "to");
}

absl::Status CudaAccelerator::CopyToHost(void* dst, const void* src, int64_t bytes) {
  return Copy(dst, src, bytes, src, d2h_, "from");
}

bool CudaAccelerator::HasPeerLink(Accelerator& from) {
  if (&from == this || from.kind() != DeviceKind::kCuda) return false;
  // Every kCuda accelerator is a CudaAccelerator (final).
  const int other = static_cast<CudaAccelerator&>(from).ordinal();
  if (other == ordinal()) return true;
  absl::MutexLock lock(&peers_mu_);
  if (auto it = peers_.find(other); it != peers_.end()) return it->second;
  int can = 0;
  bool linked = cudaSetDevice(ordinal()) == cudaSuccess &&
                cudaDeviceCanAccessPeer(&can, ordinal(), other) == cudaSuccess && can != 0;
  if (linked) {
    const cudaError_t err = cudaDeviceEnablePeerAccess(other, 0);
    linked = err == cudaSuccess || err == cudaErrorPeerAccessAlreadyEnabled;
  }
  cudaGetLastError();  // A refusal is an answer, not a sticky error.
  peers_[other] = linked;
  return linked;
}

absl::Status CudaAccelerator::CopyFromPeer(void* dst, Accelerator& from, const void* src,
                                           int64_t bytes) {
  if (!HasPeerLink(from)) {
    return absl::FailedPreconditionError(absl::StrCat(id(), " has no peer link to ", from.id()));
  }
  if (bytes == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(ordinal()), "cudaSetDevice"));
  cudaPointerAttributes attributes{};
  TANDEM_RETURN_IF_ERROR(
      CudaStatus(cudaPointerGetAttributes(&attributes, dst), "cudaPointerGetAttributes"));
  if (attributes.type != cudaMemoryTypeDevice || attributes.device != ordinal()) {
    return absl::InternalError(
        absl::StrCat(id(), ": peer copy to a pointer outside device memory"));
  }
  const int other = static_cast<CudaAccelerator&>(from).ordinal();
  const cudaError_t err =
      other == ordinal()
          ? cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                            h2d_.get())
          : cudaMemcpyPeerAsync(dst, ordinal(), src, other, static_cast<size_t>(bytes), h2d_.get());
  TANDEM_RETURN_IF_ERROR(CudaStatus(err, "cudaMemcpyPeerAsync"));
  return h2d_.Synchronize();
}

}  // namespace tandem::cuda
