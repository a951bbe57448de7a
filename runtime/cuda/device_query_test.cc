#include "runtime/cuda/device_query.h"

#include <vector>

#include "gtest/gtest.h"

#ifdef TANDEM_HAVE_CUDA
#include "runtime/cuda/kernels/elementwise.h"
#endif

namespace tandem::cuda {
namespace {

TEST(DeviceQueryTest, ExplainsAnEmptyResult) {
  std::string why;
  const std::vector<CudaDeviceInfo> devices = QueryCudaDevices(&why);
  if (devices.empty()) {
    EXPECT_FALSE(why.empty());
  }
  for (const CudaDeviceInfo& d : devices) {
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_GT(d.multiprocessors, 0);
  }
}

#ifdef TANDEM_HAVE_CUDA
// Runs on a GPU machine; here (no device) it reports itself skipped.
TEST(ElementwiseKernelTest, FillThenScaleMatchesHost) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t n = 100003;
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(FillF32(d, 1.5f, n, nullptr), cudaSuccess);
  ASSERT_EQ(ScaleF32(d, -2.0f, n, nullptr), cudaSuccess);
  std::vector<float> h(n);
  ASSERT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  for (float v : h) ASSERT_EQ(v, -3.0f);
}
#endif

}  // namespace
}  // namespace tandem::cuda
