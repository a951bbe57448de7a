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

namespace {

absl::StatusOr<PrecisionChoice> Bf16OnCuda(const LocalCompute& here, const std::string& field) {
  const std::string gpu = here.cuda_name.empty() ? "cuda:0" : here.cuda_name;
  if (here.cuda_capability < 80) {
    return absl::FailedPreconditionError(absl::StrCat(
        field,
        ": PRECISION_BF16 on CUDA needs bf16 tensor cores (compute capability 8.0 or newer: "
        "Ampere, Hopper); ",
        here.cuda_capability == 0
            ? std::string("this node has no CUDA GPU")
            : absl::StrCat(gpu, " is ", here.cuda_capability / 10, ".", here.cuda_capability % 10),
        ". Ask for PRECISION_FP32"));
  }
  const bool native = NativeBf16Isa(here.onednn_isa);
  if (!native && here.onednn_isa.rfind("avx512_core", 0) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        field,
        ": PRECISION_BF16 multiplies in bf16 on the host too (layers the plan keeps there), and "
        "oneDNN runs ",
        here.onednn_isa, " here, which has no bf16 products. Ask for PRECISION_FP32"));
  }
  return PrecisionChoice{
      tandem::v1::PRECISION_BF16,
      absl::StrCat("asked for: matrix products (linear layers, attention) in bf16 on ", gpu,
                   "'s tensor cores (cuBLAS, fp32 accumulation) and on oneDNN ", here.onednn_isa,
                   native ? "" : " (emulated there: slower than fp32)",
                   " for layers the plan keeps on the host; convolutions, master weights, "
                   "optimizer state and the other layers in fp32")};
}

}  // namespace

absl::StatusOr<PrecisionChoice> ChoosePrecisionHere(Precision asked, const LocalCompute& here,
                                                    const std::string& field) {
  const bool native = NativeBf16Isa(here.onednn_isa);
  const bool emulated = here.accelerator == tandem::v1::ACCELERATOR_KIND_EMULATED;
  switch (asked) {
    case tandem::v1::PRECISION_AUTO:
      return PrecisionChoice{
          tandem::v1::PRECISION_FP32,
          absl::StrCat("the default (auto): fp32; auto does not choose bf16 yet. PRECISION_BF16 "
                       "runs the matrix products in bf16 (this CPU: oneDNN ",
                       here.onednn_isa, native ? ", native bf16" : ", no native bf16",
                       here.cuda_capability >= 80 ? absl::StrCat("; ", here.cuda_name,
                                                                 ": bf16 "
                                                                 "tensor cores")
                                                  : "",
                       ")")};
    case tandem::v1::PRECISION_FP32:
      return PrecisionChoice{tandem::v1::PRECISION_FP32, "asked for"};
    case tandem::v1::PRECISION_BF16:
      if (here.accelerator == tandem::v1::ACCELERATOR_KIND_CUDA) return Bf16OnCuda(here, field);
      if (!native) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": PRECISION_BF16 ",
            emulated ? "on the emulated accelerator (which computes on the host's cores) " : "",
            "needs a CPU that computes bf16 natively (AMX or AVX512-BF16); oneDNN runs ",
            here.onednn_isa,
            " here and would emulate it slower than fp32. Ask for PRECISION_FP32"));
      }
      return PrecisionChoice{
          tandem::v1::PRECISION_BF16,
          absl::StrCat("asked for: matrix products in bf16 with fp32 accumulation on oneDNN ",
                       here.onednn_isa,
                       emulated ? " (the emulated accelerator computes on the host)" : "",
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
