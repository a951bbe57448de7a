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

bool Bf16ProductsIsa(const std::string& isa) { return isa.rfind("avx512_core", 0) == 0; }

namespace {

// What a bf16 job would run here (for its reason), or why it cannot
// (FAILED_PRECONDITION, without the field's name or advice).
absl::StatusOr<std::string> Bf16Here(const LocalCompute& here) {
  const bool native = NativeBf16Isa(here.onednn_isa);
  if (here.accelerator == tandem::v1::ACCELERATOR_KIND_CUDA) {
    const std::string gpu = here.cuda_name.empty() ? "cuda:0" : here.cuda_name;
    if (here.cuda_capability < 80) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bf16 on CUDA needs bf16 tensor cores (compute capability 8.0 or newer: Ampere, "
          "Hopper); ",
          here.cuda_capability == 0 ? std::string("this node has no CUDA GPU")
                                    : absl::StrCat(gpu, " is ", here.cuda_capability / 10, ".",
                                                   here.cuda_capability % 10)));
    }
    if (!Bf16ProductsIsa(here.onednn_isa)) {
      return absl::FailedPreconditionError(
          absl::StrCat("bf16 multiplies on the host too (layers the plan keeps there), and oneDNN "
                       "runs ",
                       here.onednn_isa, " here, which has no bf16 products"));
    }
    return absl::StrCat("matrix products (linear layers, attention) in bf16 on ", gpu,
                        "'s tensor cores (cuBLAS, fp32 accumulation) and on oneDNN ",
                        here.onednn_isa, native ? "" : " (emulated there: slower than fp32)",
                        " for layers the plan keeps on the host; convolutions, master weights, "
                        "optimizer state and the other layers in fp32");
  }
  const bool emulated = here.accelerator == tandem::v1::ACCELERATOR_KIND_EMULATED;
  if (!native) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bf16 ",
        emulated ? "on the emulated accelerator (which computes on the host's cores) " : "",
        "needs a CPU that computes bf16 natively (AMX or AVX512-BF16); oneDNN runs ",
        here.onednn_isa, " here and would emulate it slower than fp32"));
  }
  return absl::StrCat("matrix products in bf16 with fp32 accumulation on oneDNN ", here.onednn_isa,
                      emulated ? " (the emulated accelerator computes on the host)" : "",
                      "; master weights, optimizer state and the other layers in fp32");
}

// What an fp16 job would run here, or why it cannot (as Bf16Here).
absl::StatusOr<std::string> Fp16Here(const LocalCompute& here) {
  constexpr char kRest[] =
      "; dynamic loss scaling (training.loss_scaling); convolutions, master weights, optimizer "
      "state and the other layers in fp32";
  switch (here.accelerator) {
    case tandem::v1::ACCELERATOR_KIND_CUDA: {
      const std::string gpu = here.cuda_name.empty() ? "cuda:0" : here.cuda_name;
      if (here.cuda_capability < 70) {
        return absl::FailedPreconditionError(absl::StrCat(
            "fp16 on CUDA needs fp16 tensor cores (compute capability 7.0 or newer); ",
            here.cuda_capability == 0 ? std::string("this node has no CUDA GPU")
                                      : absl::StrCat(gpu, " is ", here.cuda_capability / 10, ".",
                                                     here.cuda_capability % 10)));
      }
      return absl::StrCat("matrix products (linear layers, attention) in fp16 on ", gpu,
                          "'s tensor cores (cuBLAS, fp32 accumulation); layers the plan keeps "
                          "on the host round their operands to fp16 and multiply in fp32",
                          kRest);
    }
    case tandem::v1::ACCELERATOR_KIND_EMULATED:
      return absl::StrCat(
          "emulated: matrix products' operands rounded to fp16 and multiplied in fp32 on the "
          "host's cores, which is fp16's arithmetic (not its speed: slower than fp32)",
          kRest);
    default:
      return absl::FailedPreconditionError(
          "fp16 is for GPUs (and the emulated accelerator that stands in for one); the CPU "
          "engine has no fp16 products");
  }
}

}  // namespace

absl::StatusOr<PrecisionChoice> ChoosePrecisionHere(Precision asked, const LocalCompute& here,
                                                    const std::string& field) {
  switch (asked) {
    case tandem::v1::PRECISION_AUTO: {
      // bf16 where everything that may compute computes it natively: a GPU
      // whose host may also multiply (hetero_dp, cpu_only) needs both.
      const absl::StatusOr<std::string> bf16 = Bf16Here(here);
      if (bf16.ok() && NativeBf16Isa(here.onednn_isa)) {
        return PrecisionChoice{tandem::v1::PRECISION_BF16,
                               absl::StrCat("the default (auto): bf16, computed natively here: ",
                                            *bf16, ". Ask for PRECISION_FP32 for fp32")};
      }
      return PrecisionChoice{
          tandem::v1::PRECISION_FP32,
          absl::StrCat(
              "the default (auto): fp32, as bf16 is not native here: ",
              bf16.ok()
                  ? absl::StrCat("PRECISION_BF16 would run (", *bf16, "), but oneDNN runs ",
                                 here.onednn_isa, " on the host, without bf16 products")
                  : absl::StrCat("PRECISION_BF16 would be refused: ", bf16.status().message()))};
    }
    case tandem::v1::PRECISION_FP32:
      return PrecisionChoice{tandem::v1::PRECISION_FP32, "asked for"};
    case tandem::v1::PRECISION_BF16: {
      const absl::StatusOr<std::string> bf16 = Bf16Here(here);
      if (!bf16.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            field, ": PRECISION_BF16: ", bf16.status().message(), ". Ask for PRECISION_FP32"));
      }
      return PrecisionChoice{tandem::v1::PRECISION_BF16, absl::StrCat("asked for: ", *bf16)};
    }
    case tandem::v1::PRECISION_FP16: {
      const absl::StatusOr<std::string> fp16 = Fp16Here(here);
      if (!fp16.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(field, ": PRECISION_FP16: ", fp16.status().message(),
                         ". Ask for PRECISION_BF16 (where the hardware has it) or PRECISION_FP32"));
      }
      return PrecisionChoice{tandem::v1::PRECISION_FP16, absl::StrCat("asked for: ", *fp16)};
    }
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
