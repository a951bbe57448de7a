// CreateCudaAccelerator as code built with or without the toolkit sees it. These
// tests run everywhere; where a GPU is present, cuda_accelerator_test covers
// the accelerator itself.
#include "runtime/cuda/accelerator_factory.h"

#include <string>

#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"

namespace tandem::cuda {
namespace {

TEST(CreateCudaAcceleratorTest, WithoutADeviceIsAFailedPreconditionSayingWhy) {
  std::string why;
  if (!QueryCudaDevices(&why).empty()) GTEST_SKIP() << "a CUDA device is present";
  absl::StatusOr<std::unique_ptr<Accelerator>> a = CreateCudaAccelerator(0, int64_t{1} << 30);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  const std::string expected = BuiltWithCuda() ? "no CUDA device" : "built without CUDA";
  EXPECT_NE(a.status().message().find(expected), std::string::npos) << a.status();
  if (BuiltWithCuda()) {
    // The runtime's own reason, as the device query reports it.
    const size_t colon = why.find(": ");
    if (colon != std::string::npos) {
      EXPECT_NE(a.status().message().find(why.substr(colon + 2)), std::string::npos)
          << a.status() << " vs " << why;
    }
  }
}

TEST(CreateCudaAcceleratorTest, NegativeArgumentsAreInvalidInEveryBuild) {
  absl::StatusOr<std::unique_ptr<Accelerator>> a = CreateCudaAccelerator(-1, 0);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(a.status().message().find("ordinal -1"), std::string::npos) << a.status();
  a = CreateCudaAccelerator(0, -5);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
  EXPECT_NE(a.status().message().find("budget -5"), std::string::npos) << a.status();
}

}  // namespace
}  // namespace tandem::cuda
