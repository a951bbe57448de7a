// The host itself as an Accelerator: its memory is ordinary host memory with
// byte accounting (HostAllocator), its compute the CPU kernels on the calling
// thread, its "copies" memcpy, and it has no staging memory of its own. It is
// what the CPU's profiled device (runtime/profile/cpu_device.h) composes, so
// that every ProfiledDevice is an Accelerator plus measurement. Thread-safe in
// Accelerator's sense.
#ifndef TANDEM_RUNTIME_DEVICE_HOST_ACCELERATOR_H_
#define TANDEM_RUNTIME_DEVICE_HOST_ACCELERATOR_H_

#include <cstdint>
#include <string>

#include "runtime/device/accelerator.h"

namespace tandem {

class HostAccelerator final : public Accelerator {
 public:
  // `budget_bytes` caps allocator(); 0 = no cap.
  explicit HostAccelerator(int64_t budget_bytes = 0, std::string id = "cpu");

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  const std::string& id() const override { return id_; }
  Allocator* allocator() override { return &memory_; }
  // Host memory needs no staging: the same allocator.
  Allocator* host_staging_allocator() override { return &memory_; }
  LayerContext ComputeContext() override;
  absl::Status FinishCompute() override { return absl::OkStatus(); }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  absl::Status Fill(float* dst, float value, int64_t n) override;
  absl::Status UpdateSlice(const StepConstants& step, float* params, const float* grads,
                           float* const* states, int64_t n) override;
  absl::StatusOr<double> SumOfSquares(const float* x, int64_t n) override;

 private:
  const std::string id_;
  HostAllocator memory_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DEVICE_HOST_ACCELERATOR_H_
