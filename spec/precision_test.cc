#include "spec/precision.h"

#include "gtest/gtest.h"
#include "spec/job_spec.h"

namespace tandem {
namespace {

using tandem::v1::PRECISION_AUTO;
using tandem::v1::PRECISION_BF16;
using tandem::v1::PRECISION_FP16;
using tandem::v1::PRECISION_FP32;

using tandem::v1::ACCELERATOR_KIND_CUDA;
using tandem::v1::ACCELERATOR_KIND_EMULATED;
using tandem::v1::ACCELERATOR_KIND_NONE;

TEST(PrecisionTest, HereAutoIsBf16WhereNativeElseFp32WithTheReason) {
  const LocalCompute native{.accelerator = ACCELERATOR_KIND_NONE, .onednn_isa = "avx512_core_amx"};
  absl::StatusOr<PrecisionChoice> automatic =
      ChoosePrecisionHere(PRECISION_AUTO, native, "precision");
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->precision, PRECISION_BF16);
  EXPECT_NE(automatic->reason.find("the default (auto): bf16, computed natively here: "
                                   "matrix products in bf16 with fp32 accumulation on oneDNN "
                                   "avx512_core_amx"),
            std::string::npos)
      << automatic->reason;
  const LocalCompute emulated{.accelerator = ACCELERATOR_KIND_EMULATED,
                              .onednn_isa = "avx512_core_bf16"};
  EXPECT_EQ(ChoosePrecisionHere(PRECISION_AUTO, emulated, "p")->precision, PRECISION_BF16);
  const LocalCompute hopper{.accelerator = ACCELERATOR_KIND_CUDA,
                            .onednn_isa = "avx512_core_amx",
                            .cuda_capability = 90,
                            .cuda_name = "NVIDIA H100"};
  EXPECT_EQ(ChoosePrecisionHere(PRECISION_AUTO, hopper, "p")->precision, PRECISION_BF16);
  // A Hopper GPU on a host that would emulate bf16 products: fp32.
  LocalCompute plain_host = hopper;
  plain_host.onednn_isa = "avx512_core";
  absl::StatusOr<PrecisionChoice> mixed_host = ChoosePrecisionHere(PRECISION_AUTO, plain_host, "p");
  ASSERT_TRUE(mixed_host.ok());
  EXPECT_EQ(mixed_host->precision, PRECISION_FP32);
  EXPECT_NE(mixed_host->reason.find("oneDNN runs avx512_core on the host"), std::string::npos)
      << mixed_host->reason;

  absl::StatusOr<PrecisionChoice> plain =
      ChoosePrecisionHere(PRECISION_AUTO, {.onednn_isa = "avx2"}, "precision");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->precision, PRECISION_FP32);
  EXPECT_NE(plain->reason.find("PRECISION_BF16 would be refused: bf16 needs a CPU"),
            std::string::npos)
      << plain->reason;
  EXPECT_NE(plain->reason.find("oneDNN runs avx2"), std::string::npos) << plain->reason;

  const LocalCompute volta{.accelerator = ACCELERATOR_KIND_CUDA,
                           .onednn_isa = "avx512_core_amx",
                           .cuda_capability = 70,
                           .cuda_name = "Tesla V100"};
  absl::StatusOr<PrecisionChoice> old_gpu = ChoosePrecisionHere(PRECISION_AUTO, volta, "p");
  ASSERT_TRUE(old_gpu.ok());
  EXPECT_EQ(old_gpu->precision, PRECISION_FP32);
  EXPECT_NE(old_gpu->reason.find("Tesla V100 is 7.0"), std::string::npos) << old_gpu->reason;
}

TEST(PrecisionTest, HereBf16RunsOnTheCpuEngineOfANativeBf16Cpu) {
  const LocalCompute native{.accelerator = ACCELERATOR_KIND_NONE, .onednn_isa = "avx512_core_amx"};
  EXPECT_EQ(ChoosePrecisionHere(PRECISION_FP32, native, "precision")->reason, "asked for");

  absl::StatusOr<PrecisionChoice> bf16 = ChoosePrecisionHere(PRECISION_BF16, native, "precision");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision, PRECISION_BF16);
  EXPECT_NE(bf16->reason.find("oneDNN avx512_core_amx"), std::string::npos) << bf16->reason;
  EXPECT_TRUE(ChoosePrecisionHere(PRECISION_BF16, {.onednn_isa = "avx512_core_bf16"}, "p").ok());

  const absl::Status emulated =
      ChoosePrecisionHere(PRECISION_BF16, {.onednn_isa = "avx2"}, "spec.precision").status();
  EXPECT_EQ(emulated.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(emulated.message().substr(0, 16), "spec.precision: ") << emulated.message();
  EXPECT_NE(emulated.message().find("oneDNN runs avx2"), std::string::npos) << emulated.message();

  // fp16 is for GPUs: the CPU engine refuses it, whatever the CPU.
  const absl::Status fp16 = ChoosePrecisionHere(PRECISION_FP16, native, "spec.precision").status();
  EXPECT_EQ(fp16.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fp16.message().substr(0, 32), "spec.precision: PRECISION_FP16: ") << fp16.message();
  EXPECT_NE(fp16.message().find("no fp16 products"), std::string::npos) << fp16.message();

  const absl::Status unknown =
      ChoosePrecisionHere(static_cast<tandem::v1::Precision>(9), native, "precision").status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "precision: unknown value 9");
}

TEST(PrecisionTest, HereFp16RunsOnVoltaOrNewerAndOnTheEmulatedAccelerator) {
  absl::StatusOr<PrecisionChoice> h100 = ChoosePrecisionHere(PRECISION_FP16,
                                                             {.accelerator = ACCELERATOR_KIND_CUDA,
                                                              .onednn_isa = "avx2",
                                                              .cuda_capability = 90,
                                                              .cuda_name = "NVIDIA H100"},
                                                             "precision");
  ASSERT_TRUE(h100.ok()) << h100.status();
  EXPECT_EQ(h100->precision, PRECISION_FP16);
  EXPECT_NE(h100->reason.find("fp16 on NVIDIA H100's tensor cores"), std::string::npos)
      << h100->reason;
  EXPECT_NE(h100->reason.find("loss scaling"), std::string::npos) << h100->reason;
  EXPECT_TRUE(ChoosePrecisionHere(PRECISION_FP16,
                                  {.accelerator = ACCELERATOR_KIND_CUDA, .cuda_capability = 70},
                                  "precision")
                  .ok());
  const absl::Status pascal =
      ChoosePrecisionHere(
          PRECISION_FP16,
          {.accelerator = ACCELERATOR_KIND_CUDA, .cuda_capability = 61, .cuda_name = "Tesla P100"},
          "precision")
          .status();
  EXPECT_EQ(pascal.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(pascal.message().find("Tesla P100 is 6.1"), std::string::npos) << pascal.message();
  absl::StatusOr<PrecisionChoice> emulated = ChoosePrecisionHere(
      PRECISION_FP16, {.accelerator = ACCELERATOR_KIND_EMULATED, .onednn_isa = "avx2"}, "p");
  ASSERT_TRUE(emulated.ok()) << emulated.status();
  EXPECT_NE(emulated->reason.find("rounded to fp16"), std::string::npos) << emulated->reason;
  // Auto never picks fp16.
  EXPECT_NE(ChoosePrecisionHere(PRECISION_AUTO,
                                {.accelerator = ACCELERATOR_KIND_CUDA,
                                 .onednn_isa = "avx512_core_amx",
                                 .cuda_capability = 90},
                                "p")
                ->precision,
            PRECISION_FP16);
}

TEST(PrecisionTest, HereTheEmulatedAcceleratorNeedsTheHostsNativeBf16) {
  absl::StatusOr<PrecisionChoice> bf16 = ChoosePrecisionHere(
      PRECISION_BF16, {.accelerator = ACCELERATOR_KIND_EMULATED, .onednn_isa = "avx512_core_bf16"},
      "precision");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_NE(bf16->reason.find("emulated accelerator computes on the host"), std::string::npos)
      << bf16->reason;
  const absl::Status refused =
      ChoosePrecisionHere(PRECISION_BF16,
                          {.accelerator = ACCELERATOR_KIND_EMULATED, .onednn_isa = "avx512_core"},
                          "spec.precision")
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("on the emulated accelerator"), std::string::npos)
      << refused.message();
}

TEST(PrecisionTest, HereCudaNeedsAmpereOrNewerAndAHostWithBf16Products) {
  const LocalCompute h100{.accelerator = ACCELERATOR_KIND_CUDA,
                          .onednn_isa = "avx512_core_amx",
                          .cuda_capability = 90,
                          .cuda_name = "NVIDIA H100 80GB HBM3"};
  absl::StatusOr<PrecisionChoice> bf16 = ChoosePrecisionHere(PRECISION_BF16, h100, "precision");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision, PRECISION_BF16);
  EXPECT_NE(bf16->reason.find("NVIDIA H100 80GB HBM3's tensor cores"), std::string::npos)
      << bf16->reason;
  EXPECT_EQ(bf16->reason.find("emulated there"), std::string::npos) << bf16->reason;

  LocalCompute avx512 = h100;
  avx512.onednn_isa = "avx512_core";  // bf16 products emulated on the host: allowed, said
  ASSERT_TRUE(ChoosePrecisionHere(PRECISION_BF16, avx512, "p").ok());
  EXPECT_NE(ChoosePrecisionHere(PRECISION_BF16, avx512, "p")->reason.find("emulated there"),
            std::string::npos);

  LocalCompute avx2 = h100;
  avx2.onednn_isa = "avx2";
  const absl::Status no_host = ChoosePrecisionHere(PRECISION_BF16, avx2, "precision").status();
  EXPECT_EQ(no_host.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_host.message().find("oneDNN runs avx2"), std::string::npos) << no_host.message();

  LocalCompute volta = h100;
  volta.cuda_capability = 70;
  volta.cuda_name = "Tesla V100";
  const absl::Status old = ChoosePrecisionHere(PRECISION_BF16, volta, "spec.precision").status();
  EXPECT_EQ(old.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(old.message().find("Tesla V100 is 7.0"), std::string::npos) << old.message();

  LocalCompute none = h100;
  none.cuda_capability = 0;
  none.cuda_name.clear();
  const absl::Status absent = ChoosePrecisionHere(PRECISION_BF16, none, "precision").status();
  EXPECT_EQ(absent.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(absent.message().find("no CUDA GPU"), std::string::npos) << absent.message();
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
