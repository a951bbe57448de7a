// Profiles a model layer by layer: what each layer costs analytically (from the
// layer's own Cost, SavedBytes, WorkspaceBytes and OutputBytes), and what it
// costs measured on a ProfiledDevice.
//
// The method, per layer and device: allocate the layer's state (its parameter,
// gradient and optimizer-state slices, padded to 64 bytes as the model lays
// them out) through a fresh allocator of the device, so the allocator's
// accounting is the state's measured memory; and its output, saved and
// workspace regions, each its declared size (OutputBytes, SavedBytes,
// WorkspaceBytes) plus a 4 KiB guard. The input, the incoming gradient and the
// outgoing gradient come from a second allocator, since in training they
// belong to the neighbouring layers. Inputs are random of the right type
// (token ids for an embedding, targets for the loss). Then forward runs
// warm-up + N times, backward (on forward's saved state) warm-up + N times,
// and the optimizer update of the layer's slice warm-up + N times, each update
// after the device evicted its caches (in training a layer's weights and
// moments were last touched an iteration ago, while its input was just written
// by the layer before); each call is timed on the wall clock until the device
// has synchronised, and the device adds its counters. A parameterless layer has
// no update phase: it is absent, never zero.
//
// A layer never allocates (its regions are the caller's), so no allocator can
// see what it keeps for backward; what its calls wrote can be seen. The output,
// saved and workspace regions are filled with a canary pattern before the
// first forward (the workspace again before the first backward) and scanned
// afterwards for the highest byte written. The measured output bytes are the
// output's, the measured activation bytes the output's plus the saved
// region's (what forward leaves for backward), the measured workspace bytes the
// larger of the two phases'; a layer that writes less than it declares shows
// less, one that writes past its declaration shows more (up to the guard)
// instead of corrupting its neighbour. The saved and workspace scans are also
// MEMORY_SCAN counters of their phases ("saved_bytes_written",
// "workspace_bytes_written").
//
// Stateless functions; a call drives one device from the calling thread.
#ifndef TANDEM_RUNTIME_PROFILE_LAYER_PROFILER_H_
#define TANDEM_RUNTIME_PROFILE_LAYER_PROFILER_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/model/model.h"
#include "runtime/profile/profiled_device.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// The executor's side of the seam between profiler and executor: runs one
// training iteration of `model` at `batch` samples on `device`
// (device.accelerator(), or the host's own engine for the CPU) after calling
// device.BeforeIteration(), and returns its peak bytes and measured timeline.
// The profiler does not know the executor; runtime/exec/profiled_iteration.h
// is the real one, and tests pass fakes.
using IterationRunner = std::function<absl::StatusOr<IterationRecord>(
    ProfiledDevice& device, const Model& model, const tandem::v1::OptimizerSpec& optimizer,
    int64_t batch, uint64_t seed)>;

struct LayerProfilerOptions {
  // Timed calls per phase, and untimed calls before them.
  int iterations = 10;
  int warmup = 3;
  uint64_t seed = 1;
  // A line per layer as it is measured, e.g. "cpu: layer 3 of 11 (conv2d1)".
  std::function<void(const std::string&)> on_progress;
  // Times one whole iteration after the layers; null = none is (the
  // DeviceProfile then has no iteration_peak_bytes).
  IterationRunner run_iteration;
  // Asked before each timed or warm-up call, the peak rates and the
  // iteration: true ends the measurement with CANCELLED (the caller has
  // gone). Null = never.
  std::function<bool()> stop;
};

// The analytic profile of `model` at `batch` samples per batch: every layer with
// its kind, parameter count, FLOPs and memory traffic per phase, analytic
// memory and batch shapes; the model fingerprint, batch and sample shape, and
// optimizer_state_per_parameter (moments per parameter: 2 for Adam). No device
// figures; provenance.source is "analytic". The planner plans from this and a
// HardwareSpec.
//
// Analytic memory per layer: parameters, gradients and optimizer state as
// StateBytesOf counts them in the model's compute type (fp32: ParamCount * 4,
// * 4, * 4 * moments; a bf16 model: * 2, * 2, * (4 * moments + 4), and the
// profile's precision PRECISION_BF16), activations OutputBytes + SavedBytes,
// workspace WorkspaceBytes less its batch-independent part
// (FixedWorkspaceBytes), staging StateBytesOf's plus that part, output
// OutputBytes: so the planner, which scales workspace_bytes with the samples
// of a call and not staging_bytes, counts a micro-batch's 16-bit weight copies
// whole.
// `state`: how the state is counted, by default as the model computes
// (kF32 for a runner that keeps fp32 state whatever the model computes in:
// pipelines). Only kBF16 counts 16-bit state: an fp16 model's is fp32.
tandem::v1::Profile AnalyticProfile(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                                    int64_t batch);
// The part of `layer`'s workspace at `batch` that a call needs whatever its
// batch (a 16-bit layer's weight copies): the intercept of WorkspaceBytes over
// the batch, taken from one and two samples, within [0, WorkspaceBytes(batch)];
// all of it at a batch of 1.
int64_t FixedWorkspaceBytes(const Layer& layer, int64_t batch);
tandem::v1::Profile AnalyticProfile(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                                    int64_t batch, DType state);

// Measures every layer of `model` on `device` and records it in `profile`
// (made by AnalyticProfile for the same model, optimizer and batch): a
// LayerDeviceProfile per layer, and a DeviceProfile with peaks, the iteration
// peak (when options.run_iteration is set), and the device's counter source.
// `iteration`, when not null, receives the measured training iteration (its
// timeline feeds the Chrome trace).
// Measured memory per layer: parameters, gradients and optimizer state from the
// allocator (slices padded to 64 bytes); activations, output and workspace from
// the scans above.
absl::Status MeasureOnDevice(const Model& model, const tandem::v1::OptimizerSpec& optimizer,
                             int64_t batch, const LayerProfilerOptions& options,
                             ProfiledDevice& device, tandem::v1::Profile* profile,
                             IterationRecord* iteration = nullptr);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_LAYER_PROFILER_H_
