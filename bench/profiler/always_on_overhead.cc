// The cost of the profiler's always-on mode: training steps of the mlp, cnn and
// gpt presets on the CPU engine with and without the LayerHistograms sink, in
// the same process, interleaved (ABBA within every round, so drift and other
// load hit both sides alike). Prints per model the median step time of each
// side and their ratio, the spread of the per-round paired overhead, and, as a
// cross-check that other load on the machine cannot swamp, the cost of the
// sink's work itself (two clock reads and a Record per layer phase, timed in a
// tight loop) times the calls a step makes. Target: <= 2% of step time. Never
// asserts a timing.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/common/bench_models.h"
#include "runtime/core/clock.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/profile/layer_histograms.h"
#include "runtime/profile/synthetic_inputs.h"
#include "runtime/profile/timing_stats.h"
#include "runtime/train/job_model.h"

ABSL_FLAG(std::string, models, "mlp,cnn,gpt", "Models to run.");
ABSL_FLAG(int, threads, 2, "OpenMP threads.");
ABSL_FLAG(int, rounds, 12, "Interleaved rounds; each takes two samples per side (ABBA).");
ABSL_FLAG(double, sample_seconds, 0.1, "Minimum seconds of steps per sample.");

namespace tandem {
namespace {

using profile::LayerHistograms;
using profile::Median;
using profile::Quantile;

using bench::BenchModel;

// Nanoseconds per layer phase of what the runner does when a sink is set: two
// clock reads around the phase and the Record call.
double SinkNanosecondsPerCall(LayerHistograms& sink, int layers) {
  constexpr int kCalls = 2'000'000;
  const double start = WallSeconds();
  for (int i = 0; i < kCalls; ++i) {
    const double t0 = WallSeconds();
    sink.Record(i % layers, static_cast<Phase>(i & 1), WallSeconds() - t0);
  }
  return (WallSeconds() - start) / kCalls * 1e9;
}

int RunOne(const BenchModel& bench) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(bench.yaml, bench.name);
  absl::StatusOr<tandem::v1::JobSpec> resolved =
      spec.ok() ? ResolveJobSpec(*spec, false) : spec.status();
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s\n", resolved.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<JobModel> job = BuildJobModel(*resolved);
  if (!job.ok()) {
    std::fprintf(stderr, "%s\n", job.status().ToString().c_str());
    return 1;
  }
  const Model& model = *job->model;
  const int64_t B = resolved->training().batch_size();
  HostAllocator allocator;
  auto runner = CpuRunner::Create(model, resolved->optimizer(), B, 1, &allocator);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }
  const Batch batch = profile::SyntheticBatch(model.data(), B, 1);
  std::vector<std::string> names;
  for (int l = 0; l < model.num_layers(); ++l) names.push_back(model.layer(l).name());
  LayerHistograms sink(names);

  StepOptions options;
  int64_t step = 0;
  // Mean step time of `steps` steps, with or without the sink.
  auto sample = [&](int steps, bool with_sink) {
    (*runner)->set_timing_sink(with_sink ? &sink : nullptr);
    const double start = WallSeconds();
    for (int i = 0; i < steps; ++i) {
      options.step = step++;
      (void)(*runner)->TrainStep(batch, options);
    }
    return (WallSeconds() - start) / steps;
  };
  // Warm-up, and steps per sample from the step time.
  sample(3, false);
  const double estimate = sample(3, false);
  const int steps =
      std::max(1, static_cast<int>(std::ceil(absl::GetFlag(FLAGS_sample_seconds) / estimate)));

  // ABBA per round: both sides see the same drift and the same neighbours.
  std::vector<double> without, with, paired;
  for (int r = 0; r < absl::GetFlag(FLAGS_rounds); ++r) {
    const double a1 = sample(steps, false);
    const double b1 = sample(steps, true);
    const double b2 = sample(steps, true);
    const double a2 = sample(steps, false);
    without.insert(without.end(), {a1, a2});
    with.insert(with.end(), {b1, b2});
    paired.push_back((b1 + b2) / (a1 + a2) - 1);
  }
  (*runner)->set_timing_sink(nullptr);

  const int calls_per_step = 2 * model.num_layers() + 1;
  LayerHistograms scratch(names);
  const double ns_per_call = SinkNanosecondsPerCall(scratch, model.num_layers());
  const double step_seconds = Median(without);
  const double sink_fraction = calls_per_step * ns_per_call * 1e-9 / step_seconds;
  uint64_t observations = 0;
  for (const auto& s : sink.Snapshot().series) observations += s.count;

  std::printf(
      "%-4s step %9.3f ms without the sink, %9.3f ms with it (medians of %d samples of %d "
      "steps each): overhead %+.2f%%; per-round paired overhead p10 %+.2f%%, median %+.2f%%, "
      "p90 %+.2f%%\n",
      bench.name, 1e3 * step_seconds, 1e3 * Median(with), static_cast<int>(without.size()), steps,
      100 * (Median(with) / step_seconds - 1), 100 * Quantile(paired, 0.1), 100 * Median(paired),
      100 * Quantile(paired, 0.9));
  std::printf(
      "     sink work: %.0f ns per layer phase x %d per step = %.2f us per step = %.4f%% of a "
      "step (%llu observations recorded)\n",
      ns_per_call, calls_per_step, calls_per_step * ns_per_call * 1e-3, 100 * sink_fraction,
      static_cast<unsigned long long>(observations));
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  std::printf("always-on per-layer timing: CPU engine, %d threads; target overhead <= 2%%\n",
              absl::GetFlag(FLAGS_threads));
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    for (const auto& bench : tandem::bench::kBenchModels) {
      if (name == bench.name && tandem::RunOne(bench) != 0) return 1;
    }
  }
  return 0;
}
