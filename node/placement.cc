#include "node/placement.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "base/units.h"
#include "base/work_counters.h"
#include "google/protobuf/util/time_util.h"
#include "planner/cost_model.h"
#include "planner/memory_fit.h"
#include "planner/precision.h"
#include "planner/scale_out.h"
#include "planner/strategies.h"
#include "runtime/core/allocator.h"
#include "runtime/core/omp_threads.h"
#include "runtime/cuda/accelerator_factory.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/exec/pipeline_runner.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/profile/cpu_peaks.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/train/job_model.h"
#include "schedule/schedule_proto.h"
#include "spec/job_spec.h"
#include "spec/precision.h"

namespace tandem::node {
namespace {

using tandem::v1::AcceleratorKind;
using tandem::v1::HardwareSpec;
using tandem::v1::JobSpec;
using tandem::v1::Plan;
using tandem::v1::PlanModelResponse;
using tandem::v1::ProcessorSpec;
using tandem::v1::Strategy;

// What a CUDA accelerator holds from the moment it opens, inside its budget:
// cuBLAS's 32 MiB workspace and reduction scratch (accelerator_factory.h),
// rounded up.
constexpr int64_t kCudaFixedBytes = int64_t{33} << 20;
// A forced plan's host_update_threads: more threads than any host has cores.
constexpr int kMaxHostUpdateThreads = 1024;

// The accelerator a resolved spec runs with (the spec is resolved, so never
// UNSPECIFIED).
AcceleratorKind KindOf(const JobSpec& resolved) { return resolved.placement().accelerator(); }

// Whether the job runs on the plain CPU engine, without a plan.
bool PlainCpu(const JobSpec& resolved) {
  const Strategy s = resolved.placement().strategy();
  return KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_NONE &&
         (s == tandem::v1::STRATEGY_CPU_ONLY || s == tandem::v1::STRATEGY_AUTO) &&
         !resolved.placement().has_plan();
}

// The accelerator capacity a cost source states, for the margin: a hardware
// spec's first accelerator, or a measured profile's first non-CPU device.
int64_t SourceCapacity(const planner::PlanRequest& request) {
  if (request.hardware.has_value()) {
    return request.hardware->accelerators_size() > 0
               ? request.hardware->accelerators(0).memory_bytes()
               : 0;
  }
  for (const auto& d : request.profile.devices()) {
    if (d.kind() != tandem::v1::DEVICE_KIND_CPU) return d.memory_bytes();
  }
  return 0;
}

// Wraps the plan executor with the accelerator it runs on, which it must
// outlive.
class HybridRunner final : public StepRunner {
 public:
  HybridRunner(std::unique_ptr<Accelerator> accelerator, std::unique_ptr<PlanExecutor> executor)
      : accelerator_(std::move(accelerator)), executor_(std::move(executor)) {}

  absl::StatusOr<StepResult> TrainStep(const Batch& batch, const StepOptions& options) override {
    return executor_->TrainStep(batch, options);
  }
  absl::StatusOr<EvalResult> EvalBatch(const Batch& batch) override {
    return executor_->EvalBatch(batch);
  }
  absl::Status SyncStateToHost() override { return executor_->SyncStateToHost(); }
  HostStateView host_state() override { return executor_->host_state(); }
  absl::Status StateChangedOnHost() override { return executor_->StateChangedOnHost(); }
  int64_t peak_host_bytes() const override { return executor_->peak_host_bytes(); }
  int64_t peak_accelerator_bytes() const override { return executor_->peak_accelerator_bytes(); }
  Plan plan() const override { return executor_->plan(); }
  tandem::v1::Schedule program() const override { return executor_->program(); }
  tandem::v1::Timeline last_timeline() const override { return executor_->last_timeline(); }
  void set_timing_sink(LayerTimingSink* sink) override { executor_->set_timing_sink(sink); }
  // E.g. host buffers left pageable: the job's log says so.
  std::vector<std::string> warnings() const override { return executor_->warnings(); }

 private:
  // Declared first: destroyed after the executor.
  std::unique_ptr<Accelerator> accelerator_;
  std::unique_ptr<PlanExecutor> executor_;
};

absl::StatusOr<std::unique_ptr<Accelerator>> CreateAccelerator(const JobSpec& resolved,
                                                               const NodeOffer& node,
                                                               int64_t capacity, int ordinal = 0) {
  switch (KindOf(resolved)) {
    case tandem::v1::ACCELERATOR_KIND_EMULATED: {
      EmulatedOptions options;
      options.capacity_bytes = capacity;
      options.link_bytes_per_second = resolved.resources().emulated_link_bytes_per_second();
      if (node.emulated_link_throttle_bytes_per_second > 0) {
        options.link_bytes_per_second = options.link_bytes_per_second > 0
                                            ? std::min(options.link_bytes_per_second,
                                                       node.emulated_link_throttle_bytes_per_second)
                                            : node.emulated_link_throttle_bytes_per_second;
      }
      // A peer link like the host link (PCIe peer-to-peer between GPUs of
      // one switch runs at about the host link's rate).
      options.peer_link = node.emulated_peer_link;
      options.peer_bytes_per_second = options.link_bytes_per_second;
      options.peer_latency_seconds = options.link_latency_seconds;
      return std::unique_ptr<Accelerator>(std::make_unique<EmulatedAccelerator>(options, ordinal));
    }
    case tandem::v1::ACCELERATOR_KIND_CUDA:
      return cuda::CreateCudaAccelerator(ordinal, capacity);
    default:
      return absl::InvalidArgumentError("placement.accelerator: the job has no accelerator");
  }
}

// The host as the planner sees it, from its GEMM rate (matrix and vector
// work alike), its bf16 GEMM rate (0: none measured; bf16 products are timed
// at the fp32 rate), triad bandwidth and GEMM rate on one thread (0: unknown).
ProcessorSpec HostSpec(int threads, int64_t memory_bytes, double gemm_flops_per_second,
                       double bf16_gemm_flops_per_second, double bandwidth_bytes_per_second,
                       double single_thread_gemm_flops_per_second) {
  ProcessorSpec s;
  s.set_kind(tandem::v1::DEVICE_KIND_CPU);
  s.set_threads(threads);
  s.set_memory_bytes(memory_bytes);
  s.set_launch_overhead_seconds(1e-6);
  s.set_peak_matmul_flops_per_second(gemm_flops_per_second);
  s.set_peak_bf16_matmul_flops_per_second(bf16_gemm_flops_per_second);
  s.set_single_thread_matmul_flops_per_second(single_thread_gemm_flops_per_second);
  s.set_peak_vector_flops_per_second(gemm_flops_per_second);
  s.set_memory_bandwidth_bytes_per_second(bandwidth_bytes_per_second);
  return s;
}

}  // namespace

ProcessorSpec MeasureHostProcessor() {
  static std::once_flag once;
  static ProcessorSpec* spec = nullptr;
  std::call_once(once, [] {
    const int threads = omp_get_max_threads();
    profile::GemmOptions gemm;
    gemm.repeats = 3;
    profile::TriadOptions triad;
    triad.elements = int64_t{8} << 20;
    triad.repeats = 3;
    absl::StatusOr<double> flops, bandwidth, bf16, single = 0.0;
    // On a thread of its own at the caller's count: run here, the parallel
    // regions would leave workers docked on the caller
    // (runtime/core/omp_threads.h).
    RunOnOwnOmpThread(threads, [&] {
      flops = profile::MeasureGemmFlopsPerSecond(gemm);
      bandwidth = profile::MeasureTriadBytesPerSecond(triad);
      bf16 = profile::MeasureNativeBf16GemmFlopsPerSecond(gemm);
    });
    if (threads > 1)
      RunOnOwnOmpThread(1, [&] { single = profile::MeasureGemmFlopsPerSecond(gemm); });
    // A measurement failure (no memory for the buffers) is not fatal: a plan
    // from conservative figures still runs correctly, only less well placed.
    const double f = flops.ok() ? *flops : 20e9 * threads;
    const double b = bandwidth.ok() ? *bandwidth : 10e9;
    const double h = bf16.ok() ? *bf16 : 0;
    spec = new ProcessorSpec(HostSpec(threads, PhysicalMemoryBytes(), f, h, b,
                                      threads == 1  ? f
                                      : single.ok() ? *single
                                                    : 0));
    spec->set_name(absl::StrFormat(
        "host, %d threads (measured: GEMM %.0f GFLOP/s%s, triad %.1f GB/s%s)", threads, f / 1e9,
        h > 0 ? absl::StrFormat(", bf16 GEMM %.0f GFLOP/s", h / 1e9) : "", b / 1e9,
        flops.ok() && bandwidth.ok() && bf16.ok() ? "" : "; estimated after a failure"));
  });
  return *spec;
}

NodeOffer DetectNodeOffer(int64_t flag_bytes, std::vector<cuda::CudaDeviceInfo> cuda_devices) {
  NodeOffer node;
  node.host = MeasureHostProcessor();
  node.cuda_devices = std::move(cuda_devices);
  node.accelerator_memory_budget_bytes = AcceleratorMemoryBudget(flag_bytes, node.cuda_devices);
  return node;
}

NodeOffer NodeOfferFromProfile(const tandem::v1::NodeProfile& profile, int64_t flag_bytes,
                               std::vector<cuda::CudaDeviceInfo> cuda_devices) {
  NodeOffer node;
  node.cuda_devices = std::move(cuda_devices);
  node.accelerator_memory_budget_bytes = AcceleratorMemoryBudget(flag_bytes, node.cuda_devices);
  node.profile = profile;
  const tandem::v1::DeviceProfile* cpu = nullptr;
  for (const auto& d : profile.devices()) {
    if (d.kind() == tandem::v1::DEVICE_KIND_CPU) {
      cpu = &d;
      break;
    }
  }
  if (cpu == nullptr || !(cpu->gemm_flops_per_second() > 0) ||
      !(cpu->memory_bandwidth_bytes_per_second() > 0)) {
    node.host = MeasureHostProcessor();
    return node;
  }
  ProcessorSpec& s = node.host;
  s = HostSpec(cpu->threads(), cpu->memory_bytes(), cpu->gemm_flops_per_second(),
               cpu->bf16_gemm_flops_per_second(), cpu->memory_bandwidth_bytes_per_second(),
               cpu->single_thread_gemm_flops_per_second());
  constexpr double kAdamBytesPerParameter = 28;  // p, g, m, v read; p, m, v written
  if (profile.host_adam_parameters_per_second() > 0) {
    (*s.mutable_efficiency())["optimizer"] =
        std::clamp(profile.host_adam_parameters_per_second() * kAdamBytesPerParameter /
                       cpu->memory_bandwidth_bytes_per_second(),
                   0.01, 1.0);
  }
  s.set_name(absl::StrFormat(
      "host, %d threads (node profile: GEMM %.0f GFLOP/s%s, triad %.1f GB/s, Adam %.0f M "
      "parameters/s)",
      s.threads(), cpu->gemm_flops_per_second() / 1e9,
      cpu->bf16_gemm_flops_per_second() > 0
          ? absl::StrFormat(", bf16 GEMM %.0f GFLOP/s", cpu->bf16_gemm_flops_per_second() / 1e9)
          : "",
      cpu->memory_bandwidth_bytes_per_second() / 1e9,
      profile.host_adam_parameters_per_second() / 1e6));
  return node;
}

absl::StatusOr<int64_t> AcceleratorCapacity(const JobSpec& resolved, const NodeOffer& node) {
  const int64_t asked = resolved.resources().accelerator_memory_bytes();
  switch (KindOf(resolved)) {
    case tandem::v1::ACCELERATOR_KIND_EMULATED:
      if (asked > 0) return asked;
      if (node.accelerator_memory_budget_bytes > 0) return node.accelerator_memory_budget_bytes;
      return absl::InvalidArgumentError(
          "resources.accelerator_memory_bytes: the emulated accelerator needs a capacity (set it "
          "here, or start tandemd with --accelerator_memory_budget)");
    case tandem::v1::ACCELERATOR_KIND_CUDA: {
      if (node.cuda_devices.empty()) {
        return absl::FailedPreconditionError(
            "placement.accelerator: CUDA, but this node has no CUDA device");
      }
      const int64_t device = node.cuda_devices[0].memory_bytes;
      const int64_t budget =
          node.accelerator_memory_budget_bytes > 0 ? node.accelerator_memory_budget_bytes : device;
      if (asked > budget) {
        return absl::ResourceExhaustedError(
            absl::StrCat("resources.accelerator_memory_bytes: ", FormatBytes(asked, 1),
                         " exceeds the node's ", FormatBytes(budget, 1), " of accelerator memory"));
      }
      return asked > 0 ? asked : budget;
    }
    default:
      return 0;
  }
}

ProcessorSpec AcceleratorSpec(const cuda::CudaDeviceInfo& device) {
  ProcessorSpec s;
  s.set_name(device.name);
  s.set_kind(tandem::v1::DEVICE_KIND_CUDA);
  s.set_memory_bytes(device.memory_bytes);
  s.set_threads(device.multiprocessors);
  s.set_launch_overhead_seconds(5e-6);
  // Dense TF32 tensor-core and FP32 rates, HBM bandwidth (NVIDIA datasheets;
  // the same figures as planner/hardware/*.textproto).
  struct Known {
    const char* match;
    const char* also;
    double tf32, fp32, bandwidth;
  };
  static const Known kKnown[] = {
      {"H200", "", 494.7e12, 67e12, 4.8e12},
      {"H100", "PCIe", 378e12, 51e12, 2.0e12},
      {"H100", "", 494.7e12, 67e12, 3.35e12},
  };
  for (const Known& k : kKnown) {
    if (absl::StrContains(device.name, k.match) &&
        (k.also[0] == '\0' || absl::StrContains(device.name, k.also))) {
      s.set_peak_matmul_flops_per_second(k.tf32);
      s.set_peak_vector_flops_per_second(k.fp32);
      s.set_memory_bandwidth_bytes_per_second(k.bandwidth);
      return s;
    }
  }
  // Unknown: per SM per clock, 2048 TF32 FLOPs from Hopper on, 1024 on Ampere,
  // 256 FP32 FLOPs; a 1.5 GHz clock; bandwidth a guess between generations.
  const double clock = 1.5e9, sms = std::max(1, device.multiprocessors);
  const double per_sm = device.compute_major >= 9 ? 2048 : device.compute_major >= 8 ? 1024 : 256;
  s.set_peak_matmul_flops_per_second(sms * per_sm * clock);
  s.set_peak_vector_flops_per_second(sms * 256 * clock);
  s.set_memory_bandwidth_bytes_per_second(device.compute_major >= 9 ? 3e12 : 1.5e12);
  s.set_name(absl::StrCat(device.name, " (rates estimated from SM count and compute capability)"));
  return s;
}

ProcessorSpec OnThreads(const ProcessorSpec& processor, int threads) {
  ProcessorSpec p = processor;
  if (threads <= 0 || threads >= p.threads()) return p;
  // The rates those threads reach (planner::ThreadsRate); bandwidth alike.
  const double f = planner::ThreadsRate(p, threads) / planner::ThreadsRate(p, p.threads());
  p.set_peak_matmul_flops_per_second(f * p.peak_matmul_flops_per_second());
  p.set_peak_bf16_matmul_flops_per_second(f * p.peak_bf16_matmul_flops_per_second());
  p.set_peak_vector_flops_per_second(f * p.peak_vector_flops_per_second());
  p.set_memory_bandwidth_bytes_per_second(f * p.memory_bandwidth_bytes_per_second());
  p.set_threads(threads);
  return p;
}

absl::StatusOr<HardwareSpec> NodeHardware(const JobSpec& resolved, const NodeOffer& node,
                                          int64_t capacity) {
  HardwareSpec hw;
  hw.set_name("this node");
  *hw.mutable_host() = node.host;
  const AcceleratorKind kind = KindOf(resolved);
  if (kind == tandem::v1::ACCELERATOR_KIND_NONE) return hw;
  ProcessorSpec* accel = hw.add_accelerators();
  if (kind == tandem::v1::ACCELERATOR_KIND_EMULATED) {
    // It computes on the host's cores, copies at memcpy speed (two bytes of
    // traffic per byte moved) or at its cap. It shares those cores with host
    // work, which the planner does not model: its plans there are correct but
    // their predicted overlap is optimistic. Never a GPU figure (docs/planning.md).
    *accel = node.host;
    accel->set_kind(tandem::v1::DEVICE_KIND_EMULATED);
    accel->set_name("emulated accelerator (host cores)");
    accel->set_memory_bytes(capacity);
    // Its compute stream has the job's threads: with fewer than the node's,
    // the rates those reach.
    const int threads = resolved.training().threads();
    if (threads > 0 && threads < accel->threads()) {
      *accel = OnThreads(*accel, threads);
      accel->set_name(absl::StrFormat("emulated accelerator (%d of the host's cores)", threads));
    }
    const double cap = resolved.resources().emulated_link_bytes_per_second();
    const double memcpy = node.profile && node.profile->host_memcpy_bytes_per_second() > 0
                              ? node.profile->host_memcpy_bytes_per_second()
                              : node.host.memory_bandwidth_bytes_per_second() / 2;
    const double link = cap > 0 ? std::min(cap, memcpy) : memcpy;
    hw.mutable_host_to_accelerator()->set_bandwidth_bytes_per_second(link);
    hw.mutable_accelerator_to_host()->set_bandwidth_bytes_per_second(link);
    // A pipeline's stages copy between each other over it (CreateAccelerator).
    if (node.emulated_peer_link) {
      hw.mutable_accelerator_to_accelerator()->set_bandwidth_bytes_per_second(link);
    }
    hw.set_description("the host with the emulated accelerator");
  } else {
    if (node.cuda_devices.empty()) {
      return absl::FailedPreconditionError(
          "placement.accelerator: CUDA, but this node has no CUDA device");
    }
    *accel = AcceleratorSpec(node.cuda_devices[0]);
    accel->set_memory_bytes(capacity);
    // Pinned-memory copies over PCIe: ~50 GB/s on Gen5 x16 (Hopper), ~25 GB/s
    // on Gen4 x16, with ~10 us per transfer, unless the node profile measured
    // this device's pinned links.
    const double link = node.cuda_devices[0].compute_major >= 9 ? 50e9 : 25e9;
    const std::string id = absl::StrCat("cuda:", node.cuda_devices[0].ordinal);
    for (auto [spec, direction] :
         {std::pair{hw.mutable_host_to_accelerator(), tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE},
          std::pair{hw.mutable_accelerator_to_host(), tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST}}) {
      spec->set_bandwidth_bytes_per_second(link);
      spec->set_latency_seconds(10e-6);
      if (!node.profile) continue;
      for (const tandem::v1::LinkProfile& measured : node.profile->links()) {
        const std::string& device = direction == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE
                                        ? measured.to_device_id()
                                        : measured.from_device_id();
        if (measured.pinned() && measured.direction() == direction && device == id &&
            measured.bandwidth_bytes_per_second() > 0) {
          spec->set_bandwidth_bytes_per_second(measured.bandwidth_bytes_per_second());
          spec->set_latency_seconds(measured.latency_seconds());
        }
      }
    }
    hw.set_description(absl::StrCat("the host with ", node.cuda_devices[0].name));
  }
  // The others alike (a pipeline's stages). Between CUDA devices the runner
  // copies peer-to-peer where the driver allows, but their link is not
  // measured: the planner times those copies through the host.
  for (int i = 1; i < AcceleratorCount(resolved, node); ++i) {
    *hw.add_accelerators() = hw.accelerators(0);
  }
  return hw;
}

absl::StatusOr<PlanModelResponse> SolveForExecutor(const Model& model, planner::PlanRequest request,
                                                   int64_t capacity) {
  if (capacity <= 0) capacity = SourceCapacity(request);
  if (capacity <= 0) return planner::SolvePlan(request);
  const int batch = request.batch_size > 0 ? request.batch_size : request.profile.batch_size();
  // A pipeline's stages keep PlanPipelineJob's room for their transients
  // and inputs in flight, whatever the stage count (pipeline_auto's too).
  request.pipeline_stage_memory = [&model, batch, capacity, schedule = request.pipeline_schedule,
                                   continuous = request.pipeline_continuous](int stages,
                                                                             int micro) {
    tandem::v1::PipelineSpec pipe;
    pipe.set_schedule(schedule);
    pipe.set_continuous(continuous);
    return std::max<int64_t>(
        1, capacity - PipelineStageMargin(model, micro,
                                          PipelineInputsInFlight(pipe, stages, batch / micro)));
  };
  auto solve = [&](int micro_batch) -> absl::StatusOr<PlanModelResponse> {
    planner::PlanRequest r = request;
    r.micro_batch_size = micro_batch;
    // The executor's fp32 transients: for a 16-bit plan twice what it needs,
    // so such a plan errs on the side of fitting.
    const int64_t margin = ExecutorMemoryMargin(model, micro_batch > 0 ? micro_batch : batch);
    r.accelerator_memory_bytes = std::max<int64_t>(1, capacity - margin);
    TANDEM_ASSIGN_OR_RETURN(PlanModelResponse response, planner::SolvePlan(r));
    auto annotate = [&](Plan& plan) {
      if (plan.strategy() == tandem::v1::STRATEGY_CPU_ONLY) return;
      // A pipeline's: what its budget per stage left of the capacity.
      const bool pipeline = plan.pipeline_size() > 0;
      const int64_t kept = pipeline ? capacity - plan.accelerator_memory_budget_bytes() : margin;
      const char* whose = pipeline ? "each stage's" : "the executor's";
      if (plan.min_accelerator_memory_bytes() > 0) {
        plan.set_min_accelerator_memory_bytes(plan.min_accelerator_memory_bytes() + kept);
      }
      const std::string note =
          kept >= capacity
              ? absl::StrCat(whose,
                             " transient buffers (inputs, gradients between layers, prefetch "
                             "slack) alone need ",
                             FormatBytes(kept, 1), " of the accelerator's ",
                             FormatBytes(capacity, 1))
              : absl::StrCat(FormatBytes(kept, 1), " of the accelerator's ",
                             FormatBytes(capacity, 1), " kept for ", whose,
                             " transient buffers (inputs, gradients between layers, prefetch "
                             "slack)");
      plan.mutable_solver()->set_note(absl::StrCat(plan.solver().note(), "; ", note));
    };
    annotate(*response.mutable_plan());
    for (Plan& p : *response.mutable_alternatives()) annotate(p);
    return response;
  };
  TANDEM_ASSIGN_OR_RETURN(PlanModelResponse response, solve(request.micro_batch_size));
  // (A pipeline's micro-batch is its own: PipelineMicroBatch.)
  if (response.plan().feasible() || request.micro_batch_size > 0 || batch <= 1 ||
      request.pipeline_devices > 1) {
    return response;
  }
  // The margin scales with the micro-batch: try smaller ones, largest first.
  // When none fits, answer with the one that needs the least memory.
  PlanModelResponse least = response;
  const int smallest = planner::SmallestMicroBatch(batch, model.num_layers());
  for (int m = batch / 2; m >= smallest; --m) {
    if (batch % m != 0) continue;
    if (request.stop && request.stop()) {
      return absl::CancelledError("planning stopped: the caller has gone");
    }
    TANDEM_ASSIGN_OR_RETURN(PlanModelResponse smaller, solve(m));
    if (smaller.plan().feasible()) return smaller;
    const int64_t need = smaller.plan().min_accelerator_memory_bytes();
    if (need > 0 && (least.plan().min_accelerator_memory_bytes() == 0 ||
                     need < least.plan().min_accelerator_memory_bytes())) {
      least = std::move(smaller);
    }
  }
  return least;
}

namespace {

absl::Status ForcedPlanError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("placement.plan.", field, ": ", message));
}

// The runner runs the plan's schedule and micro-batches: a forced plan's must
// be the spec's, which the spec's other checks (clipping, vertical sync, even
// micro-batches) were made against.
absl::Status CheckForcedPipelineSchedule(const tandem::v1::PipelineSpec& pipe, const Plan& plan) {
  if (!tandem::v1::PipelineSchedule_IsValid(plan.pipeline_schedule())) {
    return ForcedPlanError("pipeline_schedule",
                           absl::StrCat("unknown value ", plan.pipeline_schedule()));
  }
  if (plan.pipeline_schedule() != pipe.schedule()) {
    return ForcedPlanError("pipeline_schedule",
                           absl::StrCat(tandem::v1::PipelineSchedule_Name(plan.pipeline_schedule()),
                                        " is not placement.pipeline.schedule (",
                                        tandem::v1::PipelineSchedule_Name(pipe.schedule()), ")"));
  }
  if (plan.micro_batches() != 0 && plan.micro_batches() != pipe.micro_batches()) {
    return ForcedPlanError(
        "micro_batches",
        absl::StrCat(plan.micro_batches(), " is not placement.pipeline.micro_batches (",
                     pipe.micro_batches(), ")"));
  }
  return absl::OkStatus();
}

// A forced plan's stages against the model and placement.pipeline: the same
// number, contiguous, every layer in one, each on its own accelerator.
absl::Status ValidateForcedPipeline(const Model& model, const JobSpec& resolved, const Plan& plan) {
  const int want = resolved.placement().pipeline().stages();
  const int K = plan.pipeline_size();
  if (K == 0 && want <= 1) return absl::OkStatus();
  if (K != want) {
    return ForcedPlanError("pipeline",
                           absl::StrCat("the plan has ", K, " stages but placement.pipeline.stages",
                                        " is ", want, " (a one-stage plan has no pipeline)"));
  }
  const tandem::v1::PipelineSpec& pipe = resolved.placement().pipeline();
  TANDEM_RETURN_IF_ERROR(CheckForcedPipelineSchedule(pipe, plan));
  std::set<int> devices;
  int next = 0;
  for (int k = 0; k < K; ++k) {
    const tandem::v1::PipelineStage& st = plan.pipeline(k);
    const std::string field = absl::StrCat("pipeline[", k, "]");
    if (st.first_layer() != next || st.last_layer() < st.first_layer() ||
        st.last_layer() >= model.num_layers()) {
      return ForcedPlanError(
          field, absl::StrCat("layers [", st.first_layer(), ", ", st.last_layer(),
                              "]: stages must be non-empty, ", "contiguous and start at layer ",
                              next, " of ", model.num_layers()));
    }
    if (st.device_index() < 0 || !devices.insert(st.device_index()).second) {
      return ForcedPlanError(field + ".device_index",
                             absl::StrCat(st.device_index(), " is negative or another stage's"));
    }
    const bool pipedream = pipe.schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM;
    if (st.recompute() && pipedream) {
      return ForcedPlanError(field + ".recompute",
                             "PipeDream's stashed weights do not recompute (GPipe and 1F1B do)");
    }
    if (st.offload_optimizer() && pipedream) {
      return ForcedPlanError(field + ".offload_optimizer",
                             "PipeDream updates on the device after every micro-batch (GPipe and "
                             "1F1B offload)");
    }
    if (st.offload_activations() && st.recompute()) {
      return ForcedPlanError(field + ".offload_activations",
                             "a stage that recomputes its activations has none to offload; set "
                             "one of recompute and offload_activations");
    }
    if (st.host_updated_layers() < 0 ||
        st.host_updated_layers() > st.last_layer() - st.first_layer() + 1) {
      return ForcedPlanError(field + ".host_updated_layers",
                             absl::StrCat(st.host_updated_layers(), " is not in [0, ",
                                          st.last_layer() - st.first_layer() + 1,
                                          "] (the stage's layers; 0: all of them)"));
    }
    if (st.host_updated_layers() > 0 && !st.offload_optimizer()) {
      return ForcedPlanError(field + ".host_updated_layers",
                             "the stage keeps no optimizer state on the host (offload_optimizer)");
    }
    if (st.stream_weights() && !st.offload_optimizer()) {
      return ForcedPlanError(field + ".stream_weights",
                             "only layers that update on the host stream their weights; the "
                             "stage keeps no optimizer state there (offload_optimizer)");
    }
    if (st.wait_for_activation_copies() && !st.offload_activations()) {
      return ForcedPlanError(field + ".wait_for_activation_copies",
                             "the stage offloads no activations (offload_activations) to wait for");
    }
    next = st.last_layer() + 1;
  }
  if (next != model.num_layers()) {
    return ForcedPlanError(
        "pipeline", absl::StrCat("the stages end at layer ", next - 1, "; the model's last is ",
                                 model.num_layers() - 1));
  }
  return absl::OkStatus();
}

// A plan given in the spec, checked field by field before the job is accepted
// (the executor would otherwise meet an unknown enum, a thread count or a
// micro-batch it cannot run only when the job starts).
absl::Status ValidateForcedPlan(const Model& model, const JobSpec& resolved, const Plan& plan) {
  using namespace tandem::v1;  // NOLINT: the enum names are long enough.
  if (plan.layers_size() != model.num_layers()) {
    return ForcedPlanError("layers", absl::StrCat(plan.layers_size(), " layers, but the model has ",
                                                  model.num_layers()));
  }
  if (!Strategy_IsValid(plan.strategy()) || plan.strategy() == STRATEGY_UNSPECIFIED ||
      plan.strategy() == STRATEGY_AUTO) {
    return ForcedPlanError(
        "strategy", absl::StrCat("must name the plan's strategy (got ", plan.strategy(), ")"));
  }
  if (plan.strategy() != STRATEGY_CPU_ONLY && KindOf(resolved) == ACCELERATOR_KIND_NONE) {
    return ForcedPlanError(
        "strategy", absl::StrCat(Strategy_Name(plan.strategy()), " needs placement.accelerator"));
  }
  if (!DeviceKind_IsValid(plan.accelerator())) {
    return ForcedPlanError("accelerator", absl::StrCat("unknown value ", plan.accelerator()));
  }
  const int64_t batch = resolved.training().batch_size();
  if (plan.micro_batch_size() <= 0 || plan.micro_batch_size() > batch) {
    return ForcedPlanError("micro_batch_size", absl::StrCat("must be in [1, ", batch, "], got ",
                                                            plan.micro_batch_size()));
  }
  if (absl::Status bound = planner::CheckMicroBatchBound(
          static_cast<int>(batch), plan.micro_batch_size(), model.num_layers());
      !bound.ok()) {
    return ForcedPlanError("micro_batch_size", std::string(bound.message()));
  }
  if (plan.batch_size() != 0 && plan.batch_size() != batch) {
    return ForcedPlanError("batch_size", absl::StrCat(plan.batch_size(), " is not the job's ",
                                                      "training.batch_size ", batch, " (or 0)"));
  }
  if (plan.accelerator_batch_share() < 0 || plan.accelerator_batch_share() > batch) {
    return ForcedPlanError("accelerator_batch_share", absl::StrCat("must be in [0, ", batch, "]"));
  }
  if (plan.host_update_threads() < 0 || plan.host_update_threads() > kMaxHostUpdateThreads) {
    return ForcedPlanError("host_update_threads",
                           absl::StrCat("must be in [0, ", kMaxHostUpdateThreads, "]"));
  }
  TANDEM_RETURN_IF_ERROR(ValidateForcedPipeline(model, resolved, plan));
  for (int l = 0; l < plan.layers_size(); ++l) {
    const LayerPlan& layer = plan.layers(l);
    const std::string field = absl::StrCat("layers[", l, "]");
    auto placement_ok = [](Placement p) {
      return p == PLACEMENT_HOST || p == PLACEMENT_ACCELERATOR;
    };
    if (!placement_ok(layer.compute())) {
      return ForcedPlanError(field + ".compute", "must be PLACEMENT_HOST or PLACEMENT_ACCELERATOR");
    }
    if (!placement_ok(layer.update())) {
      return ForcedPlanError(field + ".update", "must be PLACEMENT_HOST or PLACEMENT_ACCELERATOR");
    }
    if (!ParameterHome_IsValid(layer.parameter_home()) ||
        layer.parameter_home() == PARAMETER_HOME_UNSPECIFIED) {
      return ForcedPlanError(field + ".parameter_home", "must name where the weights live");
    }
    if (!ActivationPolicy_IsValid(layer.activation_policy())) {
      return ForcedPlanError(field + ".activation_policy",
                             absl::StrCat("unknown value ", layer.activation_policy()));
    }
  }
  return absl::OkStatus();
}

// `measured` (what an earlier job of this model measured on one of the
// node's accelerators) with `k` accelerators of that kind: the others are
// copies of the first, as the node's accelerators are alike.
// `peer`: the accelerators reach each other over a link like the measured
// host-to-device one (the emulated accelerators' peer link), added to the
// profile's links where it has none between devices.
tandem::v1::Profile WithAcceleratorsAlike(tandem::v1::Profile measured, int k, bool peer) {
  if (peer && planner::BestLink(measured, tandem::v1::LINK_DIRECTION_DEVICE_TO_DEVICE) == nullptr) {
    if (const tandem::v1::LinkProfile* h2d =
            planner::BestLink(measured, tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE)) {
      tandem::v1::LinkProfile link = *h2d;
      link.set_direction(tandem::v1::LINK_DIRECTION_DEVICE_TO_DEVICE);
      link.set_from_device_id(h2d->to_device_id());
      *measured.add_links() = std::move(link);
    }
  }
  const tandem::v1::DeviceProfile* first = nullptr;
  int count = 0;
  for (const tandem::v1::DeviceProfile& d : measured.devices()) {
    if (d.kind() == tandem::v1::DEVICE_KIND_CPU) continue;
    if (first == nullptr) first = &d;
    if (d.kind() == first->kind()) ++count;
  }
  if (first == nullptr) return measured;
  const tandem::v1::DeviceProfile like = *first;
  for (; count < k; ++count) {
    tandem::v1::DeviceProfile* copy = measured.add_devices();
    *copy = like;
    copy->set_id(absl::StrCat(like.id(), "+", count));
  }
  return measured;
}

}  // namespace

// placement.pipeline.stages accelerators of the job's capacity each: the
// planner's partition (SolvePipelinePlan) of the gpu_only layers.
absl::StatusOr<Plan> PlanPipelineJob(const Model& model, const JobSpec& resolved,
                                     const NodeOffer& node, const tandem::v1::Profile* measured,
                                     const PipelineCorrections* corrections) {
  const auto& placement = resolved.placement();
  const int K = placement.pipeline().stages();
  if (K > model.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("placement.pipeline.stages: ", K,
                                                   " stages for a model of ", model.num_layers(),
                                                   " layers"));
  }
  const int have = AcceleratorCount(resolved, node);
  if (K > have) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement.pipeline.stages: ", K, " stages, but this node offers ", have, " ",
                     KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_EMULATED
                         ? "emulated accelerators (tandemd --emulated_accelerators)"
                         : "CUDA devices"));
  }
  if (placement.has_plan()) {
    TANDEM_RETURN_IF_ERROR(ValidateForcedPlan(model, resolved, placement.plan()));
    return placement.plan();
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t capacity, AcceleratorCapacity(resolved, node));
  if (KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_CUDA) capacity -= kCudaFixedBytes;
  const int micro = placement.micro_batch_size();
  // Each stage's transients (its input, the gradients between its layers, a
  // workspace), as a single device's executor keeps room for them.
  const int M = resolved.training().batch_size() / std::max(1, micro);
  const int64_t margin =
      PipelineStageMargin(model, micro, PipelineInputsInFlight(placement.pipeline(), K, M));
  if (capacity <= margin) {
    return absl::ResourceExhaustedError(
        absl::StrCat("resources.accelerator_memory_bytes: ", FormatBytes(capacity, 1),
                     " per stage does not hold the ", FormatBytes(margin, 1),
                     " of a stage's transient buffers"));
  }
  planner::PlanRequest request;
  if (measured != nullptr) {
    request.profile = WithAcceleratorsAlike(
        *measured, K,
        KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_EMULATED && node.emulated_peer_link);
  } else {
    // The pipeline runner keeps fp32 weights and gradients on every stage
    // (no working copies), whatever its layers compute in.
    request.profile = profile::AnalyticProfile(model, resolved.optimizer(),
                                               resolved.training().batch_size(), DType::kF32);
    TANDEM_ASSIGN_OR_RETURN(request.hardware, NodeHardware(resolved, node, capacity));
  }
  planner::TakePlacement(resolved, &request);
  request.batch_size = resolved.training().batch_size();
  request.accelerator_memory_bytes = capacity - margin;
  request.pipeline_devices = K;
  if (corrections != nullptr) {
    request.pipeline_compute_scale = corrections->compute_scale;
    request.pipeline_update_scale = corrections->update_scale;
    request.pipeline_stages = corrections->stages;
  }
  TANDEM_ASSIGN_OR_RETURN(Plan plan,
                          planner::SolvePipelinePlan(request, placement.pipeline().schedule()));
  if (!plan.feasible()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("placement.pipeline: no split of ", model.num_layers(), " layers over ", K,
                     " accelerators fits ", FormatBytes(capacity, 1),
                     " each (resources.accelerator_memory_", "bytes, ", FormatBytes(margin, 1),
                     " of it kept for transient buffers): ", plan.solver().note()));
  }
  plan.mutable_solver()->set_note(
      absl::StrCat(plan.solver().note(), "; ", FormatBytes(margin, 1),
                   " of each stage's accelerator kept for transient buffers"));
  return plan;
}

int PipelineInputsInFlight(const tandem::v1::PipelineSpec& pipe, int stages, int micro_batches) {
  if (pipe.schedule() == tandem::v1::PIPELINE_SCHEDULE_GPIPE) return micro_batches;
  return pipe.continuous() ? stages : std::min(stages, micro_batches);
}

int64_t PipelineStageMargin(const Model& model, int64_t micro_batch, int inputs_in_flight) {
  // Parameters, gradients and up to two moments per layer, each slice padded
  // to kSliceAlignElements; the running statistics' one.
  const int64_t padding = (int64_t{model.num_layers()} * 4 + 1) * kSliceAlignElements * 4;
  // ExecutorMemoryMargin counts one micro-batch's input.
  const int64_t inputs =
      std::max(0, inputs_in_flight - 1) * micro_batch * model.data().sample_shape.elements() * 4;
  return ExecutorMemoryMargin(model, micro_batch) + model.MaxWorkspaceBytes(micro_batch) + inputs +
         padding;
}

int AcceleratorCount(const JobSpec& resolved, const NodeOffer& node) {
  switch (KindOf(resolved)) {
    case tandem::v1::ACCELERATOR_KIND_EMULATED:
      return std::max(1, node.emulated_accelerators);
    case tandem::v1::ACCELERATOR_KIND_CUDA:
      return static_cast<int>(node.cuda_devices.size());
    default:
      return 0;
  }
}

namespace {

absl::StatusOr<Plan> PlanOneAccelerator(const Model& model, const JobSpec& resolved,
                                        const NodeOffer& node, const tandem::v1::Profile* measured);

// "4 stages (1F1B, 16 micro-batches) 12.345 ms" or "one accelerator
// (reuse_distance) does not fit: ...".
std::string CandidateLine(const std::string& name, const absl::StatusOr<Plan>& plan) {
  if (!plan.ok()) return absl::StrCat(name, " does not fit (", plan.status().message(), ")");
  return absl::StrFormat("%s %.3f ms", name, 1e3 * plan->prediction().iteration_seconds());
}

// The micro-batch counts auto_stages tries for k stages: the spec's when it
// gives them (pipeline.micro_batches, or placement.micro_batch_size), else
// every divisor of the batch from k to 8k (fewer micro-batches than stages
// leave stages idle; more shrink the bubble, (k-1)/(M+k-1), but each
// micro-batch is smaller and pays its own per-call costs).
std::vector<int> MicroBatchCandidates(const JobSpec& resolved, int k) {
  const int batch = resolved.training().batch_size();
  if (resolved.placement().pipeline().micro_batches() > 0) {
    return {resolved.placement().pipeline().micro_batches()};
  }
  if (resolved.placement().micro_batch_size() > 0) {
    return {batch / resolved.placement().micro_batch_size()};
  }
  std::vector<int> out;
  for (int m = std::min(k, batch); m <= std::min(8 * k, batch); ++m) {
    if (batch % m == 0) out.push_back(m);
  }
  return out;
}

// placement.pipeline.auto_stages: the one-accelerator plan against pipelines
// over 2, 4, 8, ... of the node's accelerators; the fastest predicted that
// fits, its note saying what was compared. A candidate that does not fit
// (RESOURCE_EXHAUSTED) loses; any other error is the job's.
absl::StatusOr<Plan> PlanAutoStages(const Model& model, const JobSpec& resolved,
                                    const NodeOffer& node, const tandem::v1::Profile* measured) {
  std::vector<std::pair<std::string, absl::StatusOr<Plan>>> candidates;
  candidates.emplace_back(absl::StrCat("one accelerator (",
                                       planner::StrategyName(resolved.placement().strategy()), ")"),
                          PlanOneAccelerator(model, resolved, node, measured));
  const int most = std::min(AcceleratorCount(resolved, node), model.num_layers());
  for (int k = 2; k <= most; k *= 2) {
    for (int m : MicroBatchCandidates(resolved, k)) {
      JobSpec staged = resolved;
      TANDEM_RETURN_IF_ERROR(ResolvePipelineStages(staged, k, m));
      const auto& pipe = staged.placement().pipeline();
      candidates.emplace_back(
          absl::StrCat(k, " stages (", tandem::v1::PipelineSchedule_Name(pipe.schedule()), ", ",
                       pipe.micro_batches(), " micro-batches)"),
          PlanPipelineJob(model, staged, node, measured));
    }
  }
  int best = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    const absl::StatusOr<Plan>& c = candidates[i].second;
    if (!c.ok() && c.status().code() != absl::StatusCode::kResourceExhausted) return c.status();
    if (c.ok() && (best < 0 || c->prediction().iteration_seconds() <
                                   candidates[best].second->prediction().iteration_seconds())) {
      best = i;
    }
  }
  std::vector<std::string> lines;
  for (const auto& [name, plan] : candidates) lines.push_back(CandidateLine(name, plan));
  const std::string compared = absl::StrJoin(lines, "; ");
  if (best < 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "placement.pipeline.auto_stages: nothing fits resources.accelerator_memory_bytes: ",
        compared));
  }
  Plan plan = *std::move(candidates[best].second);
  plan.mutable_solver()->set_note(absl::StrCat("placement.pipeline.auto_stages chose ",
                                               candidates[best].first, " of: ", compared, ". ",
                                               plan.solver().note()));
  return plan;
}

}  // namespace

absl::StatusOr<Plan> PlanJob(const Model& model, const JobSpec& resolved, const NodeOffer& node,
                             const tandem::v1::Profile* measured,
                             const PipelineCorrections* corrections) {
  work_counters::Count(work_counters::plan_solves);
  if (PlainCpu(resolved)) return Plan();
  absl::StatusOr<Plan> plan =
      resolved.placement().pipeline().stages() > 1
          ? PlanPipelineJob(model, resolved, node, measured, corrections)
      : resolved.placement().pipeline().auto_stages() && !resolved.placement().has_plan()
          ? PlanAutoStages(model, resolved, node, measured)
          : PlanOneAccelerator(model, resolved, node, measured);
  // A closed-loop profile's per-call dispatch is in its phases: the plan
  // says so, so that its check counts it as idle time, not busy.
  if (plan.ok() && measured != nullptr) {
    plan->mutable_prediction()->set_accelerator_dispatch_seconds(
        measured->provenance().accelerator_dispatch_seconds());
    plan->mutable_prediction()->set_host_dispatch_seconds(
        measured->provenance().host_dispatch_seconds());
  }
  return plan;
}

absl::StatusOr<JobSpec> ChosenStages(JobSpec resolved, const Plan& plan) {
  if (!resolved.placement().pipeline().auto_stages()) return resolved;
  TANDEM_RETURN_IF_ERROR(ResolvePipelineStages(
      resolved, plan.pipeline_size(), plan.pipeline_size() > 1 ? plan.micro_batches() : 0));
  return resolved;
}

namespace {

// The request PlanOneAccelerator solves: from `measured` when given (the
// cost model comes from its timings and links), else from the analytic
// profile on the node's rates at `capacity` of accelerator memory.
absl::StatusOr<planner::PlanRequest> OneAcceleratorRequest(const Model& model,
                                                           const JobSpec& resolved,
                                                           const NodeOffer& node,
                                                           const tandem::v1::Profile* measured,
                                                           int64_t capacity) {
  planner::PlanRequest request;
  if (measured != nullptr) {
    request.profile = *measured;
  } else {
    request.profile =
        profile::AnalyticProfile(model, resolved.optimizer(), resolved.training().batch_size());
    TANDEM_ASSIGN_OR_RETURN(request.hardware, NodeHardware(resolved, node, capacity));
  }
  request.batch_size = resolved.training().batch_size();
  request.host_memory_bytes = resolved.resources().host_memory_bytes();
  planner::TakePlacement(resolved, &request);
  request.compare = {resolved.placement().strategy()};
  request.accelerator_shares_host_cores = KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_EMULATED;
  return request;
}

absl::StatusOr<Plan> PlanOneAccelerator(const Model& model, const JobSpec& resolved,
                                        const NodeOffer& node,
                                        const tandem::v1::Profile* measured) {
  const auto& placement = resolved.placement();
  if (placement.has_plan()) {
    TANDEM_RETURN_IF_ERROR(ValidateForcedPlan(model, resolved, placement.plan()));
    return placement.plan();
  }
  TANDEM_ASSIGN_OR_RETURN(int64_t capacity, AcceleratorCapacity(resolved, node));
  if (KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_CUDA) {
    if (capacity <= kCudaFixedBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("resources.accelerator_memory_bytes: ", FormatBytes(capacity, 1),
                       " does not hold the GPU's own ", FormatBytes(kCudaFixedBytes, 1),
                       " of cuBLAS workspace"));
    }
    capacity -= kCudaFixedBytes;
  }
  TANDEM_ASSIGN_OR_RETURN(const planner::PlanRequest request,
                          OneAcceleratorRequest(model, resolved, node, measured, capacity));
  TANDEM_ASSIGN_OR_RETURN(PlanModelResponse response, SolveForExecutor(model, request, capacity));
  const Plan& plan = response.plan();
  if (!plan.feasible()) {
    const std::string name = planner::StrategyName(placement.strategy());
    return absl::ResourceExhaustedError(
        absl::StrCat("placement.strategy: no ", name, " plan fits ", FormatBytes(capacity, 1),
                     " of accelerator memory",
                     plan.min_accelerator_memory_bytes() > 0
                         ? absl::StrCat("; it needs at least ",
                                        FormatBytes(plan.min_accelerator_memory_bytes(), 1),
                                        " (resources.accelerator_memory_bytes)")
                         : "",
                     ": ", plan.solver().note()));
  }
  return plan;
}

}  // namespace

std::string MeasuredCostSource(const tandem::v1::Profile& measured) {
  const auto& provenance = measured.provenance();
  return absl::StrCat(
      "the layer profile an earlier job of this model measured here (",
      provenance.has_create_time()
          ? absl::StrCat(google::protobuf::util::TimeUtil::ToString(provenance.create_time()), ", ")
          : "",
      provenance.iterations(), " steps)",
      provenance.note().empty() ? "" : absl::StrCat(": ", provenance.note()));
}

std::string AnalyticCostSource(const NodeOffer& node) {
  return node.profile ? "the analytic profile on this node's measured rates (node profile)"
                      : "the analytic profile on this host's GEMM and triad rates";
}

namespace {

// The precision a PlanModel request's plans are for, by its cost source; for
// this node, the one a job of `resolved` would run in here (ChoosePrecisionHere),
// planned as it runs (AnalyticProfile of the bf16 model): fp32 tensors between
// layers, bf16 working copies of host-updated weights and their gradients on
// the accelerator and across the link, bf16 operand copies in each layer's
// workspace.
absl::StatusOr<PrecisionChoice> PlanPrecision(const tandem::v1::PlanModelRequest& rpc,
                                              const JobSpec& resolved) {
  // As resolved: a pipeline's AUTO is fp32 (spec/job_spec.cc), as it runs.
  const tandem::v1::Precision asked = resolved.precision();
  switch (rpc.cost_source_case()) {
    case tandem::v1::PlanModelRequest::kProfile:
      return ChoosePrecisionForProfile(asked, rpc.profile());
    case tandem::v1::PlanModelRequest::kHardware:
      return ChoosePrecisionFor(asked, rpc.hardware(), "spec.precision");
    default: {
      TANDEM_ASSIGN_OR_RETURN(
          PrecisionChoice choice,
          ChoosePrecisionHere(asked, LocalComputeFor(resolved), "spec.precision"));
      if (choice.precision == tandem::v1::PRECISION_FP16) {
        absl::StrAppend(&choice.reason,
                        ". Planned as it runs here: an fp16 job keeps fp32 weights, gradients "
                        "and optimizer state (no working copies), and its products are timed "
                        "at the fp32 rate");
      } else if (IsMixed(choice.precision)) {
        absl::StrAppend(&choice.reason,
                        ". Planned as it runs here: tensors between layers in fp32; weights "
                        "and gradients on the accelerator and across the link as bf16 working "
                        "copies, fp32 master weights with the optimizer state; each layer's "
                        "bf16 operand copies and fp32 staging in its workspace; its products "
                        "timed at the node's measured bf16 GEMM rate (the fp32 rate where none "
                        "was measured), or from a bf16 layer profile measured here");
      }
      return choice;
    }
  }
}

}  // namespace

namespace {

// What a request's own cost source is, for PlanModelResponse.cost_source
// (empty: this machine, said later).
std::string RequestCostSource(const tandem::v1::PlanModelRequest& rpc) {
  switch (rpc.cost_source_case()) {
    case tandem::v1::PlanModelRequest::kProfile:
      return absl::StrCat("the request's profile (", rpc.profile().provenance().source(), ")");
    case tandem::v1::PlanModelRequest::kHardware:
      return absl::StrCat("the analytic profile on the request's hardware (", rpc.hardware().name(),
                          ")");
    default:
      return "";
  }
}

// A request's own profile is of the spec's model: as many layers.
absl::Status CheckRequestProfile(const tandem::v1::PlanModelRequest& rpc, const Model& model) {
  if (rpc.cost_source_case() != tandem::v1::PlanModelRequest::kProfile ||
      rpc.profile().layers_size() == model.num_layers()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "profile.layers: ", rpc.profile().layers_size(), " layers, but the spec's model has ",
      model.num_layers(), " (a profile of another model)"));
}

// PlanModelRequest.nodes' multi-node prediction of the job (planner/scale_out.h),
// or nothing without nodes.
absl::StatusOr<std::optional<planner::ScaleOutRequest>> ScaleOutRequestFor(
    const tandem::v1::PlanModelRequest& rpc, const JobSpec& resolved,
    const planner::PlanRequest& request, tandem::v1::Precision precision) {
  if (rpc.nodes_size() == 0) return std::nullopt;
  if (!request.hardware || rpc.cost_source_case() != tandem::v1::PlanModelRequest::kHardware) {
    return absl::InvalidArgumentError(
        "nodes: a multi-node plan is for a hardware spec (hardware), not this machine or a "
        "profile");
  }
  planner::ScaleOutRequest s;
  s.rank = request;
  s.nodes.assign(rpc.nodes().begin(), rpc.nodes().end());
  if (resolved.distributed().bucket_bytes() > 0)
    s.bucket_bytes = resolved.distributed().bucket_bytes();
  s.sharding = rpc.spec().distributed().sharding();
  s.gradient_bytes_per_element = precision == tandem::v1::PRECISION_BF16 ? 2 : 4;
  return s;
}

// PlanModel for this node (no cost source in the request), as PlanJob plans
// the job: `request` from the layer profile a run of the model measured here
// (context.measured) or the node's rates, and a pipeline's stage
// corrections; `*capacity` the accelerator's (the request's when it gives
// one), and `*cost_source` says which figures.
absl::Status PlanForThisNode(const Model& model, const JobSpec& resolved, const NodeOffer& node,
                             const PlanModelContext& context, planner::PlanRequest& request,
                             int64_t* capacity, std::string* cost_source) {
  if (KindOf(resolved) != tandem::v1::ACCELERATOR_KIND_NONE && *capacity == 0) {
    TANDEM_ASSIGN_OR_RETURN(*capacity, AcceleratorCapacity(resolved, node));
  }
  if (KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_CUDA && *capacity > kCudaFixedBytes) {
    *capacity -= kCudaFixedBytes;  // as PlanJob: what the GPU holds for itself
  }
  // As PlanJob: a layer profile measured here replaces the analytic one and
  // the node's rates.
  std::optional<tandem::v1::Profile> measured;
  if (context.measured && KindOf(resolved) != tandem::v1::ACCELERATOR_KIND_NONE) {
    measured = context.measured(model, resolved);
  }
  if (measured) {
    *cost_source = MeasuredCostSource(*measured);
    // As PlanPipelineJob: a pipeline's stages each on an accelerator like
    // the one measured, no more than the node has (more stages are
    // refused as with the analytic profile); pipeline_auto's candidates
    // over as many as the node has.
    const int accelerators = AcceleratorCount(resolved, node);
    const int copies = request.pipeline_devices > 1
                           ? std::min(request.pipeline_devices, accelerators)
                           : (request.pipeline_auto ? accelerators : 1);
    request.profile = copies > 1 ? WithAcceleratorsAlike(
                                       *measured, copies,
                                       KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_EMULATED &&
                                           node.emulated_peer_link)
                                 : *measured;
  } else {
    *cost_source = AnalyticCostSource(node);
    TANDEM_ASSIGN_OR_RETURN(request.hardware, NodeHardware(resolved, node, *capacity));
  }
  // As a submission: the spec's pipeline with the factors an earlier run
  // of it measured here (not an auto_stages one, nor stages the request
  // overrides).
  const int stages = resolved.placement().pipeline().stages();
  if (stages > 1 && request.pipeline_devices == stages && context.pipeline_corrections) {
    if (std::optional<PipelineCorrections> c =
            context.pipeline_corrections(model, resolved, measured ? &*measured : nullptr)) {
      request.pipeline_compute_scale = std::move(c->compute_scale);
      request.pipeline_update_scale = std::move(c->update_scale);
      request.pipeline_stages = std::move(c->stages);
      absl::StrAppend(cost_source, "; ", c->note);
    }
  }
  request.accelerator_shares_host_cores = KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_EMULATED;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlanModelResponse> PlanModel(const tandem::v1::PlanModelRequest& rpc,
                                            const NodeOffer& node,
                                            const PlanModelContext& context) {
  auto spec_error = [](const absl::Status& s) {
    if (s.code() != absl::StatusCode::kInvalidArgument && s.code() != absl::StatusCode::kNotFound) {
      return s;
    }
    return absl::InvalidArgumentError(absl::StrCat("spec.", s.message()));
  };
  // Planning for another machine assumes it has an accelerator.
  const bool remote = rpc.cost_source_case() != tandem::v1::PlanModelRequest::COST_SOURCE_NOT_SET;
  absl::StatusOr<JobSpec> resolved =
      ResolveJobSpec(rpc.spec(), remote || !node.cuda_devices.empty());
  if (!resolved.ok()) return spec_error(resolved.status());
  TANDEM_ASSIGN_OR_RETURN(const PrecisionChoice precision, PlanPrecision(rpc, *resolved));
  // Here the model is built as a job would run it (its layers' bf16 workspace);
  // for another machine ProfileInPrecision re-counts the fp32 analytic profile.
  if (!remote) {
    resolved->set_precision(precision.precision);
    ResolveUnsetThreads(context.job_threads, *resolved);
  }
  absl::StatusOr<JobModel> jm = BuildJobModel(
      *resolved, context.resolve, remote ? DType::kF32 : ComputeDType(precision.precision));
  if (!jm.ok()) return spec_error(jm.status());
  const Model& model = *jm->model;
  // As PlanPipelineJob: a pipeline's stages keep fp32 weights and gradients
  // whatever their layers compute in.
  const bool pipeline = rpc.pipeline_devices() > 1 || resolved->placement().pipeline().stages() > 1;
  const tandem::v1::Profile analytic =
      pipeline ? profile::AnalyticProfile(model, resolved->optimizer(),
                                          resolved->training().batch_size(), DType::kF32)
               : profile::AnalyticProfile(model, resolved->optimizer(),
                                          resolved->training().batch_size());
  TANDEM_RETURN_IF_ERROR(CheckRequestProfile(rpc, model));
  TANDEM_ASSIGN_OR_RETURN(planner::PlanRequest request, planner::PlanRequestFromRpc(rpc, analytic));
  request.stop = context.stop;
  // As the job would run here: on --job_threads when the spec sets none.
  if (!remote && request.host_update_threads == 0) {
    request.host_update_threads = resolved->training().threads();
  }
  std::shared_ptr<void> hold;
  if (context.reserve) {
    const int batch = request.batch_size > 0 ? request.batch_size : analytic.batch_size();
    TANDEM_ASSIGN_OR_RETURN(
        hold, context.reserve(planner::PlanningMemoryBytes(analytic.layers_size(), batch)));
  }
  std::string cost_source = RequestCostSource(rpc);
  if (remote) {
    TANDEM_ASSIGN_OR_RETURN(request.profile,
                            planner::ProfileInPrecision(request.profile, precision.precision));
  }
  int64_t capacity = request.accelerator_memory_bytes;
  if (!remote) {
    TANDEM_RETURN_IF_ERROR(
        PlanForThisNode(model, *resolved, node, context, request, &capacity, &cost_source));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::optional<planner::ScaleOutRequest> scale_out,
                          ScaleOutRequestFor(rpc, *resolved, request, precision.precision));
  TANDEM_ASSIGN_OR_RETURN(PlanModelResponse response,
                          SolveForExecutor(model, std::move(request), capacity));
  if (scale_out) {
    TANDEM_ASSIGN_OR_RETURN(std::vector<tandem::v1::ScaleOutPlan> plans,
                            planner::PlanScaleOut(*scale_out));
    for (auto& p : plans) *response.add_scale_out() = std::move(p);
  }
  response.set_cost_source(std::move(cost_source));
  response.set_precision(precision.precision);
  response.set_precision_reason(precision.reason);
  return response;
}

namespace {

// Whether `stored` exists and still fits the job's accelerator capacity on
// `node`: its predicted peak (a pipeline's: its largest stage's), the
// executor's margin (a pipeline stage's, which its split was planned
// against) and (CUDA) the fixed cuBLAS workspace.
absl::StatusOr<bool> StoredPlanFits(const Model& model, const JobSpec& resolved,
                                    const NodeOffer& node, const std::optional<Plan>& stored) {
  if (!stored) return false;
  if (stored->layers_size() == 0 || KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_NONE) {
    return true;
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t capacity, AcceleratorCapacity(resolved, node));
  const int64_t micro_batch = stored->micro_batch_size() > 0 ? stored->micro_batch_size()
                                                             : resolved.training().batch_size();
  int64_t margin = ExecutorMemoryMargin(model, micro_batch);
  if (stored->pipeline_size() > 1) {
    const int K = stored->pipeline_size();
    const int M = stored->micro_batches() > 0
                      ? stored->micro_batches()
                      : static_cast<int>(resolved.training().batch_size() / micro_batch);
    margin = PipelineStageMargin(model, micro_batch,
                                 PipelineInputsInFlight(resolved.placement().pipeline(), K, M));
  }
  int64_t needed = stored->prediction().accelerator_peak_bytes() + margin;
  if (KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_CUDA) needed += kCudaFixedBytes;
  return needed <= capacity;
}

}  // namespace

absl::StatusOr<tandem::v1::Schedule> StepProgram(const Model& model, const JobSpec& resolved,
                                                 const Plan& plan) {
  // A pipeline's stages run the pipeline runner's own schedule: no step
  // program of the plan executor runs for it.
  if (plan.layers_size() == 0 || plan.pipeline_size() > 0) return tandem::v1::Schedule();
  TANDEM_ASSIGN_OR_RETURN(const schedule::Schedule program,
                          LowerStepProgram(model, plan, resolved.optimizer(), MaxBatch(resolved)));
  return schedule::ToProto(program);
}

namespace {

// A pipeline plan's runner: one accelerator per stage, each of the job's
// capacity.
absl::StatusOr<std::unique_ptr<StepRunner>> MakePipelineRunner(const Model& model,
                                                               const JobSpec& resolved,
                                                               const NodeOffer& node,
                                                               const Plan& plan,
                                                               int64_t max_batch) {
  TANDEM_ASSIGN_OR_RETURN(const int64_t capacity, AcceleratorCapacity(resolved, node));
  std::vector<std::unique_ptr<Accelerator>> devices;
  std::vector<PipelineStageSpec> stages;
  for (const tandem::v1::PipelineStage& st : plan.pipeline()) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Accelerator> device,
                            CreateAccelerator(resolved, node, capacity, st.device_index()));
    stages.push_back({.first_layer = st.first_layer(),
                      .end_layer = st.last_layer() + 1,
                      .device = device.get(),
                      .recompute = st.recompute(),
                      .offload_optimizer = st.offload_optimizer(),
                      .host_updated_layers = st.host_updated_layers(),
                      .stream_weights = st.stream_weights(),
                      .offload_activations = st.offload_activations(),
                      .wait_for_activation_copies = st.wait_for_activation_copies()});
    devices.push_back(std::move(device));
  }
  PipelineOptions options;
  switch (plan.pipeline_schedule()) {
    case tandem::v1::PIPELINE_SCHEDULE_GPIPE:
      options.schedule = PipelineSchedule::kGPipe;
      break;
    case tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM:
      options.schedule = PipelineSchedule::kPipeDream;
      break;
    default:
      options.schedule = PipelineSchedule::kOneFOneB;
  }
  options.micro_batches = plan.micro_batches() > 0
                              ? plan.micro_batches()
                              : resolved.placement().pipeline().micro_batches();
  options.max_batch = max_batch;
  options.init_seed = resolved.training().seed();
  options.vertical_sync = resolved.placement().pipeline().vertical_sync();
  options.continuous = resolved.placement().pipeline().continuous();
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<PipelineRunner> runner,
      PipelineRunner::Create(model, resolved.optimizer(), std::move(stages), options));
  runner->AdoptDevices(std::move(devices));
  runner->set_plan(plan);
  return std::unique_ptr<StepRunner>(std::move(runner));
}

}  // namespace

RunnerFactory MakeRunnerFactory(NodeOffer node, std::optional<Plan> stored_plan,
                                tandem::v1::Schedule stored_program) {
  return [node = std::move(node), stored_plan = std::move(stored_plan),
          stored_program = std::move(stored_program)](
             const Model& model, const JobSpec& resolved, int64_t max_batch,
             Allocator* host_allocator) -> absl::StatusOr<std::unique_ptr<StepRunner>> {
    const uint64_t seed = resolved.training().seed();
    Plan plan;
    if (stored_plan) {
      if (stored_plan->layers_size() != 0 && stored_plan->layers_size() != model.num_layers()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the job's stored plan has ", stored_plan->layers_size(),
                         " layers but its model has ", model.num_layers()));
      }
      plan = *stored_plan;
    }
    // A stored plan no longer fits when the node's budget shrank since the job
    // was admitted (tandemd restarted with another --accelerator_memory_budget): it is
    // solved again for the capacity the job has now.
    TANDEM_ASSIGN_OR_RETURN(const bool fits, StoredPlanFits(model, resolved, node, stored_plan));
    const bool replanned = !fits;
    if (replanned) {
      TANDEM_ASSIGN_OR_RETURN(plan, PlanJob(model, resolved, node));
    }
    if (plan.layers_size() == 0) {
      TANDEM_ASSIGN_OR_RETURN(
          std::unique_ptr<CpuRunner> cpu,
          CpuRunner::Create(model, resolved.optimizer(), max_batch, seed, host_allocator));
      return std::unique_ptr<StepRunner>(std::move(cpu));
    }
    if (plan.pipeline_size() > 1) {
      TANDEM_ASSIGN_OR_RETURN(const JobSpec staged, ChosenStages(resolved, plan));
      return MakePipelineRunner(model, staged, node, plan, max_batch);
    }
    std::unique_ptr<Accelerator> accelerator;
    if (KindOf(resolved) != tandem::v1::ACCELERATOR_KIND_NONE) {
      TANDEM_ASSIGN_OR_RETURN(const int64_t capacity, AcceleratorCapacity(resolved, node));
      TANDEM_ASSIGN_OR_RETURN(accelerator, CreateAccelerator(resolved, node, capacity));
    }
    ExecutorOptions options;
    options.plan = std::move(plan);
    options.optimizer = resolved.optimizer();
    options.max_batch = max_batch;
    options.init_seed = seed;
    options.host_allocator = host_allocator;
    options.accelerator = accelerator.get();
    if (stored_plan && !replanned) options.schedule = stored_program;
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<PlanExecutor> executor,
                            PlanExecutor::Create(model, std::move(options)));
    return std::unique_ptr<StepRunner>(
        std::make_unique<HybridRunner>(std::move(accelerator), std::move(executor)));
  };
}

int RanksSharingHost(const JobSpec& resolved, const NodeOffer& node) {
  const int ranks = resolved.distributed().replicas();
  if (ranks <= 1 || KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_NONE) return 1;
  return std::clamp(AcceleratorCount(resolved, node), 1, ranks);
}

void ResolveUnsetThreads(int job_threads, JobSpec& resolved) {
  if (resolved.training().threads() == 0 && job_threads > 0) {
    resolved.mutable_training()->set_threads(job_threads);
  }
}

int ThreadsPerRank(int job_threads, int node_cores, int ranks) {
  const int cores = job_threads > 0 ? job_threads : std::max(1, node_cores);
  return std::max(1, cores / std::max(1, ranks));
}

int64_t RankBatch(const JobSpec& resolved, int ranks) {
  return (resolved.training().batch_size() + ranks - 1) / ranks;
}

bool IsRankPlan(const Model& model, const JobSpec& resolved, const Plan& plan) {
  return plan.layers_size() == model.num_layers() && plan.pipeline_size() == 0 &&
         plan.batch_size() == RankBatch(resolved, std::max(1, resolved.distributed().replicas()));
}

namespace {

// What a rank of `resolved` (one of `ranks`) plans as, and on: its spec, for
// its share of the batch (RankBatch), streaming optimizer state in fp32
// only; and the node with its part of the
// cores, the ranks on it sharing its host (for host work and, emulated, the
// accelerator's compute).
std::pair<JobSpec, NodeOffer> RankSetting(const JobSpec& resolved, const NodeOffer& node,
                                          int ranks) {
  JobSpec rank_spec = resolved;
  rank_spec.mutable_training()->set_batch_size(RankBatch(resolved, ranks));
  // A rank streams optimizer state in fp32 only (PlanExecutor: a 16-bit
  // layer's gradient is not summed over the ranks as its own type yet).
  if (resolved.precision() != tandem::v1::PRECISION_FP32) {
    rank_spec.mutable_placement()->set_no_streamed_optimizer_state(true);
  }
  NodeOffer shared = node;
  const int sharing = RanksSharingHost(resolved, node);
  shared.host = OnThreads(node.host, std::max(1, node.host.threads() / sharing));
  return {std::move(rank_spec), std::move(shared)};
}

}  // namespace

absl::StatusOr<Plan> RankPlan(const Model& model, const JobSpec& resolved, const NodeOffer& node,
                              int ranks, const Plan* stored, const tandem::v1::Profile* measured) {
  if (KindOf(resolved) == tandem::v1::ACCELERATOR_KIND_NONE) {
    return absl::InvalidArgumentError(
        "placement.accelerator: a rank without an accelerator runs on the CPU engine");
  }
  auto [rank_spec, shared] = RankSetting(resolved, node, ranks);
  if (stored != nullptr && !resolved.placement().has_plan() &&
      resolved.distributed().replicas() == ranks && IsRankPlan(model, resolved, *stored)) {
    *rank_spec.mutable_placement()->mutable_plan() = *stored;  // validated as a forced plan
  }
  return PlanJob(model, rank_spec, shared, measured);
}

Plan TimedBy(Plan plan, const planner::SimulationResult& sim, const std::string& method) {
  *plan.mutable_prediction() = sim.prediction;
  *plan.mutable_timeline() = sim.timeline;
  for (int l = 0; l < plan.layers_size() && l < static_cast<int>(sim.layers.size()); ++l) {
    plan.mutable_layers(l)->set_reuse_distance_seconds(sim.layers[l].reuse_distance_seconds);
    plan.mutable_layers(l)->set_slack_seconds(sim.layers[l].slack_seconds);
  }
  plan.mutable_solver()->set_method(method);
  return plan;
}

absl::StatusOr<Plan> TimeAsRank(const Model& model, const JobSpec& resolved, const NodeOffer& node,
                                const Plan& plan, const planner::SimulationOptions& ranks,
                                const tandem::v1::Profile* measured) {
  if (ranks.ranks <= 1 || !ranks.collective_seconds) {
    return absl::InvalidArgumentError("a rank's timing needs ranks > 1 and their collectives");
  }
  const auto [rank_spec, shared] = RankSetting(resolved, node, ranks.ranks);
  TANDEM_ASSIGN_OR_RETURN(int64_t capacity, AcceleratorCapacity(rank_spec, shared));
  if (KindOf(rank_spec) == tandem::v1::ACCELERATOR_KIND_CUDA && capacity > kCudaFixedBytes) {
    capacity -= kCudaFixedBytes;
  }
  TANDEM_ASSIGN_OR_RETURN(const planner::PlanRequest request,
                          OneAcceleratorRequest(model, rank_spec, shared, measured, capacity));
  TANDEM_ASSIGN_OR_RETURN(const planner::CostModel cost, planner::CostModelOf(request));
  TANDEM_ASSIGN_OR_RETURN(const planner::SimulationResult sim,
                          planner::PlanSimulator(cost).Simulate(plan, ranks));
  return TimedBy(plan, sim,
                 absl::StrCat(plan.solver().method(), "; timed as one of ", ranks.ranks, " ranks"));
}

absl::StatusOr<RankExecutor> PrepareRankExecutor(const Model& model, const JobSpec& resolved,
                                                 const NodeOffer& node, int ranks,
                                                 Allocator* host_allocator, int accelerator_index) {
  RankExecutor r;
  TANDEM_ASSIGN_OR_RETURN(r.options.plan, RankPlan(model, resolved, node, ranks));
  TANDEM_ASSIGN_OR_RETURN(const int64_t capacity, AcceleratorCapacity(resolved, node));
  TANDEM_ASSIGN_OR_RETURN(r.accelerator,
                          CreateAccelerator(resolved, node, capacity, accelerator_index));
  r.options.optimizer = resolved.optimizer();
  r.options.max_batch = RankBatch(resolved, ranks);
  r.options.init_seed = resolved.training().seed();
  r.options.host_allocator = host_allocator;
  r.options.accelerator = r.accelerator.get();
  return r;
}

}  // namespace tandem::node
