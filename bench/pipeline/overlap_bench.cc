// Pipeline stages that offload to the host, with their copies and updates
// overlapped with compute against waited for (docs/pipeline.md), the two
// runners' steps taken in turn in one run:
//  --offload=optimizer: every stage keeps its optimizer state on the host;
//    each layer's host update started during the step's last backward,
//    against the whole stage's update after it
//    (PipelineOptions::overlap_host_updates). Per stage, what its update left
//    after its last backward (from the runner's timeline) next to the
//    update's own work.
//  --offload=activations: every stage sends its activations to the host
//    between forward and backward, copied on the stage's copy thread beside
//    its compute, against waiting for each copy
//    (PipelineStageSpec::wait_for_activation_copies). Per stage, its thread's
//    time in copies and its peak memory.
// Prints the CPU and oneDNN ISA, the median step of each and their ratio;
// checks that both trained alike (losses equal to the bit). Emulated
// accelerators: host cores, not GPU figures.
//
//   bazel-bin/bench/pipeline/overlap_bench --stages=2 --link_gbps=0.5
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/common/bench_models.h"
#include "runtime/core/clock.h"
#include "runtime/cpu/onednn.h"
#include "runtime/data/loader.h"
#include "runtime/emulated/emulated_accelerator.h"
#include "runtime/exec/pipeline_runner.h"
#include "runtime/train/job_model.h"
#include "spec/job_spec.h"

ABSL_FLAG(int, stages, 2, "pipeline stages (emulated accelerators), each offloading its state");
ABSL_FLAG(int, micro_batches, 4, "micro-batches per step");
ABSL_FLAG(std::string, schedule, "1f1b", "1f1b or gpipe");
ABSL_FLAG(int, steps, 20, "measured steps of each runner (after 3 of warm-up)");
ABSL_FLAG(int, threads, 2, "the job's OpenMP threads, shared among the stages");
ABSL_FLAG(double, link_gbps, 0, "each accelerator's host link in GB/s (0: memcpy speed)");
ABSL_FLAG(std::string, offload, "optimizer", "what the stages offload: optimizer or activations");

namespace tandem {
namespace {

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One pipeline runner of the job over its own emulated accelerators.
struct Pipeline {
  std::vector<std::unique_ptr<EmulatedAccelerator>> devices;
  std::unique_ptr<PipelineRunner> runner;
  std::vector<double> steps, losses;
  // Per stage, per step: the update's work, what of it came after the
  // stage's last backward, and the stage's thread's time in copies.
  std::vector<std::vector<double>> work, tail, copies;
};

absl::StatusOr<Pipeline> MakePipeline(const Model& model, const tandem::v1::JobSpec& spec,
                                      bool overlap) {
  const int K = absl::GetFlag(FLAGS_stages), L = model.num_layers();
  Pipeline p;
  std::vector<PipelineStageSpec> stages;
  for (int s = 0; s < K; ++s) {
    p.devices.push_back(std::make_unique<EmulatedAccelerator>(
        EmulatedOptions{.capacity_bytes = int64_t{1} << 30,
                        .link_bytes_per_second = absl::GetFlag(FLAGS_link_gbps) * 1e9,
                        .peer_link = true,
                        .peer_bytes_per_second = absl::GetFlag(FLAGS_link_gbps) * 1e9},
        s));
    const bool activations = absl::GetFlag(FLAGS_offload) == "activations";
    stages.push_back({.first_layer = s * L / K,
                      .end_layer = (s + 1) * L / K,
                      .device = p.devices.back().get(),
                      .offload_optimizer = !activations,
                      .offload_activations = activations,
                      .wait_for_activation_copies = activations && !overlap});
  }
  PipelineOptions options{.schedule = absl::GetFlag(FLAGS_schedule) == "gpipe"
                                          ? PipelineSchedule::kGPipe
                                          : PipelineSchedule::kOneFOneB,
                          .micro_batches = absl::GetFlag(FLAGS_micro_batches),
                          .max_batch = spec.training().batch_size(),
                          .init_seed = spec.training().seed(),
                          .overlap_host_updates = overlap};
  absl::StatusOr<std::unique_ptr<PipelineRunner>> runner =
      PipelineRunner::Create(model, spec.optimizer(), std::move(stages), options);
  if (!runner.ok()) return runner.status();
  p.runner = *std::move(runner);
  p.work.resize(K);
  p.tail.resize(K);
  p.copies.resize(K);
  return p;
}

absl::Status Step(Pipeline& p, const Batch& batch, const StepOptions& options, bool measured) {
  const double t = WallSeconds();
  absl::StatusOr<StepResult> r = p.runner->TrainStep(batch, options);
  if (!r.ok()) return r.status();
  const double seconds = WallSeconds() - t;
  p.losses.push_back(r->loss);
  if (!measured) return absl::OkStatus();
  p.steps.push_back(seconds);
  const tandem::v1::Timeline timeline = p.runner->last_timeline();
  const int K = p.runner->num_stages();
  std::vector<double> backward_end(K, 0), update_end(K, 0);
  for (const tandem::v1::TimelineSpan& span : timeline.spans()) {
    const int s = span.lane();
    if (span.phase() == tandem::v1::TIMELINE_PHASE_BACKWARD) {
      backward_end[s] = std::max(backward_end[s], span.end_seconds());
    } else if (span.phase() == tandem::v1::TIMELINE_PHASE_PARAMETER_H2D) {
      update_end[s] = std::max(update_end[s], span.end_seconds());
    }
  }
  for (int s = 0; s < K; ++s) {
    p.work[s].push_back(p.runner->stage_stats()[s].update_seconds);
    p.tail[s].push_back(std::max(0.0, update_end[s] - backward_end[s]));
    p.copies[s].push_back(p.runner->stage_stats()[s].copy_seconds);
  }
  return absl::OkStatus();
}

// Both runs' figures; 0 when they trained alike (1 else).
int Report(const Model& model, int64_t B, const Pipeline (&pipelines)[2], int warmup, int steps) {
  const int K = absl::GetFlag(FLAGS_stages);
  std::printf(
      "machine: %s; oneDNN %s, isa %s; %d threads; emulated accelerators (host cores, NOT GPU "
      "figures), links %s\n",
      CpuModel().c_str(), cpu::OneDnnVersion().c_str(), cpu::OneDnnIsa().c_str(),
      absl::GetFlag(FLAGS_threads),
      absl::GetFlag(FLAGS_link_gbps) > 0
          ? (std::to_string(absl::GetFlag(FLAGS_link_gbps)) + " GB/s").c_str()
          : "at memcpy speed");
  const bool activations = absl::GetFlag(FLAGS_offload) == "activations";
  std::printf(
      "gpt (%ld parameters, batch %ld), %s over %d stages, %d micro-batches, every stage "
      "offloading its %s to the host; median of %d steps each\n",
      static_cast<long>(model.parameter_count()), static_cast<long>(B),
      absl::GetFlag(FLAGS_schedule).c_str(), K, absl::GetFlag(FLAGS_micro_batches),
      activations ? "activations" : "Adam state", steps);
  const char* names[2][2] = {{"host update after the last backward", "host update overlapping it"},
                             {"activation copies waited for", "activation copies beside compute"}};
  const int L = model.num_layers();
  for (const bool overlap : {false, true}) {
    const Pipeline& p = pipelines[overlap];
    std::printf("  %-36s step %8.2f ms\n", names[activations][overlap], 1e3 * Median(p.steps));
    for (int s = 0; s < K; ++s) {
      std::printf("      stage %d (layers %d-%d): ", s, s * L / K, (s + 1) * L / K - 1);
      if (activations) {
        std::printf("%7.2f ms of its thread in copies, peak %.2f MiB\n", 1e3 * Median(p.copies[s]),
                    p.runner->stage_stats()[s].peak_bytes / 1048576.0);
      } else {
        std::printf("update %7.2f ms of work, %7.2f ms of it after its last backward\n",
                    1e3 * Median(p.work[s]), 1e3 * Median(p.tail[s]));
      }
    }
  }
  std::printf("overlapped / waited for: %.3f of the step\n",
              Median(pipelines[1].steps) / Median(pipelines[0].steps));
  const bool same = pipelines[0].losses == pipelines[1].losses;
  std::printf("losses equal to the bit over %d steps: %s (last %.6f)\n", warmup + steps,
              same ? "yes" : "NO", pipelines[1].losses.back());
  return same ? 0 : 1;
}

int Run() {
  const bench::BenchModel& gpt = bench::kBenchModels[2];
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(gpt.yaml, gpt.name);
  if (spec.ok()) spec = ResolveJobSpec(*spec, false);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 1;
  }
  // Adam without clipping: clipping waits for every stage's norm, and the
  // overlap is off then.
  spec->mutable_optimizer()->set_max_grad_norm(0);
  absl::StatusOr<JobModel> jm = BuildJobModel(*spec, nullptr, DType::kF32);
  absl::StatusOr<Datasets> data = OpenDatasets(spec->data(), 1, nullptr, ModelContext(*spec));
  if (!jm.ok() || !data.ok()) {
    std::fprintf(stderr, "%s\n", (!jm.ok() ? jm.status() : data.status()).ToString().c_str());
    return 1;
  }
  const int64_t B = spec->training().batch_size();
  Pipeline pipelines[2];
  for (const bool overlap : {false, true}) {
    absl::StatusOr<Pipeline> p = MakePipeline(*jm->model, *spec, overlap);
    if (!p.ok()) {
      std::fprintf(stderr, "%s\n", p.status().ToString().c_str());
      return 1;
    }
    pipelines[overlap] = *std::move(p);
  }
  BatchLoader loader(*data->train, B, /*shuffle=*/true, spec->training().seed(), false);
  const int warmup = 3, steps = absl::GetFlag(FLAGS_steps);
  for (int i = 0; i < warmup + steps; ++i) {
    const Batch batch = loader.Next();
    StepOptions options;
    options.step = i;
    options.learning_rate = 1e-3f;
    // In turn, so that both see the same state of the machine.
    for (Pipeline& p : pipelines) {
      if (absl::Status s = Step(p, batch, options, i >= warmup); !s.ok()) {
        std::fprintf(stderr, "step %d: %s\n", i, s.ToString().c_str());
        return 1;
      }
    }
  }
  return Report(*jm->model, B, pipelines, warmup, steps);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  return tandem::Run();
}
