// cuda::Matmul against cpu::Matmul on the same MatmulShapes: transposes, padded
// leading dimensions, batch strides, alpha, accumulation and bias. Compared in
// full fp32 (TF32 off); the TF32 error is measured and reported as a property.
// Skipped without a GPU.
#include "runtime/cuda/blas.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cuda/device_query.h"
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

void RunCase(const Case& c, CudaContext* ctx, double tolerance, double* error_out) {
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
  cpu::Matmul(s, a.data(), b.data(), expected.data(), s.bias ? bias.data() : nullptr);
  Buffer da = Upload(ctx, a), db = Upload(ctx, b), dc = Upload(ctx, c0), dbias = Upload(ctx, bias);
  const absl::Status st =
      Matmul(ctx, s, da.f32(), db.f32(), dc.f32(), s.bias ? dbias.f32() : nullptr);
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
