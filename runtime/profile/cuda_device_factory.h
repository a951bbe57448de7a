// Opens a CUDA GPU as a ProfiledDevice, from code built with or without the
// CUDA toolkit (`tandem profile`, tandemd, tests): this header names no CUDA
// type. In a CUDA build it returns a CudaProfiledDevice (cuda_device.h);
// without the toolkit, or where no device or driver is present, it fails with
// FAILED_PRECONDITION, so callers profile the host alone. Thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_FACTORY_H_
#define TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/profile/profiled_device.h"

namespace tandem::profile {

struct CudaProfiledDeviceOptions {
  // TF32 tensor cores for fp32 GEMMs and convolutions, in the layers, the
  // iteration and the GEMM peak. On by default, as in CudaAcceleratorOptions,
  // so the profile times what training runs.
  bool allow_tf32 = true;
  // The GEMM peak: a square cuBLAS SGEMM of m = n = k = gemm_size.
  int64_t gemm_size = 4096;
  // The memory bandwidth peak: a device-to-device copy of this many bytes.
  int64_t copy_bytes = int64_t{256} << 20;
  // Timed runs of each peak after one warm-up; the median is reported.
  int peak_repeats = 10;
};

// CUDA device `ordinal` as "cuda:<ordinal>". Makes it current on the calling
// thread.
//
// Errors: INVALID_ARGUMENT for a negative ordinal, or one past the last device;
// FAILED_PRECONDITION "built without CUDA: ..." in a build without the toolkit,
// and the device query's reason ("no CUDA device: <the runtime's reason>")
// where there is no usable device or driver; the CUDA, cuBLAS or cuDNN error
// when the device's context cannot be made.
absl::StatusOr<std::unique_ptr<ProfiledDevice>> CreateCudaProfiledDevice(
    int ordinal, const CudaProfiledDeviceOptions& options = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUDA_DEVICE_FACTORY_H_
