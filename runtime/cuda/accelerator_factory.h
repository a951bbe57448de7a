// Opens a CUDA GPU as the plan executor's Accelerator, from code that is built
// with or without the CUDA toolkit (the daemon, the trainer, tests): this header
// names no CUDA type. In a CUDA build it returns a CudaAccelerator
// (cuda_accelerator.h); without the toolkit, or where no device or driver is
// present, it fails with FAILED_PRECONDITION, so callers fall back to the CPU.
// Thread-safe.
#ifndef TANDEM_RUNTIME_CUDA_ACCELERATOR_FACTORY_H_
#define TANDEM_RUNTIME_CUDA_ACCELERATOR_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/device/accelerator.h"

namespace tandem::cuda {

struct CudaAcceleratorOptions {
  // TF32 tensor cores for fp32 GEMMs and convolutions (CudaContextOptions).
  bool allow_tf32 = true;
  // Budget of the pinned host staging memory (host_staging_allocator());
  // 0 = unlimited.
  int64_t pinned_host_budget_bytes = 0;
};

// Device `device_ordinal` with a hard budget of `memory_budget_bytes` of device
// memory (0 = the device's free memory when it is opened). The budget covers
// everything the accelerator allocates, including its own fixed workspace
// (cuBLAS's 32 MiB and a few KiB for reductions), which is in use on return:
// allocator()->stats().total_in_use_bytes says how much.
//
// Errors: INVALID_ARGUMENT for a negative ordinal or budget, or an ordinal past
// the last device; FAILED_PRECONDITION "built without CUDA" in a build without
// the toolkit and "no CUDA device: <the runtime's reason>" where there is no
// usable device or driver; RESOURCE_EXHAUSTED when the budget cannot hold the
// fixed workspace.
absl::StatusOr<std::unique_ptr<Accelerator>> CreateCudaAccelerator(
    int device_ordinal, int64_t memory_budget_bytes, const CudaAcceleratorOptions& options = {});

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_ACCELERATOR_FACTORY_H_
