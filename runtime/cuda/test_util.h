// Helpers for the CUDA tests: a context on device 0, host<->device copies and
// error measures for comparing a GPU result with its CPU reference. For tests
// only; CUDA builds only. Not thread-safe (one test thread).
#ifndef TANDEM_RUNTIME_CUDA_TEST_UTIL_H_
#define TANDEM_RUNTIME_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "runtime/core/allocator.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/context.h"

namespace tandem::cuda {

// An allocator and a context on device 0.
struct TestDevice {
  std::unique_ptr<CudaAllocator> allocator;
  std::unique_ptr<CudaContext> ctx;
};
absl::StatusOr<TestDevice> MakeTestDevice(bool allow_tf32 = false, bool bf16_convolutions = false);

// Device copies of host data, complete on return; an empty vector gives an empty
// Buffer. Copies go through ctx->stream: the context's stream is non-blocking,
// so work on the legacy default stream (plain cudaMemcpy/cudaMemset) would not
// be ordered before its kernels.
template <typename T>
Buffer Upload(CudaContext* ctx, const std::vector<T>& host) {
  Buffer b = *Buffer::Allocate(ctx->allocator, static_cast<int64_t>(host.size() * sizeof(T)),
                               MemoryCategory::kActivations);
  if (!host.empty()) {
    EXPECT_EQ(cudaMemcpyAsync(b.data(), host.data(), host.size() * sizeof(T),
                              cudaMemcpyHostToDevice, ctx->stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(ctx->stream), cudaSuccess);
  }
  return b;
}

// n elements of device memory, after the context's stream has finished.
template <typename T>
std::vector<T> Download(CudaContext* ctx, const void* device, int64_t n) {
  EXPECT_TRUE(ctx->Synchronize().ok()) << ctx->status();
  std::vector<T> host(n);
  if (n > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

// Device memory of `bytes` (at least one byte), zeroed on ctx->stream.
Buffer DeviceZeros(CudaContext* ctx, int64_t bytes);

// max |actual - expected| / max(max |expected|, floor): the error relative to
// the tensor's scale, which is what fp32 reordering and TF32 perturb.
double ScaledMaxError(const std::vector<float>& expected, const std::vector<float>& actual,
                      double floor = 1e-6);

// Passes when ScaledMaxError <= tolerance; says where the worst element is.
::testing::AssertionResult Close(const std::vector<float>& expected,
                                 const std::vector<float>& actual, double tolerance,
                                 const std::string& what);

// Passes when the two are bitwise equal.
::testing::AssertionResult BitwiseEqual(const std::vector<float>& expected,
                                        const std::vector<float>& actual, const std::string& what);

}  // namespace tandem::cuda

#endif  // TANDEM_RUNTIME_CUDA_TEST_UTIL_H_
