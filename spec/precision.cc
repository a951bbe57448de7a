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

absl::StatusOr<PrecisionChoice> ChoosePrecisionHere(Precision asked, const std::string& field) {
  switch (asked) {
    case tandem::v1::PRECISION_AUTO:
      return PrecisionChoice{tandem::v1::PRECISION_FP32,
                             "the default (auto): this build of Tandem executes fp32 only; "
                             "bf16 and fp16 are planned (tandem plan --precision) but not yet run"};
    case tandem::v1::PRECISION_FP32:
      return PrecisionChoice{tandem::v1::PRECISION_FP32, "asked for"};
    case tandem::v1::PRECISION_BF16:
    case tandem::v1::PRECISION_FP16:
      return absl::UnimplementedError(absl::StrCat(
          field, ": ", Precision_Name(asked),
          " cannot run here: this build of Tandem executes fp32 only. Plan it for a machine with "
          "`tandem plan --precision=",
          PrecisionName(asked), " --hardware=FILE`, or ask for PRECISION_FP32"));
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
