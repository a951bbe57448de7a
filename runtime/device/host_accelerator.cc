#include "runtime/device/host_accelerator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "runtime/optim/kernels.h"

namespace tandem {

HostAccelerator::HostAccelerator(int64_t budget_bytes, std::string id)
    : id_(std::move(id)), memory_(budget_bytes, id_) {}

LayerContext HostAccelerator::ComputeContext() {
  LayerContext ctx;
  ctx.device = DeviceKind::kCpu;
  return ctx;
}

absl::Status HostAccelerator::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status HostAccelerator::CopyToHost(void* dst, const void* src, int64_t bytes) {
  return CopyToDevice(dst, src, bytes);
}

absl::Status HostAccelerator::Fill(float* dst, float value, int64_t n) {
  std::fill(dst, dst + n, value);
  return absl::OkStatus();
}

absl::Status HostAccelerator::UpdateSlice(const StepConstants& step, float* params,
                                          const float* grads, float* const* states, int64_t n) {
  Optimizer::UpdateSlice(step, params, grads, states, n);
  return absl::OkStatus();
}

absl::StatusOr<double> HostAccelerator::SumOfSquares(const float* x, int64_t n) {
  return optim::SumOfSquares(x, n);
}

}  // namespace tandem
