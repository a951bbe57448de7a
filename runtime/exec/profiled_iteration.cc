#include "runtime/exec/profiled_iteration.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/clock.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/profile/synthetic_inputs.h"

namespace tandem {
namespace {

using profile::IterationRecord;

tandem::v1::TimelinePhase TimelinePhaseOf(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return tandem::v1::TIMELINE_PHASE_FORWARD;
    case Phase::kBackward:
      return tandem::v1::TIMELINE_PHASE_BACKWARD;
    case Phase::kUpdate:
      return tandem::v1::TIMELINE_PHASE_UPDATE;
  }
  return tandem::v1::TIMELINE_PHASE_UNSPECIFIED;
}

// Turns the CPU engine's per-phase timings into spans: a phase ends when it is
// reported, so it started `seconds` before.
class TimelineRecorder final : public LayerTimingSink {
 public:
  explicit TimelineRecorder(double start_seconds) : start_seconds_(start_seconds) {}
  void Record(int layer, Phase phase, double seconds) override {
    const double end = WallSeconds() - start_seconds_;
    tandem::v1::TimelineSpan* span = timeline_.add_spans();
    span->set_resource(phase == Phase::kUpdate ? tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE
                                               : tandem::v1::TIMELINE_RESOURCE_HOST_COMPUTE);
    span->set_layer(layer);
    span->set_phase(TimelinePhaseOf(phase));
    span->set_start_seconds(std::max(0.0, end - seconds));
    span->set_end_seconds(end);
  }
  tandem::v1::Timeline& timeline() { return timeline_; }

 private:
  const double start_seconds_;
  tandem::v1::Timeline timeline_;
};

absl::StatusOr<IterationRecord> OnHost(const std::string& id, const Model& model,
                                       const tandem::v1::OptimizerSpec& optimizer, int64_t batch,
                                       uint64_t seed) {
  HostAllocator allocator(0, id);
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CpuRunner> runner,
                          CpuRunner::Create(model, optimizer, batch, seed, &allocator));
  const Batch data = profile::SyntheticBatch(model.data(), batch, seed);
  StepOptions options;
  options.seed = seed;
  TANDEM_RETURN_IF_ERROR(runner->TrainStep(data, options).status());
  options.step = 1;
  const int64_t in_use = allocator.stats().total_in_use_bytes;
  const double start = WallSeconds();
  TimelineRecorder recorder(start);
  runner->set_timing_sink(&recorder);
  TANDEM_RETURN_IF_ERROR(runner->TrainStep(data, options).status());
  const double seconds = WallSeconds() - start;
  runner->set_timing_sink(nullptr);

  IterationRecord record;
  record.peak_bytes = allocator.stats().peak_total_bytes;
  record.timeline = std::move(recorder.timeline());
  record.timeline.set_iteration_seconds(seconds);
  record.timeline.set_source("measured");
  for (double t : {0.0, seconds}) {
    tandem::v1::MemorySample* m = record.timeline.add_host_memory();
    m->set_time_seconds(t);
    m->set_bytes(in_use);
  }
  return record;
}

absl::StatusOr<IterationRecord> OnAccelerator(Accelerator* accelerator, const Model& model,
                                              const tandem::v1::OptimizerSpec& optimizer,
                                              int64_t batch, uint64_t seed) {
  HostAllocator host(0, "cpu");
  ExecutorOptions executor_options;
  executor_options.plan = AllOnAcceleratorPlan(model, batch, accelerator->kind());
  executor_options.optimizer = optimizer;
  executor_options.max_batch = batch;
  executor_options.init_seed = seed;
  executor_options.host_allocator = &host;
  executor_options.accelerator = accelerator;
  accelerator->allocator()->ResetPeak();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<PlanExecutor> executor,
                          PlanExecutor::Create(model, std::move(executor_options)));
  const Batch data = profile::SyntheticBatch(model.data(), batch, seed);
  StepOptions step;
  step.seed = seed;
  for (step.step = 0; step.step < 3; ++step.step) {
    TANDEM_RETURN_IF_ERROR(executor->TrainStep(data, step).status());
  }
  IterationRecord record;
  record.peak_bytes = accelerator->allocator()->stats().peak_total_bytes;
  record.timeline = executor->last_timeline();
  if (record.timeline.spans_size() == 0) {
    return absl::InternalError(
        absl::StrCat(accelerator->id(), ": the plan executor recorded no timeline"));
  }
  return record;
}

}  // namespace

tandem::v1::Plan AllOnAcceleratorPlan(const Model& model, int64_t batch, DeviceKind kind) {
  tandem::v1::Plan p;
  p.set_strategy(tandem::v1::STRATEGY_GPU_ONLY);
  p.set_accelerator(kind == DeviceKind::kCuda ? tandem::v1::DEVICE_KIND_CUDA
                                              : tandem::v1::DEVICE_KIND_EMULATED);
  p.set_batch_size(static_cast<int32_t>(batch));
  p.set_micro_batch_size(static_cast<int32_t>(batch));
  p.set_micro_batches(1);
  p.set_host_update_threads(1);
  p.set_feasible(true);
  for (int l = 0; l < model.num_layers(); ++l) {
    tandem::v1::LayerPlan* lp = p.add_layers();
    lp->set_index(l);
    lp->set_name(model.layer(l).name());
    lp->set_compute(tandem::v1::PLACEMENT_ACCELERATOR);
    lp->set_parameter_home(tandem::v1::PARAMETER_HOME_ACCELERATOR);
    lp->set_update(tandem::v1::PLACEMENT_ACCELERATOR);
    lp->set_activation_policy(tandem::v1::ACTIVATION_POLICY_KEEP);
  }
  return p;
}

absl::StatusOr<IterationRecord> RunProfiledIteration(profile::ProfiledDevice& device,
                                                     const Model& model,
                                                     const tandem::v1::OptimizerSpec& optimizer,
                                                     int64_t batch, uint64_t seed) {
  device.BeforeIteration();
  Accelerator* accelerator = device.accelerator();
  if (accelerator->kind() == DeviceKind::kCpu) {
    return OnHost(accelerator->id(), model, optimizer, batch, seed);
  }
  return OnAccelerator(accelerator, model, optimizer, batch, seed);
}

}  // namespace tandem
