#include "runtime/cuda/accelerator_factory.h"

#include "absl/strings/str_cat.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/cuda_accelerator.h"
#endif

namespace tandem::cuda {

absl::StatusOr<std::unique_ptr<Accelerator>> CreateCudaAccelerator(
    int device_ordinal, int64_t memory_budget_bytes, const CudaAcceleratorOptions& options) {
#ifdef TANDEM_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<CudaAccelerator>> accelerator =
      CudaAccelerator::Create(device_ordinal, memory_budget_bytes, options);
  if (!accelerator.ok()) return accelerator.status();
  return std::unique_ptr<Accelerator>(std::move(accelerator).value());
#else
  // Bad arguments are reported as such in every build.
  if (device_ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", device_ordinal, " is negative"));
  }
  if (memory_budget_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA memory budget ", memory_budget_bytes, " bytes is negative"));
  }
  return absl::FailedPreconditionError(
      "built without CUDA: this binary was compiled without the CUDA toolkit, so it has no GPU "
      "backend");
#endif
}

}  // namespace tandem::cuda
