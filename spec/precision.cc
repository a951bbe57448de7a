#include "spec/precision.h"

#include "absl/strings/str_cat.h"

namespace tandem {

using tandem::v1::Precision;

bool IsMixed(Precision p) {
  return p == tandem::v1::PRECISION_BF16 || p == tandem::v1::PRECISION_FP16;
}

std::string PrecisionName(Precision p) {
  return p == tandem::v1::PRECISION_BF16   ? "bf16"
         : p == tandem::v1::PRECISION_FP16 ? "fp16"
                                           : "fp32";
}

bool NativeBf16Isa(const std::string& isa) {
  return isa == "avx512_core_bf16" || isa == "avx512_core_amx";
}

absl::StatusOr<PrecisionChoice> ChoosePrecisionHere(Precision asked, const LocalCompute& here,
                                                    const std::string& field) {
  const bool native = NativeBf16Isa(here.onednn_isa);
  switch (asked) {
    case tandem::v1::PRECISION_AUTO:
      return PrecisionChoice{
          tandem::v1::PRECISION_FP32,
          absl::StrCat("the default (auto): fp32; auto does not choose bf16 yet. PRECISION_BF16 "
                       "runs the matrix products in bf16 on the CPU engine (this CPU: oneDNN ",
                       here.onednn_isa, native ? ", native bf16)" : ", no native bf16)")};
    case tandem::v1::PRECISION_FP32:
      return PrecisionChoice{tandem::v1::PRECISION_FP32, "asked for"};
    case tandem::v1::PRECISION_BF16:
      if (!here.cpu_engine) {
        return absl::UnimplementedError(absl::StrCat(
            field,
            ": PRECISION_BF16 runs on the CPU engine only so far, and this job's placement has "
            "an accelerator. Ask for placement.accelerator ACCELERATOR_KIND_NONE, or "
            "PRECISION_FP32; plan bf16 offload with `tandem plan --precision=bf16 "
            "--hardware=FILE`"));
      }
      if (!native) {
        return absl::FailedPreconditionError(
            absl::StrCat(field,
                         ": PRECISION_BF16 needs a CPU that computes bf16 natively (AMX or "
                         "AVX512-BF16); oneDNN runs ",
                         here.onednn_isa,
                         " here and would emulate it slower than fp32. Ask for PRECISION_FP32"));
      }
      return PrecisionChoice{
          tandem::v1::PRECISION_BF16,
          absl::StrCat("asked for: matrix products in bf16 with fp32 accumulation on oneDNN ",
                       here.onednn_isa,
                       "; master weights, optimizer state and the other layers in fp32")};
    case tandem::v1::PRECISION_FP16:
      return absl::UnimplementedError(absl::StrCat(
          field,
          ": PRECISION_FP16 is for GPUs, and this build of Tandem runs no GPU job in fp16 yet. "
          "Plan it with `tandem plan --precision=fp16 --hardware=FILE`, or ask for "
          "PRECISION_FP32"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown value ", static_cast<int>(asked)));
  }
}

absl::StatusOr<PrecisionChoice> ChoosePrecisionFor(Precision asked,
                                                   const tandem::v1::HardwareSpec& hardware,
                                                   const std::string& field) {
  const bool has_accelerator = hardware.accelerators_size() > 0;
  const tandem::v1::ProcessorSpec& trainer =
      has_accelerator ? hardware.accelerators(0) : hardware.host();
  const std::string name = trainer.name().empty() ? "the hardware's processor" : trainer.name();
  switch (asked) {
    case tandem::v1::PRECISION_AUTO:
      if (trainer.peak_bf16_matmul_flops_per_second() > 0) {
        return PrecisionChoice{
            tandem::v1::PRECISION_BF16,
            absl::StrCat("the default (auto): ", name, " computes bf16 natively")};
      }
      return PrecisionChoice{tandem::v1::PRECISION_FP32,
                             absl::StrCat("the default (auto): ", name, " lists no bf16 rate")};
    case tandem::v1::PRECISION_FP32:
      return PrecisionChoice{tandem::v1::PRECISION_FP32, "asked for"};
    case tandem::v1::PRECISION_BF16:
      return PrecisionChoice{
          tandem::v1::PRECISION_BF16,
          trainer.peak_bf16_matmul_flops_per_second() > 0
              ? "asked for"
              : absl::StrCat("asked for; ", name,
                             " lists no bf16 rate, so its matrices are timed at its fp32 rate")};
    case tandem::v1::PRECISION_FP16:
      if (!has_accelerator || !(hardware.accelerators(0).peak_fp16_matmul_flops_per_second() > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            field,
            ": PRECISION_FP16 needs a GPU with fp16 matrix units, and the hardware's first "
            "accelerator lists no peak_fp16_matmul_flops_per_second",
            has_accelerator ? "" : " (it has none)"));
      }
      return PrecisionChoice{tandem::v1::PRECISION_FP16, "asked for"};
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown precision ", static_cast<int>(asked)));
  }
}

PrecisionChoice ChoosePrecisionForProfile(Precision asked, const tandem::v1::Profile& profile) {
  const Precision measured =
      IsMixed(profile.precision()) ? profile.precision() : tandem::v1::PRECISION_FP32;
  if (asked == tandem::v1::PRECISION_AUTO) {
    return PrecisionChoice{measured, "the default (auto): the profile's"};
  }
  return PrecisionChoice{asked, "asked for"};
}

}  // namespace tandem
