#include "planner/precision.h"

#include "gtest/gtest.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

using tandem::v1::PRECISION_AUTO;
using tandem::v1::PRECISION_BF16;
using tandem::v1::PRECISION_FP16;
using tandem::v1::PRECISION_FP32;

int64_t State(const tandem::v1::LayerMemory& m) {
  return m.parameter_bytes() + m.gradient_bytes() + m.optimizer_state_bytes();
}

TEST(PrecisionTest, Bf16HalvesWhatIs16BitAndKeepsMasterWeightsWithTheState) {
  const tandem::v1::Profile fp32 = testing::GptProfile({2, 16, 32, 2, 2, 50});
  absl::StatusOr<tandem::v1::Profile> bf16 = ProfileInPrecision(fp32, PRECISION_BF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision(), PRECISION_BF16);
  ASSERT_EQ(bf16->layers_size(), fp32.layers_size());
  for (int i = 0; i < fp32.layers_size(); ++i) {
    const tandem::v1::LayerProfile& a = fp32.layers(i);
    const tandem::v1::LayerProfile& b = bf16->layers(i);
    SCOPED_TRACE(a.name());
    const tandem::v1::LayerMemory& m32 = a.analytic_memory();
    const tandem::v1::LayerMemory& m16 = b.analytic_memory();
    EXPECT_EQ(b.forward_flops(), a.forward_flops());
    EXPECT_EQ(b.backward_flops(), a.backward_flops());
    // 16 bytes per Adam parameter either way; 2 of them are the working copy.
    EXPECT_EQ(State(m16), State(m32));
    if (a.kind() == "cross_entropy") {
      EXPECT_EQ(m16.SerializeAsString(), m32.SerializeAsString());
      EXPECT_EQ(b.forward_memory_bytes(), a.forward_memory_bytes());
      continue;
    }
    const int64_t p = a.parameter_count();
    EXPECT_EQ(m16.parameter_bytes(), 2 * p);
    EXPECT_EQ(m16.gradient_bytes(), 2 * p);
    EXPECT_EQ(m16.optimizer_state_bytes(), 8 * p + 4 * p);
    EXPECT_EQ(m16.output_bytes(), m32.output_bytes() / 2);
    EXPECT_EQ(m16.workspace_bytes(), m32.workspace_bytes() / 2);
    EXPECT_EQ(m16.staging_bytes(), 8 * p);
    EXPECT_EQ(b.forward_memory_bytes(), a.forward_memory_bytes() / 2);
    EXPECT_EQ(m16.activation_bytes(), m32.activation_bytes() / 2);
  }
}

TEST(PrecisionTest, AFrozenLayerGetsNoMasterWeights) {
  tandem::v1::Profile fp32 = testing::MlpProfile({8, 4}, 2);
  fp32.mutable_layers(0)->mutable_analytic_memory()->set_gradient_bytes(0);
  fp32.mutable_layers(0)->mutable_analytic_memory()->set_optimizer_state_bytes(0);
  absl::StatusOr<tandem::v1::Profile> bf16 = ProfileInPrecision(fp32, PRECISION_BF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  const tandem::v1::LayerMemory& m = bf16->layers(0).analytic_memory();
  EXPECT_EQ(m.parameter_bytes(), 2 * fp32.layers(0).parameter_count());
  EXPECT_EQ(m.gradient_bytes(), 0);
  EXPECT_EQ(m.optimizer_state_bytes(), 0);
  EXPECT_EQ(m.staging_bytes(), 0);
}

TEST(PrecisionTest, Fp32AndAutoMarkTheProfileAndChangeNothingElse) {
  const tandem::v1::Profile fp32 = testing::MlpProfile({8, 4}, 2);
  for (tandem::v1::Precision p : {PRECISION_AUTO, PRECISION_FP32}) {
    absl::StatusOr<tandem::v1::Profile> out = ProfileInPrecision(fp32, p);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->precision(), PRECISION_FP32);
    tandem::v1::Profile unmarked = *out;
    unmarked.clear_precision();
    EXPECT_EQ(unmarked.SerializeAsString(), fp32.SerializeAsString());
  }
}

TEST(PrecisionTest, RefusesWhatCannotBeRecounted) {
  absl::StatusOr<tandem::v1::Profile> bf16 =
      ProfileInPrecision(testing::MlpProfile({8, 4}, 2), PRECISION_BF16);
  ASSERT_TRUE(bf16.ok());
  // Already bf16: as it is; to fp16 or fp32: no.
  EXPECT_TRUE(ProfileInPrecision(*bf16, PRECISION_BF16).ok());
  EXPECT_EQ(ProfileInPrecision(*bf16, PRECISION_FP16).status().message(),
            "profile.precision: already PRECISION_BF16; it cannot be planned in fp16");
  EXPECT_FALSE(ProfileInPrecision(*bf16, PRECISION_FP32).ok());
  // Measured timings were taken in the precision they ran in.
  tandem::v1::Profile measured = testing::MlpProfile({8, 4}, 2);
  measured.mutable_layers(0)->add_devices()->set_device_id("cpu:0");
  const absl::Status s = ProfileInPrecision(measured, PRECISION_BF16).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().substr(0, 27), "profile.layers[0].devices: ");
}

TEST(PrecisionTest, MatmulPeakFallsBackToFp32) {
  tandem::v1::ProcessorSpec p;
  p.set_peak_matmul_flops_per_second(1e12);
  p.set_peak_bf16_matmul_flops_per_second(4e12);
  EXPECT_EQ(MatmulPeak(p, PRECISION_FP32), 1e12);
  EXPECT_EQ(MatmulPeak(p, PRECISION_AUTO), 1e12);
  EXPECT_EQ(MatmulPeak(p, PRECISION_BF16), 4e12);
  EXPECT_EQ(MatmulPeak(p, PRECISION_FP16), 1e12);  // none listed
  EXPECT_EQ(ElementBytes(PRECISION_FP16), 2);
  EXPECT_EQ(ElementBytes(PRECISION_AUTO), 4);
}

}  // namespace
}  // namespace tandem::planner
