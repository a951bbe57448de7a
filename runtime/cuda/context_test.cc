// CudaContext, streams, events and pinned memory. The first two tests run
// without a GPU too (they check how the absence of one is reported).
#include "runtime/cuda/context.h"

#include <vector>

#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"
#include "runtime/cuda/kernels/elementwise.h"
#include "runtime/cuda/test_util.h"

namespace tandem::cuda {
namespace {

TEST(CudaContextTest, WithoutADeviceCreationIsAFailedPreconditionSayingWhy) {
  std::string why;
  if (!QueryCudaDevices(&why).empty()) GTEST_SKIP() << "a CUDA device is present";
  CudaAllocator allocator(0);
  absl::StatusOr<std::unique_ptr<CudaContext>> ctx = CudaContext::Create(0, &allocator);
  ASSERT_FALSE(ctx.ok());
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kFailedPrecondition) << ctx.status();
  // The runtime's own words (cudaGetErrorString), as the device query reports them.
  EXPECT_NE(ctx.status().message().find("no CUDA device"), std::string::npos) << ctx.status();
  const size_t colon = why.find(": ");
  if (colon != std::string::npos) {
    const std::string runtime_text = why.substr(colon + 2);
    EXPECT_NE(ctx.status().message().find(runtime_text), std::string::npos)
        << ctx.status() << " vs " << why;
  }
}

TEST(PinnedHostAllocatorTest, WithoutADriverAllocationsAreRefusedNotFatal) {
  if (!QueryCudaDevices().empty()) GTEST_SKIP() << "a CUDA device is present";
  PinnedHostAllocator pinned;
  absl::StatusOr<void*> p = pinned.Allocate(4096, MemoryCategory::kActivations);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_EQ(pinned.stats().total_in_use_bytes, 0);
  EXPECT_EQ(pinned.stats().refusals, 1);
}

TEST(CudaContextTest, HoldsHandlesOnItsStreamWithTf32) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice(/*allow_tf32=*/true);
  CudaContext* ctx = d.ctx.get();
  EXPECT_EQ(ctx->device, 0);
  ASSERT_NE(ctx->stream, nullptr);
  ASSERT_NE(ctx->cublas, nullptr);
  ASSERT_NE(ctx->cudnn, nullptr);
  cublasMath_t mode;
  ASSERT_EQ(cublasGetMathMode(ctx->cublas, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode, CUBLAS_TF32_TENSOR_OP_MATH);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cublasGetStream(ctx->cublas, &s), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(s, ctx->stream);
  ASSERT_EQ(cudnnGetStream(ctx->cudnn, &s), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(s, ctx->stream);
  ASSERT_TRUE(ctx->SetAllowTf32(false).ok());
  ASSERT_EQ(cublasGetMathMode(ctx->cublas, &mode), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mode, CUBLAS_DEFAULT_MATH);
  // The cuBLAS workspace is accounted as workspace.
  EXPECT_EQ(d.allocator->stats().in_use(MemoryCategory::kWorkspace),
            ctx->options().cublas_workspace_bytes);
}

TEST(CudaContextTest, RejectsAMissingOrdinal) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CudaAllocator allocator(4096);
  absl::StatusOr<std::unique_ptr<CudaContext>> ctx = CudaContext::Create(4096, &allocator);
  EXPECT_EQ(ctx.status().code(), absl::StatusCode::kInvalidArgument) << ctx.status();
}

TEST(CudaContextTest, ScratchGrowsFromTheAllocatorAndIsRefusedOverBudget) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  CudaAllocator allocator(0, /*budget_bytes=*/64 << 20);
  CudaContextOptions options;
  options.cublas_workspace_bytes = 0;
  std::unique_ptr<CudaContext> ctx = *CudaContext::Create(0, &allocator, options);
  void* a = ctx->Scratch(1 << 20);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(ctx->Scratch(1000), a);  // Big enough: the same block.
  EXPECT_NE(ctx->Scratch(4 << 20), nullptr);
  EXPECT_GE(allocator.stats().in_use(MemoryCategory::kWorkspace), 4 << 20);
  EXPECT_EQ(ctx->Scratch(int64_t{1} << 30), nullptr);
  EXPECT_EQ(ctx->status().code(), absl::StatusCode::kResourceExhausted) << ctx->status();
}

TEST(CudaContextTest, KeepsTheFirstError) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  EXPECT_TRUE(d.ctx->Check(cudaSuccess, "fine"));
  EXPECT_FALSE(d.ctx->Check(cudaErrorInvalidValue, "first"));
  EXPECT_FALSE(d.ctx->Check(cudaErrorMemoryAllocation, "second"));
  const absl::Status s = d.ctx->Synchronize();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("first"), std::string::npos) << s;
}

TEST(CudaStreamTest, EventsOrderTwoStreamsAndTimeThem) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  CudaStream copy = *CudaStream::Create(0);
  CudaEvent filled = *CudaEvent::Create();
  CudaEvent start = *CudaEvent::Create(/*timing=*/true), end = *CudaEvent::Create(true);
  constexpr int64_t n = 1 << 22;
  Buffer device = DeviceZeros(d.ctx.get(), n * 4);
  PinnedHostAllocator pinned;
  Buffer host = *Buffer::Allocate(&pinned, n * 4, MemoryCategory::kActivations);
  EXPECT_EQ(pinned.stats().in_use(MemoryCategory::kActivations), n * 4);

  ASSERT_TRUE(start.Record(d.ctx->stream).ok());
  ASSERT_EQ(FillF32(device.f32(), 2.5f, n, d.ctx->stream), cudaSuccess);
  ASSERT_TRUE(filled.Record(d.ctx->stream).ok());
  ASSERT_TRUE(end.Record(d.ctx->stream).ok());
  // The copy stream waits for the fill on the device, not on the host.
  ASSERT_TRUE(filled.WaitOn(copy.get()).ok());
  ASSERT_TRUE(CopyAsync(host.data(), device.data(), n * 4, copy.get()).ok());
  ASSERT_TRUE(copy.Synchronize().ok());
  for (int64_t i = 0; i < n; i += 4097) ASSERT_EQ(host.f32()[i], 2.5f) << i;
  ASSERT_TRUE(end.Synchronize().ok());
  EXPECT_TRUE(*end.Done());
  const double seconds = *CudaEvent::ElapsedSeconds(start, end);
  EXPECT_GE(seconds, 0.0);
  EXPECT_LT(seconds, 1.0);
}

TEST(PinnedHostAllocatorTest, AccountsAndEnforcesTheBudget) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  PinnedHostAllocator pinned(/*budget_bytes=*/1 << 20);
  EXPECT_EQ(pinned.device_id(), "cpu:pinned");
  Buffer a = *Buffer::Allocate(&pinned, 800 << 10, MemoryCategory::kOptimizerState);
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, a.data()), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  absl::StatusOr<Buffer> b = Buffer::Allocate(&pinned, 300 << 10, MemoryCategory::kGradients);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem::cuda
