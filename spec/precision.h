// Which precision a job runs in, or a plan is made for (JobSpec.precision
// resolved, docs/planning.md "Mixed precision"), and why.
#ifndef TANDEM_SPEC_PRECISION_H_
#define TANDEM_SPEC_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/profile.pb.h"

namespace tandem {

// BF16 or FP16.
bool IsMixed(tandem::v1::Precision precision);

// "fp32", "bf16" or "fp16" (AUTO: "fp32", as in a Profile).
std::string PrecisionName(tandem::v1::Precision precision);

struct PrecisionChoice {
  tandem::v1::Precision precision = tandem::v1::PRECISION_FP32;
  // For Job.precision_reason and PlanModelResponse.precision_reason.
  std::string reason;
};

// Where a job would run on this node: its accelerator (NONE: the CPU engine),
// the ISA oneDNN uses here (cpu::OneDnnIsa()) and, for a CUDA job, its GPU.
struct LocalCompute {
  tandem::v1::AcceleratorKind accelerator = tandem::v1::ACCELERATOR_KIND_NONE;
  std::string onednn_isa;
  // CUDA jobs: cuda:0's compute capability as major * 10 + minor (90 for an
  // H100) and its name; 0 and empty where no GPU was found.
  int cuda_capability = 0;
  std::string cuda_name;
};

// Whether oneDNN computes bf16 natively with `isa` (avx512_core_bf16,
// avx512_core_amx) rather than emulating it.
bool NativeBf16Isa(const std::string& isa);
// Whether oneDNN has bf16 products at all with `isa`, natively or emulated
// (avx512_core and newer). With avx2 and older it has none: its bf16
// primitives cannot be created.
bool Bf16ProductsIsa(const std::string& isa);

// A job on this node or in `tandem train` (the daemon's job manager and the
// Trainer both ask). BF16 on the CPU engine or the emulated accelerator (which
// computes on the host) needs a CPU with native bf16, else FAILED_PRECONDITION
// naming the ISA; on CUDA it needs a GPU of compute capability 8.0 or newer and
// a host with at least avx512_core (for layers the plan keeps there), else
// FAILED_PRECONDITION saying which. AUTO is BF16 where everything that may
// compute does so natively, else FP32; its reason says which and why. FP32 is
// FP32. FP16 runs on CUDA (compute capability 7.0 or newer) and on the
// emulated accelerator (fp16 rounding, fp32 products), and is
// FAILED_PRECONDITION on the CPU engine or an older GPU. Errors name `field`
// (e.g. "precision" or "spec.precision").
absl::StatusOr<PrecisionChoice> ChoosePrecisionHere(tandem::v1::Precision asked,
                                                    const LocalCompute& here,
                                                    const std::string& field);

// A plan for `hardware` (a machine we are not running on). AUTO: bf16 where the
// processor that trains (the first accelerator, else the host) computes it
// natively (a peak_bf16_matmul_flops_per_second), else fp32. BF16: anywhere (a
// processor without a bf16 rate converts and computes at its fp32 rate; the
// reason says so). FP16: only with an accelerator that lists an fp16 rate, else
// INVALID_ARGUMENT naming `field`.
absl::StatusOr<PrecisionChoice> ChoosePrecisionFor(tandem::v1::Precision asked,
                                                   const tandem::v1::HardwareSpec& hardware,
                                                   const std::string& field);

// A plan from a request's profile: it was measured (or computed) in
// profile.precision (AUTO = fp32), and a 16-bit precision re-counts only an fp32
// analytic profile (planner::ProfileInPrecision); the choice is the one asked
// for, AUTO taking the profile's.
PrecisionChoice ChoosePrecisionForProfile(tandem::v1::Precision asked,
                                          const tandem::v1::Profile& profile);

}  // namespace tandem

#endif  // TANDEM_SPEC_PRECISION_H_
