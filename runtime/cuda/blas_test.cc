// cuda::Matmul against cpu::Matmul on the same MatmulShapes: transposes, padded
// leading dimensions, batch strides, alpha, accumulation and bias. Compared in
// full fp32 (TF32 off); the TF32 error is measured and reported as a property.
// cuda::MatmulBf16 against cpu::MatmulBf16 on the same bf16 operands (rounded by
// cuda::ToBf16 on the GPU, bitwise the CPU's rounding). Skipped without a GPU.
#include "runtime/cuda/blas.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cuda/device_query.h"
#include "runtime/cuda/kernels/elementwise.h"
#include "runtime/cuda/test_util.h"

namespace tandem::cuda {
namespace {

struct Case {
  const char* name;
  cpu::MatmulShape shape;
};

// Elements a strided operand spans: rows x ld per batch.
int64_t Span(int64_t batch, int64_t batch_stride, int64_t rows, int64_t ld) {
  return (batch - 1) * batch_stride + rows * ld;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cpu::MatmulShape s;
  s.m = 33;
  s.n = 17;
  s.k = 65;
  cases.push_back({"plain", s});
  s.trans_b = true;
  s.bias = true;
  cases.push_back({"linear forward (B^T, bias)", s});
  s.trans_b = false;
  s.bias = false;
  s.trans_a = true;
  s.accumulate = true;
  cases.push_back({"weight gradient (A^T, accumulate)", s});
  cpu::MatmulShape att;  // q k^T / sqrt(hs) over 6 heads
  att.batch = 6;
  att.m = 20;
  att.n = 20;
  att.k = 8;
  att.trans_b = true;
  att.alpha = 0.35355339f;
  cases.push_back({"batched scores (alpha)", att});
  cpu::MatmulShape strided;  // padded rows and batch strides
  strided.batch = 3;
  strided.m = 9;
  strided.n = 10;
  strided.k = 11;
  strided.lda = 13;
  strided.ldb = 12;
  strided.ldc = 15;
  strided.batch_stride_a = 9 * 13 + 5;
  strided.batch_stride_b = 11 * 12 + 1;
  strided.batch_stride_c = 9 * 15 + 7;
  strided.trans_a = false;
  strided.accumulate = true;
  cases.push_back({"strided, accumulate", strided});
  return cases;
}

// With `bf16`, both devices multiply a and b rounded to bf16: the GPU rounds
// them itself, and its bf16 copies must be bitwise the CPU's.
void RunCase(const Case& c, CudaContext* ctx, double tolerance, double* error_out,
             bool bf16 = false, bool fp16 = false) {
  const cpu::MatmulShape& s = c.shape;
  const int64_t lda = s.lda ? s.lda : (s.trans_a ? s.m : s.k);
  const int64_t ldb = s.ldb ? s.ldb : (s.trans_b ? s.k : s.n);
  const int64_t ldc = s.ldc ? s.ldc : s.n;
  const int64_t bsa = s.batch_stride_a ? s.batch_stride_a : s.m * s.k;
  const int64_t bsb = s.batch_stride_b ? s.batch_stride_b : s.k * s.n;
  const int64_t bsc = s.batch_stride_c ? s.batch_stride_c : s.m * s.n;
  const int64_t na = Span(s.batch, bsa, s.trans_a ? s.k : s.m, lda);
  const int64_t nb = Span(s.batch, bsb, s.trans_b ? s.n : s.k, ldb);
  const int64_t nc = Span(s.batch, bsc, s.m, ldc);
  std::vector<float> a(na), b(nb), c0(nc), bias(s.n);
  FillUniform(a.data(), na, -1, 1, 1, 1);
  FillUniform(b.data(), nb, -1, 1, 1, 2);
  FillUniform(c0.data(), nc, -1, 1, 1, 3);
  FillUniform(bias.data(), s.n, -1, 1, 1, 4);
  std::vector<float> expected = c0;
  std::vector<uint16_t> a16(na), b16(nb);
  const float* cbias = s.bias ? bias.data() : nullptr;
  if (bf16) {
    cpu::ToBf16(a.data(), a16.data(), na);
    cpu::ToBf16(b.data(), b16.data(), nb);
    cpu::MatmulBf16(s, a16.data(), b16.data(), expected.data(), cbias);
  } else if (fp16) {
    cpu::ToF16(a.data(), a16.data(), na);
    cpu::ToF16(b.data(), b16.data(), nb);
    cpu::MatmulF16(s, a16.data(), b16.data(), expected.data(), cbias);
  } else {
    cpu::Matmul(s, a.data(), b.data(), expected.data(), cbias);
  }
  Buffer da = Upload(ctx, a), db = Upload(ctx, b), dc = Upload(ctx, c0), dbias = Upload(ctx, bias);
  const float* gbias = s.bias ? dbias.f32() : nullptr;
  absl::Status st;
  if (bf16) {
    Buffer ga = DeviceZeros(ctx, na * 2), gb = DeviceZeros(ctx, nb * 2);
    auto* ga16 = static_cast<uint16_t*>(ga.data());
    auto* gb16 = static_cast<uint16_t*>(gb.data());
    ASSERT_EQ(ToBf16(da.f32(), ga16, na, ctx->stream), cudaSuccess);
    ASSERT_EQ(ToBf16(db.f32(), gb16, nb, ctx->stream), cudaSuccess);
    EXPECT_EQ(Download<uint16_t>(ctx, ga16, na), a16) << c.name << ": A's bf16 rounding";
    EXPECT_EQ(Download<uint16_t>(ctx, gb16, nb), b16) << c.name << ": B's bf16 rounding";
    st = MatmulBf16(ctx, s, ga16, gb16, dc.f32(), gbias);
  } else if (fp16) {
    Buffer ga = DeviceZeros(ctx, na * 2), gb = DeviceZeros(ctx, nb * 2);
    auto* ga16 = static_cast<uint16_t*>(ga.data());
    auto* gb16 = static_cast<uint16_t*>(gb.data());
    ASSERT_EQ(ToF16(da.f32(), ga16, na, ctx->stream), cudaSuccess);
    ASSERT_EQ(ToF16(db.f32(), gb16, nb, ctx->stream), cudaSuccess);
    EXPECT_EQ(Download<uint16_t>(ctx, ga16, na), a16) << c.name << ": A's fp16 rounding";
    EXPECT_EQ(Download<uint16_t>(ctx, gb16, nb), b16) << c.name << ": B's fp16 rounding";
    st = MatmulF16(ctx, s, ga16, gb16, dc.f32(), gbias);
  } else {
    st = Matmul(ctx, s, da.f32(), db.f32(), dc.f32(), gbias);
  }
  ASSERT_TRUE(st.ok()) << c.name << ": " << st;
  std::vector<float> got = Download<float>(ctx, dc.data(), nc);
  // Whole buffers: the padding between rows and batches must be left as it was.
  EXPECT_TRUE(Close(expected, got, tolerance, c.name));
  *error_out = ScaledMaxError(expected, got);
}

TEST(CudaMatmulTest, MatchesTheCpuInFp32) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice(/*allow_tf32=*/false);
  for (const Case& c : Cases()) {
    double error = 0;
    RunCase(c, d.ctx.get(), 1e-5, &error);
  }
}

TEST(CudaMatmulTest, Tf32ErrorStaysWithinItsPrecision) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice(/*allow_tf32=*/true);
  double worst = 0;
  for (const Case& c : Cases()) {
    double error = 0;
    // TF32 keeps 10 mantissa bits of each input (relative error 2^-11 per
    // operand); sums of k products of magnitude ~1 stay well within 1e-2 of scale.
    RunCase(c, d.ctx.get(), 1e-2, &error);
    worst = std::max(worst, error);
  }
  ::testing::Test::RecordProperty("tf32_scaled_max_error", std::to_string(worst));
  std::cout << "TF32 GEMM scaled max error vs the CPU: " << worst << "\n";
}

TEST(CudaMatmulTest, Fp16MatchesTheCpusFp16Product) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice(/*allow_tf32=*/true);
  double worst = 0;
  for (const Case& c : Cases()) {
    double error = 0;
    // The same fp16 operands; every product of two fp16 values is exact in
    // fp32 on both; the sums run in another order.
    RunCase(c, d.ctx.get(), 1e-5, &error, /*bf16=*/false, /*fp16=*/true);
    worst = std::max(worst, error);
  }
  ::testing::Test::RecordProperty("fp16_scaled_max_error", std::to_string(worst));
  std::cout << "fp16 GEMM scaled max error vs the CPU's fp16 product: " << worst << "\n";
}

TEST(CudaMatmulTest, Bf16MatchesTheCpusBf16Product) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  // TF32 on: the bf16 path must not depend on it.
  TestDevice d = *MakeTestDevice(/*allow_tf32=*/true);
  double worst = 0;
  for (const Case& c : Cases()) {
    double error = 0;
    // Same bf16 operands, exact products, fp32 sums in another order.
    RunCase(c, d.ctx.get(), 1e-5, &error, /*bf16=*/true);
    worst = std::max(worst, error);
  }
  ::testing::Test::RecordProperty("bf16_scaled_max_error", std::to_string(worst));
  std::cout << "bf16 GEMM scaled max error vs the CPU's bf16 product: " << worst << "\n";
}

TEST(CudaMatmulTest, RejectsShapesBeyondInt32) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  cpu::MatmulShape s;
  s.m = int64_t{1} << 32;
  s.n = 1;
  s.k = 1;
  EXPECT_EQ(Matmul(d.ctx.get(), s, nullptr, nullptr, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::cuda
