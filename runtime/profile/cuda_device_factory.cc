#include "runtime/profile/cuda_device_factory.h"

#include "absl/strings/str_cat.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/profile/cuda_device.h"
#endif

namespace tandem::profile {

absl::StatusOr<std::unique_ptr<ProfiledDevice>> CreateCudaProfiledDevice(
    int ordinal, const CudaProfiledDeviceOptions& options) {
  // Bad arguments are reported as such in every build.
  if (ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ordinal ", ordinal, " is negative"));
  }
#ifdef TANDEM_HAVE_CUDA
  absl::StatusOr<std::unique_ptr<CudaProfiledDevice>> device =
      CudaProfiledDevice::Create(ordinal, options);
  if (!device.ok()) return device.status();
  return std::unique_ptr<ProfiledDevice>(std::move(device).value());
#else
  return absl::FailedPreconditionError(
      "built without CUDA: this binary was compiled without the CUDA toolkit, so it has no GPU "
      "to profile");
#endif
}

}  // namespace tandem::profile
