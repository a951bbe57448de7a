// The executor's side of the seam between profiler and executor
// (runtime/profile/layer_profiler.h, IterationRunner): one training iteration
// of a whole model on a profiled device, run by the engine that trains there,
// with its peak memory and measured timeline.
//
//   - The host (device.accelerator() of kind kCpu): the CPU engine
//     (cpu_runner.h) on a fresh HostAllocator. The first step builds the oneDNN
//     primitives; the second is recorded from the runner's per-phase timings.
//     The engine allocates everything up front, so host memory is flat.
//   - An accelerator: the plan executor on device.accelerator() under the
//     all-on-accelerator plan (every layer computes, keeps its weights, state
//     and activations, and updates there; one micro-batch). Step 0 picks the
//     libraries' algorithms; step 1 is recorded; step 2 runs because the
//     executor closes a step's timeline when the next one starts. peak_bytes is
//     the accelerator allocator's peak over those steps (from ResetPeak),
//     including what the executor holds outside the plan (batch, targets) and
//     a context's fixed workspace; the timeline is the executor's own.
//
// Both run on a synthetic batch (runtime/profile/synthetic_inputs.h). Calls
// device.BeforeIteration() first. Driven by the profiler's thread.
#ifndef TANDEM_RUNTIME_EXEC_PROFILED_ITERATION_H_
#define TANDEM_RUNTIME_EXEC_PROFILED_ITERATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "runtime/model/model.h"
#include "runtime/profile/profiled_device.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/plan.pb.h"

namespace tandem {

// Matches profile::IterationRunner.
absl::StatusOr<profile::IterationRecord> RunProfiledIteration(
    profile::ProfiledDevice& device, const Model& model, const tandem::v1::OptimizerSpec& optimizer,
    int64_t batch, uint64_t seed);

// The plan RunProfiledIteration runs on an accelerator of `kind`.
tandem::v1::Plan AllOnAcceleratorPlan(const Model& model, int64_t batch, DeviceKind kind);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_PROFILED_ITERATION_H_
