#include "runtime/cuda/test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem::cuda {

absl::StatusOr<TestDevice> MakeTestDevice(bool allow_tf32, bool bf16_convolutions) {
  TestDevice d;
  d.allocator = std::make_unique<CudaAllocator>(0);
  CudaContextOptions options;
  options.allow_tf32 = allow_tf32;
  options.bf16_convolutions = bf16_convolutions;
  TANDEM_ASSIGN_OR_RETURN(d.ctx, CudaContext::Create(0, d.allocator.get(), options));
  return d;
}

Buffer DeviceZeros(CudaContext* ctx, int64_t bytes) {
  Buffer b =
      *Buffer::Allocate(ctx->allocator, std::max<int64_t>(bytes, 1), MemoryCategory::kWorkspace);
  EXPECT_EQ(cudaMemsetAsync(b.data(), 0, static_cast<size_t>(b.bytes()), ctx->stream), cudaSuccess);
  return b;
}

double ScaledMaxError(const std::vector<float>& expected, const std::vector<float>& actual,
                      double floor) {
  double scale = floor, worst = 0;
  for (float e : expected) scale = std::max(scale, std::fabs(static_cast<double>(e)));
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    const double d = std::fabs(static_cast<double>(expected[i]) - actual[i]);
    worst = std::max(worst, std::isnan(d) ? INFINITY : d);
  }
  return worst / scale;
}

::testing::AssertionResult Close(const std::vector<float>& expected,
                                 const std::vector<float>& actual, double tolerance,
                                 const std::string& what) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.size() << " elements, expected " << expected.size();
  }
  const double error = ScaledMaxError(expected, actual);
  if (error <= tolerance) return ::testing::AssertionSuccess();
  size_t worst = 0;
  double worst_d = -1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double d = std::fabs(static_cast<double>(expected[i]) - actual[i]);
    if (!(d <= worst_d)) {
      worst_d = d;
      worst = i;
    }
  }
  return ::testing::AssertionFailure()
         << what << ": scaled max error " << error << " > " << tolerance << "; element " << worst
         << " is " << actual[worst] << ", expected " << expected[worst];
}

::testing::AssertionResult BitwiseEqual(const std::vector<float>& expected,
                                        const std::vector<float>& actual, const std::string& what) {
  if (expected.size() != actual.size()) {
    return ::testing::AssertionFailure()
           << what << ": " << actual.size() << " elements, expected " << expected.size();
  }
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&expected[i], &actual[i], sizeof(float)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++differ;
    }
  }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << differ << " of " << expected.size() << " elements differ; first "
         << first << " is " << actual[first] << ", expected " << expected[first];
}

}  // namespace tandem::cuda
