// Mixed precision in the planner (docs/planning.md, "Mixed precision"): an
// fp32 profile re-counted for a 16-bit precision, and the matrix rate a
// processor computes a precision at.
//
// A mixed-precision layer keeps a 16-bit working copy of its weights (what the
// forward and backward read and what crosses the host link), 16-bit gradients
// and activations, and fp32 master weights next to its optimizer state. The
// master weights live wherever the update runs, so they are counted with the
// optimizer state: for Adam, 2 + 2 + (8 + 4) = 16 bytes per parameter, as in
// fp32 (4 + 4 + 8), but only 2 of them move each way per step.
#ifndef TANDEM_PLANNER_PRECISION_H_
#define TANDEM_PLANNER_PRECISION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "spec/precision.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::planner {

// Bytes of one element of activations, working weights and gradients: 4 for
// fp32 (and AUTO, which in a Profile means fp32), 2 for bf16 and fp16.
int ElementBytes(tandem::v1::Precision precision);

// A layer's parameters: parameter_count, else its parameter bytes over the
// profile's element size.
int64_t ParameterCount(const tandem::v1::LayerProfile& layer, tandem::v1::Precision precision);

// `fp32` (an analytic profile in fp32: precision AUTO or FP32) re-counted for
// `precision`. Per layer of P parameters: parameter_bytes 2P, gradient_bytes
// 2P, optimizer_state_bytes the fp32 state plus 4P of master weights (none
// for a layer without a gradient: it has no update), staging_bytes 8P (the
// runtime's fp32 widening of a call's weights and gradient; 0 without a
// gradient); activation, workspace and
// output bytes and the forward/backward memory traffic halved, except the loss
// layer's, which stays fp32 (softmax and loss). FLOPs are unchanged. FP32 or AUTO returns the
// profile marked FP32; a profile already in `precision` comes back as it is. One in another 16-bit
// precision, or an fp32 one with measured timings (they were taken in the precision they ran in)
// asked for 16 bits, is INVALID_ARGUMENT naming the profile's field.
absl::StatusOr<tandem::v1::Profile> ProfileInPrecision(const tandem::v1::Profile& fp32,
                                                       tandem::v1::Precision precision);

// The dense matrix rate `p` computes `precision` at: its bf16 or fp16 figure,
// else (none, or fp32) peak_matmul_flops_per_second.
double MatmulPeak(const tandem::v1::ProcessorSpec& p, tandem::v1::Precision precision);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_PRECISION_H_
