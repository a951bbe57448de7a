// Training throughput of Tandem's CPU engine on the mlp, cnn and gpt presets, at
// the batch sizes of bench/cpu_training/torch_peer.py: forward, backward and Adam
// on fixed synthetic batches, after warm-up. Prints one JSON object per model and
// precision (--precisions: fp32, and bf16 for matrix products in bf16 with fp32
// accumulation and master state, Layer::compute_dtype).
// run.py runs this and the PyTorch peer in the same run and prints the ratios.
#include <omp.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/common/bench_models.h"
#include "runtime/core/clock.h"
#include "runtime/core/cpu_features.h"
#include "runtime/core/random.h"
#include "runtime/cpu/onednn.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/train/job_model.h"
#include "spec/precision.h"

ABSL_FLAG(std::string, models, "mlp,cnn,gpt", "Models to run.");
ABSL_FLAG(int, threads, 2, "OpenMP threads.");
ABSL_FLAG(std::string, precisions, "fp32", "Comma-separated: fp32, bf16.");
ABSL_FLAG(double, seconds, 8.0, "Timed seconds per model (after warm-up).");
ABSL_FLAG(bool, per_layer, false, "Also print each layer's forward and backward time.");

namespace tandem {
namespace {

using bench::BenchModel;

class Timings : public LayerTimingSink {
 public:
  explicit Timings(int layers) : forward(layers, 0), backward(layers, 0) {}
  void Record(int layer, Phase phase, double seconds) override {
    if (layer < 0) {
      update += seconds;
    } else if (phase == Phase::kForward) {
      forward[layer] += seconds;
    } else {
      backward[layer] += seconds;
    }
  }
  std::vector<double> forward, backward;
  double update = 0;
};

int RunOne(const BenchModel& bench, DType compute) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(bench.yaml, bench.name);
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(*spec, false);
  if (!resolved.ok()) {
    std::fprintf(stderr, "%s\n", resolved.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<JobModel> jm = BuildJobModel(*resolved, nullptr, compute);
  if (!jm.ok()) {
    std::fprintf(stderr, "%s\n", jm.status().ToString().c_str());
    return 1;
  }
  const int64_t B = resolved->training().batch_size();
  HostAllocator allocator;
  auto runner = CpuRunner::Create(*jm->model, resolved->optimizer(), B, 1, &allocator);
  if (!runner.ok()) return 1;
  absl::StatusOr<Datasets> data =
      OpenDatasets(resolved->data(), 1, nullptr, ModelContext(*resolved));
  BatchLoader loader(*data->train, B, false, 1, false);
  const Batch batch = loader.Next();
  StepOptions options;
  options.learning_rate = 1e-3f;
  for (int i = 0; i < 3; ++i) (void)(*runner)->TrainStep(batch, options);
  Timings timings(jm->model->num_layers());
  if (absl::GetFlag(FLAGS_per_layer)) (*runner)->set_timing_sink(&timings);
  int steps = 0;
  const double start = WallSeconds();
  double now = start;
  while (now - start < absl::GetFlag(FLAGS_seconds) || steps < 3) {
    options.step = steps;
    (void)(*runner)->TrainStep(batch, options);
    ++steps;
    now = WallSeconds();
  }
  const double step_seconds = (now - start) / steps;
  std::printf(
      "{\"model\": \"%s\", \"impl\": \"tandem\", \"precision\": \"%s\", \"batch\": %ld, "
      "\"steps\": %d, \"step_ms\": %.3f, \"samples_per_second\": %.1f, \"parameters\": %ld}\n",
      bench.name, compute == DType::kBF16 ? "bf16" : "fp32", static_cast<long>(B), steps,
      1e3 * step_seconds, B / step_seconds, static_cast<long>(jm->model->parameter_count()));
  if (absl::GetFlag(FLAGS_per_layer)) {
    for (int l = 0; l < jm->model->num_layers(); ++l) {
      std::fprintf(stderr, "  %-22s fwd %8.3f ms  bwd %8.3f ms\n",
                   jm->model->layer(l).name().c_str(), 1e3 * timings.forward[l] / steps,
                   1e3 * timings.backward[l] / steps);
    }
    std::fprintf(stderr, "  %-22s     %8.3f ms\n", "adam update", 1e3 * timings.update / steps);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  // What the figures were measured on: compare them only within one run.
  std::printf(
      "{\"machine\": {\"onednn\": \"%s\", \"onednn_isa\": \"%s\", \"tandem_isa\": \"%s\"}}\n",
      tandem::cpu::OneDnnVersion().c_str(), tandem::cpu::OneDnnIsa().c_str(),
      tandem::CpuIsaName(tandem::ActiveCpuIsa()));
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_models), ',')) {
    for (absl::string_view precision : absl::StrSplit(absl::GetFlag(FLAGS_precisions), ',')) {
      if (precision != "fp32" && precision != "bf16") {
        std::fprintf(stderr, "--precisions: unknown precision '%s' (fp32, bf16)\n",
                     std::string(precision).c_str());
        return 2;
      }
      const tandem::DType compute =
          precision == "bf16" ? tandem::DType::kBF16 : tandem::DType::kF32;
      if (compute == tandem::DType::kBF16 && !tandem::Bf16ProductsIsa(tandem::cpu::OneDnnIsa())) {
        // Said once per model, in the rows' format, for run.py to drop the row.
        std::printf(
            "{\"model\": \"%s\", \"impl\": \"tandem\", \"precision\": \"bf16\", "
            "\"unavailable\": \"oneDNN runs %s here, which has no bf16 products\"}\n",
            std::string(name).c_str(), tandem::cpu::OneDnnIsa().c_str());
        continue;
      }
      for (const auto& bench : tandem::bench::kBenchModels) {
        if (name == bench.name && tandem::RunOne(bench, compute) != 0) return 1;
      }
    }
  }
  return 0;
}
