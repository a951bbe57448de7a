// The custom kernels against their CPU references (cpu/kernels.h, core/random.h,
// or plain loops where the CPU reference lives inside a layer; the layers
// themselves are compared in layers_cuda_test.cc). Skipped without a GPU.
#include "runtime/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cuda/device_query.h"
#include "runtime/cuda/kernels/activation.h"
#include "runtime/cuda/kernels/attention.h"
#include "runtime/cuda/kernels/batchnorm.h"
#include "runtime/cuda/kernels/conv_layout.h"
#include "runtime/cuda/kernels/elementwise.h"
#include "runtime/cuda/kernels/layernorm.h"
#include "runtime/cuda/kernels/softmax.h"
#include "runtime/cuda/test_util.h"

namespace tandem::cuda {
namespace {

std::vector<float> Uniform(int64_t n, uint64_t stream, float low = -1.0f, float high = 1.0f) {
  std::vector<float> v(n);
  FillUniform(v.data(), n, low, high, 42, stream);
  return v;
}

TEST(DropoutKernelTest, PhiloxUniformsAreBitwiseTheCpus) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t n = 100003;  // Not a multiple of 4: the tail block is partial.
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
    for (uint64_t stream : {uint64_t{0}, uint64_t{123456789}, uint64_t{1} << 40}) {
      Buffer out = DeviceZeros(d.ctx.get(), n * 4);
      ASSERT_EQ(PhiloxUniforms(out.f32(), n, seed, stream, d.ctx->stream), cudaSuccess);
      std::vector<float> cpu(n);
      for (int64_t i = 0; i < n; ++i) cpu[i] = UniformAt(seed, stream, i);
      EXPECT_TRUE(BitwiseEqual(cpu, Download<float>(d.ctx.get(), out.data(), n), "uniforms"));
    }
  }
}

TEST(DropoutKernelTest, MasksAndValuesAreBitwiseTheCpus) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t n = 65537;
  const std::vector<float> x = Uniform(n, 1), dy = Uniform(n, 2);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    std::vector<float> y(n), dx(n);
    cpu::DropoutForward(x.data(), y.data(), n, p, 5, 6);
    cpu::DropoutBackward(dy.data(), dx.data(), n, p, 5, 6);
    Buffer dx_in = Upload(d.ctx.get(), x), dy_in = Upload(d.ctx.get(), dy);
    Buffer y_out = DeviceZeros(d.ctx.get(), n * 4), dx_out = DeviceZeros(d.ctx.get(), n * 4);
    ASSERT_EQ(DropoutForward(y_out.f32(), dx_in.f32(), n, p, 5, 6, d.ctx->stream), cudaSuccess);
    ASSERT_EQ(DropoutBackward(dx_out.f32(), dy_in.f32(), n, p, 5, 6, d.ctx->stream), cudaSuccess);
    EXPECT_TRUE(BitwiseEqual(y, Download<float>(d.ctx.get(), y_out.data(), n), "dropout y"));
    EXPECT_TRUE(BitwiseEqual(dx, Download<float>(d.ctx.get(), dx_out.data(), n), "dropout dx"));
  }
}

TEST(ElementwiseKernelTest, ColumnSumMatchesTheCpuAndIsDeterministic) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {1000, 37}, {4099, 768}}) {
    const std::vector<float> dy = Uniform(rows * cols, 3);
    std::vector<float> expected(cols, 0.25f);
    cpu::ColumnSum(dy.data(), rows, cols, expected.data(), /*accumulate=*/true);
    Buffer in = Upload(d.ctx.get(), dy);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      Buffer out = Upload(d.ctx.get(), std::vector<float>(cols, 0.25f));
      ASSERT_EQ(ColumnSum(out.f32(), in.f32(), rows, cols, true, d.ctx->stream), cudaSuccess);
      std::vector<float> got = Download<float>(d.ctx.get(), out.data(), cols);
      EXPECT_TRUE(Close(expected, got, 1e-5, "column sum"));
      if (run == 0)
        first = got;
      else
        EXPECT_TRUE(BitwiseEqual(first, got, "second run"));
    }
  }
}

TEST(ElementwiseKernelTest, AddCopyAndBiasMatchTheCpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t n = 3000;
  const std::vector<float> a = Uniform(n, 4), b = Uniform(n, 5);
  std::vector<float> sum(n), acc = b;
  cpu::Add(a.data(), b.data(), sum.data(), n);
  cpu::CopyOrAccumulate(a.data(), acc.data(), n, true);
  Buffer da = Upload(d.ctx.get(), a), db = Upload(d.ctx.get(), b);
  Buffer out = DeviceZeros(d.ctx.get(), n * 4);
  ASSERT_EQ(AddForward(out.f32(), da.f32(), db.f32(), n, d.ctx->stream), cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(sum, Download<float>(d.ctx.get(), out.data(), n), "add"));
  ASSERT_EQ(CopyOrAccumulate(db.f32(), da.f32(), n, true, d.ctx->stream), cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(acc, Download<float>(d.ctx.get(), db.data(), n), "accumulate"));
  ASSERT_EQ(CopyOrAccumulate(out.f32(), da.f32(), n, false, d.ctx->stream), cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(a, Download<float>(d.ctx.get(), out.data(), n), "copy"));

  // Bias over 2 matrices of 3 rows x 4 columns, row stride 5, batch stride 20.
  const std::vector<float> bias = {1, 2, 3, 4};
  std::vector<float> c(40, -1.0f), expected = c;
  for (int bt = 0; bt < 2; ++bt) {
    for (int r = 0; r < 3; ++r) {
      for (int j = 0; j < 4; ++j) expected[bt * 20 + r * 5 + j] = bias[j];
    }
  }
  Buffer dc = Upload(d.ctx.get(), c), dbias = Upload(d.ctx.get(), bias);
  ASSERT_EQ(BroadcastBias(dc.f32(), dbias.f32(), 2, 3, 4, 5, 20, false, d.ctx->stream),
            cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(expected, Download<float>(d.ctx.get(), dc.data(), 40), "bias"));
}

using CpuRounding = void (*)(const float*, uint16_t*, int64_t);
using GpuRounding = cudaError_t (*)(const float*, uint16_t*, int64_t, cudaStream_t);

// `x` plus the bit patterns `edges`, rounded on the GPU (from an aligned start:
// four values per thread; and from an odd element: one per thread) must give
// the CPU's bits. Returns the CPU's rounding of the whole of it.
std::vector<uint16_t> ExpectRoundingBitwiseTheCpus(TestDevice& d, std::vector<float> x,
                                                   std::initializer_list<uint32_t> edges,
                                                   CpuRounding on_cpu, GpuRounding on_gpu) {
  for (uint32_t bits : edges) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint16_t> cpu(n);
  on_cpu(x.data(), cpu.data(), n);
  Buffer in = Upload(d.ctx.get(), x), out = DeviceZeros(d.ctx.get(), n * 2);
  EXPECT_EQ(on_gpu(in.f32(), static_cast<uint16_t*>(out.data()), n, d.ctx->stream), cudaSuccess);
  const std::vector<uint16_t> gpu = Download<uint16_t>(d.ctx.get(), out.data(), n);
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) differ += cpu[i] != gpu[i];
  EXPECT_EQ(differ, 0) << "of " << n << " values";
  EXPECT_EQ(cudaMemsetAsync(out.data(), 0, n * 2, d.ctx->stream), cudaSuccess);
  std::vector<uint16_t> expected = cpu;
  expected[0] = 0;
  EXPECT_EQ(on_gpu(in.f32() + 1, static_cast<uint16_t*>(out.data()) + 1, n - 1, d.ctx->stream),
            cudaSuccess);
  EXPECT_EQ(Download<uint16_t>(d.ctx.get(), out.data(), n), expected) << "unaligned";
  return cpu;
}

TEST(ElementwiseKernelTest, Bf16RoundingIsBitwiseTheCpus) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  // Random values over many binades, then the edges: ties to even both ways,
  // the largest finite values (which round to infinity), infinities,
  // subnormals, signed zeros and NaNs with payloads.
  std::vector<float> x = Uniform(100001, 9, -3e4f, 3e4f);
  const std::vector<float> small = Uniform(1000, 10, -1e-30f, 1e-30f);
  x.insert(x.end(), small.begin(), small.end());
  ExpectRoundingBitwiseTheCpus(
      d, std::move(x),
      {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
       0x00000001u, 0x807fffffu, 0x00000000u, 0x80000000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu},
      cpu::ToBf16, ToBf16);
}

// fp16: the same bits as the CPU's FloatToHalf over every binade fp16 has and
// beyond (subnormal results, overflow to infinity from 65520), ties both ways,
// NaNs; and widening back is exact.
TEST(ElementwiseKernelTest, Fp16RoundingIsBitwiseTheCpus) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  std::vector<float> x = Uniform(100001, 11, -7e4f, 7e4f);
  for (float scale : {1e-3f, 1e-5f, 1e-7f, 1e-9f}) {
    const std::vector<float> small = Uniform(1000, 12, -scale, scale);
    x.insert(x.end(), small.begin(), small.end());
  }
  const std::vector<uint16_t> cpu = ExpectRoundingBitwiseTheCpus(
      d, std::move(x),
      {0x3f801000u, 0x3f803000u, 0x477fefffu, 0x477ff000u, 0xc77ff000u, 0x38800000u, 0x387fffffu,
       0x33800000u, 0x33000000u, 0x33000001u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x80000000u,
       0x7fc00000u, 0x7f800001u, 0xffbfffffu},
      cpu::ToF16, ToF16);
  const int64_t n = static_cast<int64_t>(cpu.size());
  std::vector<float> widened(n);
  cpu::FromF16(cpu.data(), widened.data(), n);
  Buffer halves = Upload(d.ctx.get(), cpu), back = DeviceZeros(d.ctx.get(), n * 4);
  ASSERT_EQ(FromF16(static_cast<uint16_t*>(halves.data()), back.f32(), n, d.ctx->stream),
            cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(widened, Download<float>(d.ctx.get(), back.data(), n), "FromF16"));
}

TEST(AttentionKernelTest, LayoutsAreBitwiseTheCpus) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t B = 2, T = 5, H = 3, hs = 4, C = H * hs, n = B * T * C;
  const std::vector<float> qkv = Uniform(3 * n, 6);
  std::vector<float> q(n), k(n), v(n), merged(3 * n), rows(n), heads(n);
  cpu::SplitHeads(qkv.data(), q.data(), k.data(), v.data(), B, T, H, hs);
  cpu::MergeHeadGradients(q.data(), k.data(), v.data(), merged.data(), B, T, H, hs);
  cpu::HeadsToRows(q.data(), rows.data(), B, T, H, hs);
  cpu::RowsToHeads(k.data(), heads.data(), B, T, H, hs);
  EXPECT_EQ(merged, qkv);

  Buffer dqkv = Upload(d.ctx.get(), qkv);
  Buffer dq = DeviceZeros(d.ctx.get(), n * 4), dk = DeviceZeros(d.ctx.get(), n * 4),
         dv = DeviceZeros(d.ctx.get(), n * 4), dmerged = DeviceZeros(d.ctx.get(), 3 * n * 4),
         drows = DeviceZeros(d.ctx.get(), n * 4), dheads = DeviceZeros(d.ctx.get(), n * 4);
  cudaStream_t s = d.ctx->stream;
  ASSERT_EQ(SplitHeads(dq.f32(), dk.f32(), dv.f32(), dqkv.f32(), B, T, H, hs, s), cudaSuccess);
  ASSERT_EQ(MergeHeadGradients(dmerged.f32(), dq.f32(), dk.f32(), dv.f32(), B, T, H, hs, s),
            cudaSuccess);
  ASSERT_EQ(HeadsToRows(drows.f32(), dq.f32(), B, T, H, hs, s), cudaSuccess);
  ASSERT_EQ(RowsToHeads(dheads.f32(), dk.f32(), B, T, H, hs, s), cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(q, Download<float>(d.ctx.get(), dq.data(), n), "q"));
  EXPECT_TRUE(BitwiseEqual(k, Download<float>(d.ctx.get(), dk.data(), n), "k"));
  EXPECT_TRUE(BitwiseEqual(v, Download<float>(d.ctx.get(), dv.data(), n), "v"));
  EXPECT_TRUE(BitwiseEqual(merged, Download<float>(d.ctx.get(), dmerged.data(), 3 * n), "dqkv"));
  EXPECT_TRUE(BitwiseEqual(rows, Download<float>(d.ctx.get(), drows.data(), n), "rows"));
  EXPECT_TRUE(BitwiseEqual(heads, Download<float>(d.ctx.get(), dheads.data(), n), "heads"));
}

TEST(SoftmaxKernelTest, CausalSoftmaxMatchesMaskThenSoftmax) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  for (int64_t T : {1, 7, 300}) {
    const int64_t BH = 3, n = BH * T * T;
    const std::vector<float> scores = Uniform(n, 7, -4.0f, 4.0f), datt = Uniform(n, 8);
    // Reference in double: the CPU layer's mask (-inf above the diagonal), then
    // softmax, and its backward.
    std::vector<float> att(n), dscores(n);
    for (int64_t row = 0; row < BH * T; ++row) {
      const int64_t i = row % T;
      const float* s = scores.data() + row * T;
      double m = -INFINITY, sum = 0, dot = 0;
      for (int64_t j = 0; j <= i; ++j) m = std::max(m, static_cast<double>(s[j]));
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
      for (int64_t j = 0; j < T; ++j) att[row * T + j] = j <= i ? std::exp(s[j] - m) / sum : 0.0;
      for (int64_t j = 0; j < T; ++j)
        dot += static_cast<double>(att[row * T + j]) * datt[row * T + j];
      for (int64_t j = 0; j < T; ++j) {
        dscores[row * T + j] = static_cast<float>(att[row * T + j] * (datt[row * T + j] - dot));
      }
    }
    Buffer da = Upload(d.ctx.get(), scores), dd = Upload(d.ctx.get(), datt);
    ASSERT_EQ(CausalSoftmaxForward(da.f32(), BH, T, d.ctx->stream), cudaSuccess);
    ASSERT_EQ(CausalSoftmaxBackward(dd.f32(), da.f32(), BH, T, d.ctx->stream), cudaSuccess);
    const std::vector<float> got = Download<float>(d.ctx.get(), da.data(), n);
    EXPECT_TRUE(Close(att, got, 1e-6, "causal softmax"));
    EXPECT_TRUE(Close(dscores, Download<float>(d.ctx.get(), dd.data(), n), 1e-5, "backward"));
    for (int64_t row = 0; row < BH * T; ++row) {
      for (int64_t j = row % T + 1; j < T; ++j) ASSERT_EQ(got[row * T + j], 0.0f);
    }
  }
}

TEST(LayerNormKernelTest, ParameterGradientsAreDeterministicAndInPlaceInputGradientWorks) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t BT = 517, C = 96;
  Buffer x = Upload(d.ctx.get(), Uniform(BT * C, 9)), w = Upload(d.ctx.get(), Uniform(C, 10));
  Buffer b = Upload(d.ctx.get(), Uniform(C, 11));
  const std::vector<float> dy_host = Uniform(BT * C, 12);
  Buffer y = DeviceZeros(d.ctx.get(), BT * C * 4), stats = DeviceZeros(d.ctx.get(), 2 * BT * 4);
  cudaStream_t s = d.ctx->stream;
  ASSERT_EQ(LayerNormForward(y.f32(), stats.f32(), stats.f32() + BT, x.f32(), w.f32(), b.f32(), BT,
                             C, 1e-5f, s),
            cudaSuccess);
  std::vector<std::vector<float>> grads, dxs;
  for (int run = 0; run < 2; ++run) {
    Buffer dw = DeviceZeros(d.ctx.get(), 2 * C * 4), dy = Upload(d.ctx.get(), dy_host);
    // dx written over dy.
    ASSERT_EQ(LayerNormBackward(dy.f32(), dw.f32(), dw.f32() + C, dy.f32(), x.f32(), w.f32(),
                                stats.f32(), stats.f32() + BT, BT, C, 1e-5f, false, s),
              cudaSuccess);
    grads.push_back(Download<float>(d.ctx.get(), dw.data(), 2 * C));
    dxs.push_back(Download<float>(d.ctx.get(), dy.data(), BT * C));
  }
  EXPECT_TRUE(BitwiseEqual(grads[0], grads[1], "parameter gradients, run 2"));
  // dx computed out of place agrees with the in-place one.
  Buffer dw = DeviceZeros(d.ctx.get(), 2 * C * 4), dy = Upload(d.ctx.get(), dy_host);
  Buffer dx = DeviceZeros(d.ctx.get(), BT * C * 4);
  ASSERT_EQ(LayerNormBackward(dx.f32(), dw.f32(), dw.f32() + C, dy.f32(), x.f32(), w.f32(),
                              stats.f32(), stats.f32() + BT, BT, C, 1e-5f, false, s),
            cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(dxs[0], Download<float>(d.ctx.get(), dx.data(), BT * C), "dx"));
}

TEST(ConvLayoutKernelTest, TransposesOihwAndBackWithAccumulation) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  constexpr int64_t O = 5, I = 3, K = 3, n = O * I * K * K;
  const std::vector<float> oihw = Uniform(n, 13);
  std::vector<float> ohwi(n);
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < I; ++i)
      for (int64_t kh = 0; kh < K; ++kh)
        for (int64_t kw = 0; kw < K; ++kw)
          ohwi[((o * K + kh) * K + kw) * I + i] = oihw[((o * I + i) * K + kh) * K + kw];
  Buffer in = Upload(d.ctx.get(), oihw), t = DeviceZeros(d.ctx.get(), n * 4);
  ASSERT_EQ(OihwToOhwi(t.f32(), in.f32(), O, I, K, K, d.ctx->stream), cudaSuccess);
  EXPECT_TRUE(BitwiseEqual(ohwi, Download<float>(d.ctx.get(), t.data(), n), "OHWI"));
  ASSERT_EQ(OhwiToOihw(in.f32(), t.f32(), O, I, K, K, /*accumulate=*/true, d.ctx->stream),
            cudaSuccess);
  std::vector<float> doubled = oihw;
  for (float& v : doubled) v *= 2;
  EXPECT_TRUE(BitwiseEqual(doubled, Download<float>(d.ctx.get(), in.data(), n), "OIHW x2"));
}

TEST(BatchNormKernelTest, FinishForwardConvertsAndUpdatesLikeTheCpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  TestDevice d = *MakeTestDevice();
  const std::vector<float> mean = {0.5f, -1.0f, 2.0f}, var = {1.0f, 0.25f, 4e-6f};
  std::vector<float> inv_std(3), running_mean = {0.1f, 0.2f, 0.3f}, running_var = {1, 1, 1};
  for (int c = 0; c < 3; ++c) inv_std[c] = 1.0f / std::sqrt(var[c] + 1e-5f);
  Buffer dinv = Upload(d.ctx.get(), inv_std), dmean = Upload(d.ctx.get(), mean);
  Buffer drm = Upload(d.ctx.get(), running_mean), drv = Upload(d.ctx.get(), running_var);
  const float unbias = 10.0f / 9.0f;
  ASSERT_EQ(BatchNormFinishForward(dinv.f32(), dmean.f32(), drm.f32(), drv.f32(), 3, 1e-5f, 0.1f,
                                   unbias, d.ctx->stream),
            cudaSuccess);
  const std::vector<float> got_var = Download<float>(d.ctx.get(), dinv.data(), 3);
  const std::vector<float> got_rm = Download<float>(d.ctx.get(), drm.data(), 3);
  const std::vector<float> got_rv = Download<float>(d.ctx.get(), drv.data(), 3);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(got_var[c], var[c], 1e-6f * std::max(1.0f, var[c]) + 1e-10f) << c;
    EXPECT_FLOAT_EQ(got_rm[c], 0.9f * running_mean[c] + 0.1f * mean[c]) << c;
    EXPECT_NEAR(got_rv[c], 0.9f * running_var[c] + 0.1f * var[c] * unbias, 1e-6f) << c;
  }
  // And back: the inverse standard deviation from the variance.
  Buffer again = DeviceZeros(d.ctx.get(), 3 * 4);
  ASSERT_EQ(BatchNormInvStd(again.f32(), dinv.f32(), 3, 1e-5f, d.ctx->stream), cudaSuccess);
  EXPECT_TRUE(Close(inv_std, Download<float>(d.ctx.get(), again.data(), 3), 1e-6, "inv std"));
}

}  // namespace
}  // namespace tandem::cuda
