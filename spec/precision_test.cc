#include "spec/precision.h"

#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace tandem {
namespace {

using tandem::v1::PRECISION_AUTO;
using tandem::v1::PRECISION_BF16;
using tandem::v1::PRECISION_FP16;
using tandem::v1::PRECISION_FP32;

TEST(PrecisionTest, HereAutoIsFp32AndBf16RunsOnlyOnTheCpuEngineOfANativeBf16Cpu) {
  const LocalCompute native{.cpu_engine = true, .onednn_isa = "avx512_core_amx"};
  absl::StatusOr<PrecisionChoice> automatic =
      ChoosePrecisionHere(PRECISION_AUTO, native, "precision");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->precision, PRECISION_FP32);
  EXPECT_NE(automatic->reason.find("avx512_core_amx, native bf16"), std::string::npos)
      << automatic->reason;
  EXPECT_EQ(ChoosePrecisionHere(PRECISION_FP32, native, "precision")->reason, "asked for");

  absl::StatusOr<PrecisionChoice> bf16 = ChoosePrecisionHere(PRECISION_BF16, native, "precision");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision, PRECISION_BF16);
  EXPECT_NE(bf16->reason.find("oneDNN avx512_core_amx"), std::string::npos) << bf16->reason;
  EXPECT_TRUE(ChoosePrecisionHere(PRECISION_BF16,
                                  {.cpu_engine = true, .onednn_isa = "avx512_core_bf16"}, "p")
                  .ok());

  const absl::Status offload =
      ChoosePrecisionHere(PRECISION_BF16, {.cpu_engine = false, .onednn_isa = "avx512_core_amx"},
                          "spec.precision")
          .status();
  EXPECT_EQ(offload.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(offload.message().substr(0, 16), "spec.precision: ") << offload.message();
  EXPECT_NE(offload.message().find("ACCELERATOR_KIND_NONE"), std::string::npos);

  const absl::Status emulated =
      ChoosePrecisionHere(PRECISION_BF16, {.cpu_engine = true, .onednn_isa = "avx2"},
                          "spec.precision")
          .status();
  EXPECT_EQ(emulated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(emulated.message().find("oneDNN runs avx2"), std::string::npos) << emulated.message();

  const absl::Status fp16 = ChoosePrecisionHere(PRECISION_FP16, native, "spec.precision").status();
  EXPECT_EQ(fp16.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(fp16.message().find("tandem plan --precision=fp16"), std::string::npos);

  const absl::Status unknown =
      ChoosePrecisionHere(static_cast<tandem::v1::Precision>(9), native, "precision").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "precision: unknown value 9");
}

TEST(PrecisionTest, NativeBf16IsasAreAmxAndAvx512Bf16) {
  EXPECT_TRUE(NativeBf16Isa("avx512_core_amx"));
  EXPECT_TRUE(NativeBf16Isa("avx512_core_bf16"));
  EXPECT_FALSE(NativeBf16Isa("avx512_core"));
  EXPECT_FALSE(NativeBf16Isa("avx512_core_vnni"));
  EXPECT_FALSE(NativeBf16Isa(""));
}

tandem::v1::HardwareSpec Node(double accelerator_bf16, double accelerator_fp16) {
  tandem::v1::HardwareSpec h;
  h.mutable_host()->set_name("cpu");
  tandem::v1::ProcessorSpec* a = h.add_accelerators();
  a->set_name("gpu");
  a->set_peak_bf16_matmul_flops_per_second(accelerator_bf16);
  a->set_peak_fp16_matmul_flops_per_second(accelerator_fp16);
  return h;
}

TEST(PrecisionTest, ForHardwareAutoIsBf16WhereTheTrainerHasABf16Rate) {
  absl::StatusOr<PrecisionChoice> native =
      ChoosePrecisionFor(PRECISION_AUTO, Node(1e15, 1e15), "f");
  ASSERT_TRUE(native.ok());
  EXPECT_EQ(native->precision, PRECISION_BF16);
  EXPECT_EQ(native->reason, "the default (auto): gpu computes bf16 natively");
  absl::StatusOr<PrecisionChoice> old = ChoosePrecisionFor(PRECISION_AUTO, Node(0, 0), "f");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->precision, PRECISION_FP32);
  // bf16 asked of a device without the rate: planned, and said.
  absl::StatusOr<PrecisionChoice> emulated = ChoosePrecisionFor(PRECISION_BF16, Node(0, 0), "f");
  ASSERT_TRUE(emulated.ok());
  EXPECT_EQ(emulated->precision, PRECISION_BF16);
  EXPECT_NE(emulated->reason.find("timed at its fp32 rate"), std::string::npos);
  // fp16 needs an accelerator with an fp16 rate.
  EXPECT_TRUE(ChoosePrecisionFor(PRECISION_FP16, Node(1e15, 1e15), "f").ok());
  const absl::Status s =
      ChoosePrecisionFor(PRECISION_FP16, Node(1e15, 0), "spec.precision").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().substr(0, 32), "spec.precision: PRECISION_FP16 n");
  tandem::v1::HardwareSpec host_only;
  host_only.mutable_host()->set_peak_bf16_matmul_flops_per_second(1e14);
  EXPECT_EQ(ChoosePrecisionFor(PRECISION_AUTO, host_only, "f")->precision, PRECISION_BF16);
  EXPECT_FALSE(ChoosePrecisionFor(PRECISION_FP16, host_only, "f").ok());
}

TEST(PrecisionTest, ForAProfileAutoIsTheProfiles) {
  tandem::v1::Profile profile;
  EXPECT_EQ(ChoosePrecisionForProfile(PRECISION_AUTO, profile).precision, PRECISION_FP32);
  profile.set_precision(PRECISION_BF16);
  EXPECT_EQ(ChoosePrecisionForProfile(PRECISION_AUTO, profile).precision, PRECISION_BF16);
  EXPECT_EQ(ChoosePrecisionForProfile(PRECISION_FP16, profile).precision, PRECISION_FP16);
}

TEST(PrecisionTest, JobFilesNamePrecisionsAndUnknownValuesAreBadFields) {
  const char kJob[] = R"(
model: {mlp: {}}
data: {synthetic: {sample_shape: [8], num_classes: 3}}
training: {batch_size: 4, steps: 2}
precision: PRECISION_BF16
)";
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(kJob, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->precision(), PRECISION_BF16);
  spec->set_precision(static_cast<tandem::v1::Precision>(7));
  EXPECT_EQ(ValidateJobSpec(*spec).message(), "precision: unknown value 7");
}

}  // namespace
}  // namespace tandem
