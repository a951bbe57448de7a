// Planner benchmarks: how long SolvePlan takes on chains of 10 to 10,000
// layers (simulation included), and what the planner predicts for GPT-style
// models on the shipped H100 SXM node when the accelerator holds 25%, 50% or
// 100% of the model state: reuse_distance against zero_offload, measured in
// the same run. Prints results; asserts nothing about time.
//
//   bazel run -c opt //bench/planner:planner_bench [-- HARDWARE_SPEC]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/units.h"
#include "planner/cost_model.h"
#include "planner/plan_report.h"
#include "planner/planner.h"
#include "planner/precision.h"
#include "planner/scale_out.h"
#include "planner/spec_files.h"
#include "planner/strategies.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

// PLANNER_BENCH_CLIP set: every job clips its gradients to a global norm (as
// GPT training usually does), so every update waits for the norm.
bool ClipsGradients() {
  static const bool clip = std::getenv("PLANNER_BENCH_CLIP") != nullptr;
  return clip;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

const tandem::v1::Plan* Find(const tandem::v1::PlanModelResponse& r, tandem::v1::Strategy s) {
  for (const tandem::v1::Plan& p : r.alternatives()) {
    if (p.strategy() == s) return &p;
  }
  return nullptr;
}

double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Wall and CPU time of one SolvePlan: on a shared machine the CPU time is the
// steadier of the two.
struct Timed {
  double wall_seconds = 0;
  double cpu_seconds = 0;
};

Timed Solve(const PlanRequest& request, tandem::v1::PlanModelResponse* response) {
  const double cpu_start = ThreadCpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<tandem::v1::PlanModelResponse> r = SolvePlan(request);
  Timed timed;
  timed.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  timed.cpu_seconds = ThreadCpuSeconds() - cpu_start;
  if (!r.ok()) {
    std::fprintf(stderr, "SolvePlan: %s\n", std::string(r.status().message()).c_str());
    std::exit(1);
  }
  *response = *std::move(r);
  return timed;
}

double WallSeconds(const PlanRequest& request, tandem::v1::PlanModelResponse* response) {
  return Solve(request, response).wall_seconds;
}

// "proven" when the reuse_distance placement is proven optimal (its note).
std::string Placement(const tandem::v1::Plan& plan) {
  if (plan.solver().note().find("placement proven optimal") != std::string::npos) return "proven";
  if (plan.solver().note().find("exact search stopped") != std::string::npos) return "local";
  return "-";
}

int64_t ModelState(const tandem::v1::Profile& p) {
  int64_t total = 0;
  for (const auto& l : p.layers()) {
    total += l.analytic_memory().parameter_bytes() + l.analytic_memory().gradient_bytes() +
             l.analytic_memory().optimizer_state_bytes();
  }
  return total;
}

void SolveTimes(const tandem::v1::HardwareSpec& spec) {
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf(
      "== Solve time, uniform chains of linear 1024x1024 layers + loss, batch 64, %s,\n"
      "   accelerator budget = 50%% of model state. Wall time of SolvePlan (cost model,\n"
      "   every simulation, protos), median of N runs; the solving thread's CPU time in\n"
      "   brackets. This machine: %u hardware threads, load average %.2f %.2f %.2f.\n\n",
      spec.name().c_str(), std::thread::hardware_concurrency(), load[0], load[1], load[2]);
  std::printf("%7s %4s  %22s  %9s  %16s  %-70s\n", "layers", "N", "reuse_distance (cpu)",
              "placement", "all 5 (cpu)", "per strategy, inside the all-5 solve");
  for (int layers : {10, 100, 1000, 10000}) {
    PlanRequest request;
    request.clips_gradients = ClipsGradients();
    request.profile = testing::UniformChainProfile(layers, 1024, 64);
    request.hardware = spec;
    request.accelerator_memory_bytes = ModelState(request.profile) / 2;
    const int runs = layers >= 10000 ? 3 : layers >= 1000 ? 11 : 31;
    std::vector<double> reuse_wall, reuse_cpu, all_wall, all_cpu;
    tandem::v1::PlanModelResponse response;
    PlanRequest reuse_request = request;
    reuse_request.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
    reuse_request.compare = {tandem::v1::STRATEGY_REUSE_DISTANCE};
    for (int i = 0; i < runs; ++i) {
      const Timed t = Solve(reuse_request, &response);
      reuse_wall.push_back(t.wall_seconds);
      reuse_cpu.push_back(t.cpu_seconds);
    }
    const std::string placement = Placement(response.plan());
    for (int i = 0; i < runs; ++i) {
      const Timed t = Solve(request, &response);
      all_wall.push_back(t.wall_seconds);
      all_cpu.push_back(t.cpu_seconds);
    }
    std::string per;
    for (const tandem::v1::Plan& p : response.alternatives()) {
      per += StrategyName(p.strategy()) + " " + FormatSeconds(p.solver().solve_seconds()) + " (" +
             std::to_string(p.solver().plans_evaluated()) + ")  ";
    }
    const std::string reuse =
        FormatSeconds(Median(reuse_wall)) + " (" + FormatSeconds(Median(reuse_cpu)) + ")";
    const std::string all =
        FormatSeconds(Median(all_wall)) + " (" + FormatSeconds(Median(all_cpu)) + ")";
    std::printf("%7d %4d  %22s  %9s  %16s  %s\n", layers, runs, reuse.c_str(), placement.c_str(),
                all.c_str(), per.c_str());
  }
  std::printf(
      "\n  (n) = candidate plans evaluated (simulations or fast evaluations). reuse_distance\n"
      "  includes the gpu_only and zero_offload solves it builds on. placement: proven =\n"
      "  the exact search finished (no faster placement of updates under the plan's memory\n"
      "  settings); local = it stopped at its limit and the local search decided; - = the\n"
      "  plan streams weights or offloads activations, which only the local search handles.\n\n");
}

// One chain length, `runs` times: for profilers.
void SolveOne(const tandem::v1::HardwareSpec& spec, int layers, int runs, bool all) {
  PlanRequest request;
  request.clips_gradients = ClipsGradients();
  request.profile = testing::UniformChainProfile(layers, 1024, 64);
  request.hardware = spec;
  request.accelerator_memory_bytes = ModelState(request.profile) / 2;
  if (!all) {
    request.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
    request.compare = {tandem::v1::STRATEGY_REUSE_DISTANCE};
  }
  std::vector<double> times(runs);
  tandem::v1::PlanModelResponse response;
  for (double& t : times) t = WallSeconds(request, &response);
  std::string per;
  for (const tandem::v1::Plan& p : response.alternatives()) {
    per += StrategyName(p.strategy()) + " " + FormatSeconds(p.solver().solve_seconds()) + " (" +
           std::to_string(p.solver().plans_evaluated()) + ")  ";
  }
  std::printf("%d layers, %s: median %s, min %s of %d; %s\n", layers,
              all ? "all 5" : "reuse_distance", FormatSeconds(Median(times)).c_str(),
              FormatSeconds(*std::min_element(times.begin(), times.end())).c_str(), runs,
              per.c_str());
  if (std::getenv("PLANNER_BENCH_NOTES") != nullptr) {
    for (const tandem::v1::Plan& p : response.alternatives()) {
      std::printf("  %s: %s\n", StrategyName(p.strategy()).c_str(), p.solver().note().c_str());
    }
  }
}

struct Gpt {
  const char* name;
  testing::GptShape shape;
};

// GptProfile (fp32) re-counted in `precision`.
tandem::v1::Profile GptIn(const testing::GptShape& shape, tandem::v1::Precision precision) {
  absl::StatusOr<tandem::v1::Profile> p = ProfileInPrecision(testing::GptProfile(shape), precision);
  if (!p.ok()) {
    std::fprintf(stderr, "%s\n", std::string(p.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(p);
}

// One model's zero_offload and reuse_distance at 25/50/100% of model state.
void GptRow(const Gpt& m, const tandem::v1::HardwareSpec& spec, tandem::v1::Precision precision) {
  const tandem::v1::Profile profile = GptIn(m.shape, precision);
  const int64_t state = ModelState(profile);
  absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(profile, spec);
  if (!cost.ok()) std::exit(1);
  // Why: one batch's accelerator backward vs the host's Adam over every
  // layer vs the gradient and weight copies, all layers.
  double fwd = 0, bwd = 0, host_update = 0, copies = 0;
  for (int l = 0; l < cost->num_layers(); ++l) {
    fwd += cost->ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m.shape.batch_size);
    bwd += cost->BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m.shape.batch_size);
    host_update += cost->UpdateSeconds(l, tandem::v1::PLACEMENT_HOST, cost->host_threads());
    copies += cost->CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, cost->GradientBytes(l));
  }
  std::printf(
      "%s, batch %d: model state %s; per step: accelerator fwd %s + bwd %s, host Adam\n"
      "  over all layers %s, gradient D2H (= weight H2D) %s\n",
      m.name, m.shape.batch_size, FormatBytes(state).c_str(), FormatSeconds(fwd).c_str(),
      FormatSeconds(bwd).c_str(), FormatSeconds(host_update).c_str(),
      FormatSeconds(copies).c_str());
  std::printf("  %6s %10s  %13s %13s %8s  %s\n", "budget", "GiB", "zero_offload", "reuse_dist",
              "speedup", "reuse_distance plan");
  for (double share : {0.25, 0.5, 1.0}) {
    PlanRequest request;
    request.clips_gradients = ClipsGradients();
    request.profile = profile;
    request.hardware = spec;
    request.accelerator_memory_bytes =
        std::min<int64_t>(static_cast<int64_t>(share * state), cost->accelerator_memory_bytes());
    request.compare = {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                       tandem::v1::STRATEGY_REUSE_DISTANCE};
    // CoTrain's two update places; the streamed-state table has the third.
    request.stream_optimizer_state = false;
    tandem::v1::PlanModelResponse response;
    WallSeconds(request, &response);
    const tandem::v1::Plan* zero = Find(response, tandem::v1::STRATEGY_ZERO_OFFLOAD);
    const tandem::v1::Plan* reuse = Find(response, tandem::v1::STRATEGY_REUSE_DISTANCE);
    const tandem::v1::Plan* gpu = Find(response, tandem::v1::STRATEGY_GPU_ONLY);
    if (!zero->feasible()) {
      std::printf("  %5.0f%% %10.2f  infeasible: %s\n", share * 100,
                  request.accelerator_memory_bytes / 1073741824.0, zero->solver().note().c_str());
      continue;
    }
    std::printf("  %5.0f%% %10.2f  %13s %13s %7.3fx  %s%s\n", share * 100,
                request.accelerator_memory_bytes / 1073741824.0,
                FormatSeconds(zero->prediction().iteration_seconds()).c_str(),
                FormatSeconds(reuse->prediction().iteration_seconds()).c_str(),
                zero->prediction().iteration_seconds() / reuse->prediction().iteration_seconds(),
                reuse->solver().note().c_str(), gpu->feasible() ? " [gpu_only fits]" : "");
    std::printf("  %18s zero_offload: stall %s, accelerator idle %s, host pool idle %s; %s\n", "",
                FormatSeconds(zero->prediction().accelerator_stall_seconds()).c_str(),
                FormatSeconds(zero->prediction().accelerator_idle_seconds()).c_str(),
                FormatSeconds(zero->prediction().host_update_idle_seconds()).c_str(),
                zero->solver().note().c_str());
  }
  std::printf("\n");
}

void GptSpeedups(const tandem::v1::HardwareSpec& spec, tandem::v1::Precision precision) {
  const Gpt models[] = {
      {"GPT-2 XL 1.6B (48 x 1600, untied head)", {8, 1024, 1600, 48, 25, 50257}},
      {"GPT-2 XL 1.6B", {2, 1024, 1600, 48, 25, 50257}},
      {"GPT-2 XL 1.6B", {32, 1024, 1600, 48, 25, 50257}},
      {"GPT 2.7B (32 x 2560, untied head)", {8, 1024, 2560, 32, 32, 50257}},
      {"GPT 6.7B (32 x 4096, untied head)", {8, 1024, 4096, 32, 32, 50257}},
  };
  std::printf(
      "== GPT-style models on %s: %s, Adam, context 1024. Budget = share of\n"
      "   model state (%s = 16 bytes/param), capped at the GPU. reuse_distance with\n"
      "   two update places (host, accelerator with resident state), as CoTrain.\n\n",
      spec.name().c_str(), IsMixed(precision) ? "bf16 mixed precision" : "fp32",
      IsMixed(precision) ? "bf16 weights + bf16 grads + fp32 master and Adam state"
                         : "params + grads + Adam state");
  for (const Gpt& m : models) GptRow(m, spec, precision);
}

// "h12 r3 s33: host 0-11, resident 12-14, streamed 15-47" style: how many
// layers with parameters update in each place, and which.
std::string PlacesOf(const tandem::v1::Plan& plan, const CostModel& cost) {
  std::string lists[3];
  int counts[3] = {0, 0, 0};
  for (int l = 0; l < plan.layers_size() && l < cost.num_layers(); ++l) {
    if (cost.ParameterBytes(l) <= 0) continue;
    const tandem::v1::LayerPlan& lp = plan.layers(l);
    const int place = lp.update() == tandem::v1::PLACEMENT_HOST ? 0
                      : lp.stream_optimizer_state()             ? 2
                                                                : 1;
    ++counts[place];
    lists[place] += (lists[place].empty() ? "" : ",") + std::to_string(l);
  }
  static const char* kNames[] = {"host", "resident", "streamed"};
  std::string out;
  for (int p = 0; p < 3; ++p) {
    if (counts[p] == 0) continue;
    if (lists[p].size() > 48) lists[p] = lists[p].substr(0, 45) + "...";
    out += std::string(out.empty() ? "" : "; ") + kNames[p] + " " + std::to_string(counts[p]) +
           " [" + lists[p] + "]";
  }
  return out;
}

// Streamed optimizer state (docs/planning.md): zero_offload, reuse_distance
// with two update places and with three, at 10/25/50% of model state, in
// `precision`, each solved in the same run; the host's update pool with all
// its threads, or (`gpus_sharing_host` > 1) with its share when that many
// accelerators of the node train at once, each with its own link.
void StreamedState(const tandem::v1::HardwareSpec& spec, tandem::v1::Precision precision,
                   int gpus_sharing_host) {
  const Gpt models[] = {
      {"GPT-2 XL 1.6B (48 x 1600, untied head)", {8, 1024, 1600, 48, 25, 50257}},
      {"GPT 2.7B (32 x 2560, untied head)", {8, 1024, 2560, 32, 32, 50257}},
      {"GPT 6.7B (32 x 4096, untied head)", {8, 1024, 4096, 32, 32, 50257}},
  };
  const int threads = std::max(1, spec.host().threads() / std::max(1, gpus_sharing_host));
  std::printf(
      "== Streamed optimizer state on %s: %s, Adam, batch 8, context 1024; host update\n"
      "   pool of %d threads (%s).\n"
      "   zero_offload; reuse_distance with two update places (host, accelerator with\n"
      "   resident state); with three (+ accelerator with state streamed in for the update).\n\n",
      spec.name().c_str(), IsMixed(precision) ? "bf16 mixed precision" : "fp32", threads,
      gpus_sharing_host > 1
          ? absl::StrCat("its share when ", gpus_sharing_host, " accelerators train at once")
                .c_str()
          : "all of the host's");
  for (const Gpt& m : models) {
    const tandem::v1::Profile profile = GptIn(m.shape, precision);
    const int64_t state = ModelState(profile);
    absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(profile, spec);
    if (!cost.ok()) std::exit(1);
    std::printf("%s: model state %s\n", m.name, FormatBytes(state).c_str());
    std::printf("  %6s %8s  %12s %12s %12s  %8s %8s  %s\n", "budget", "GiB", "zero_offload",
                "reuse(2)", "reuse(3)", "2/zero", "3/zero", "three-place plan (solve)");
    for (double share : {0.10, 0.25, 0.5}) {
      PlanRequest request;
      request.clips_gradients = ClipsGradients();
      request.profile = profile;
      request.hardware = spec;
      request.accelerator_memory_bytes =
          std::min<int64_t>(static_cast<int64_t>(share * state), cost->accelerator_memory_bytes());
      request.host_update_threads = threads;
      request.compare = {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                         tandem::v1::STRATEGY_REUSE_DISTANCE};
      tandem::v1::PlanModelResponse two, three;
      request.stream_optimizer_state = false;
      WallSeconds(request, &two);
      request.stream_optimizer_state = true;
      WallSeconds(request, &three);
      const tandem::v1::Plan* zero = Find(three, tandem::v1::STRATEGY_ZERO_OFFLOAD);
      const tandem::v1::Plan* r2 = Find(two, tandem::v1::STRATEGY_REUSE_DISTANCE);
      const tandem::v1::Plan* r3 = Find(three, tandem::v1::STRATEGY_REUSE_DISTANCE);
      if (!zero->feasible()) {
        std::printf("  %5.0f%% %8.2f  infeasible: %s\n", share * 100,
                    request.accelerator_memory_bytes / 1073741824.0, zero->solver().note().c_str());
        continue;
      }
      const double z = zero->prediction().iteration_seconds();
      const double t2 = r2->prediction().iteration_seconds();
      const double t3 = r3->prediction().iteration_seconds();
      std::printf("  %5.0f%% %8.2f  %12s %12s %12s  %7.2fx %7.2fx  %s (%s)\n", share * 100,
                  request.accelerator_memory_bytes / 1073741824.0, FormatSeconds(z).c_str(),
                  FormatSeconds(t2).c_str(), FormatSeconds(t3).c_str(), z / t2, z / t3,
                  PlacesOf(*r3, *cost).c_str(),
                  FormatSeconds(r3->solver().solve_seconds()).c_str());
      std::printf(
          "  %17s three places: accelerator idle %s, H2D idle %s, D2H idle %s, host pool "
          "idle %s, peak %s; %s\n",
          "", FormatSeconds(r3->prediction().accelerator_idle_seconds()).c_str(),
          FormatSeconds(r3->prediction().h2d_idle_seconds()).c_str(),
          FormatSeconds(r3->prediction().d2h_idle_seconds()).c_str(),
          FormatSeconds(r3->prediction().host_update_idle_seconds()).c_str(),
          FormatBytes(r3->prediction().accelerator_peak_bytes()).c_str(),
          r3->solver().note().c_str());
    }
    std::printf("\n");
  }
}

// The feasible alternative with the shortest predicted step; null if none.
const tandem::v1::Plan* FastestFeasible(const tandem::v1::PlanModelResponse& response) {
  const tandem::v1::Plan* best = nullptr;
  for (const tandem::v1::Plan& p : response.alternatives()) {
    if (p.feasible() && (best == nullptr || p.prediction().iteration_seconds() <
                                                best->prediction().iteration_seconds())) {
      best = &p;
    }
  }
  return best;
}

// The largest of a ladder of GPT shapes that one accelerator of `spec` trains
// with the node's host memory: every shape's best feasible plan at the
// accelerator's whole capacity, and why the next one does not fit.
void LargestGpt(const tandem::v1::HardwareSpec& spec, tandem::v1::Precision precision) {
  const Gpt ladder[] = {
      {"GPT 6.7B (32 x 4096)", {8, 1024, 4096, 32, 32, 50257}},
      {"GPT 13B (40 x 5120)", {8, 1024, 5120, 40, 40, 50257}},
      {"GPT 30B (48 x 7168)", {8, 1024, 7168, 48, 56, 50257}},
      {"GPT 66B (64 x 9216)", {8, 1024, 9216, 64, 72, 50257}},
      {"GPT 101B (80 x 10240)", {8, 1024, 10240, 80, 80, 50257}},
      {"GPT 121B (96 x 10240)", {8, 1024, 10240, 96, 80, 50257}},
      {"GPT 146B (96 x 11264)", {8, 1024, 11264, 96, 88, 50257}},
      {"GPT 175B (96 x 12288)", {8, 1024, 12288, 96, 96, 50257}},
      {"GPT 350B (128 x 15360)", {8, 1024, 15360, 128, 120, 50257}},
      {"GPT 530B (105 x 20480)", {8, 1024, 20480, 105, 128, 50257}},
  };
  std::printf(
      "== The largest GPT one accelerator of %s trains with its host's %s, %s, batch 8,\n"
      "   context 1024: the best of zero_offload and reuse_distance at the accelerator's\n"
      "   whole capacity.\n\n",
      spec.name().c_str(), FormatBytes(spec.host().memory_bytes()).c_str(),
      IsMixed(precision) ? "bf16 mixed precision" : "fp32");
  std::printf("  %-26s %11s  %-10s %13s %9s  %s\n", "model", "state", "feasible", "step", "TFLOP/s",
              "plan");
  for (const Gpt& m : ladder) {
    PlanRequest request;
    request.clips_gradients = ClipsGradients();
    request.profile = GptIn(m.shape, precision);
    request.hardware = spec;
    request.compare = {tandem::v1::STRATEGY_ZERO_OFFLOAD, tandem::v1::STRATEGY_REUSE_DISTANCE};
    tandem::v1::PlanModelResponse response;
    WallSeconds(request, &response);
    const tandem::v1::Plan* best = FastestFeasible(response);
    double flops = 0;
    for (const auto& l : request.profile.layers()) flops += l.forward_flops() + l.backward_flops();
    if (best == nullptr) {
      std::printf("  %-26s %11s  %-10s  %s\n", m.name,
                  FormatBytes(ModelState(request.profile)).c_str(), "no",
                  Find(response, tandem::v1::STRATEGY_REUSE_DISTANCE)->solver().note().c_str());
      continue;
    }
    std::printf("  %-26s %11s  %-10s %13s %9.1f  %s: %s\n", m.name,
                FormatBytes(ModelState(request.profile)).c_str(), "yes",
                FormatSeconds(best->prediction().iteration_seconds()).c_str(),
                flops / best->prediction().iteration_seconds() / 1e12,
                StrategyName(best->strategy()).c_str(), best->solver().note().c_str());
  }
  std::printf("\n");
}

// Layers [first, last] of `profile`, as a profile of their own.
tandem::v1::Profile SubChain(const tandem::v1::Profile& profile, int first, int last) {
  tandem::v1::Profile sub = profile;
  sub.clear_layers();
  for (int l = first; l <= last; ++l) {
    tandem::v1::LayerProfile* layer = sub.add_layers();
    *layer = profile.layers(l);
    layer->set_index(l - first);
  }
  return sub;
}

// K contiguous stages of about equal compute (forward and backward FLOPs):
// each stage's first layer.
std::vector<int> BalancedStages(const tandem::v1::Profile& profile, int k) {
  double total = 0;
  for (const auto& l : profile.layers()) total += l.forward_flops() + l.backward_flops();
  std::vector<int> firsts = {0};
  double done = 0;
  for (int l = 0; l < profile.layers_size() && static_cast<int>(firsts.size()) < k; ++l) {
    done += profile.layers(l).forward_flops() + profile.layers(l).backward_flops();
    if (done >= total * firsts.size() / k && l + 1 < profile.layers_size()) firsts.push_back(l + 1);
  }
  return firsts;
}

// "Both": a pipeline of `k` stages whose stages also offload. Each stage's
// layers are planned alone, as one accelerator with 1/k of the host's
// update threads and its own link, at the pipeline's micro-batches (the best
// of gpu_only, zero_offload and reuse_distance); the pipeline's step is the
// slowest stage's predicted step plus 1F1B's fill and drain ((k - 1)
// micro-batches of the busiest stage's compute). An estimate composed from
// the single-accelerator planner, and nothing runs it: the pipeline runner's
// stages do not offload (docs/pipeline.md). Returns false, saying why, where
// a stage fits under no strategy.
bool PrintPipelineWithOffload(const PlanRequest& request, int k, int micro) {
  const std::vector<int> firsts = BalancedStages(request.profile, k);
  const int layers = request.profile.layers_size();
  const int micro_batches = request.batch_size / micro;
  double slowest = 0, busiest = 0;
  int64_t largest = 0;
  std::string mix;
  for (int s = 0; s < k; ++s) {
    const int last = s + 1 < k ? firsts[s + 1] - 1 : layers - 1;
    PlanRequest stage = request;
    stage.profile = SubChain(request.profile, firsts[s], last);
    stage.micro_batch_size = micro;
    stage.host_update_threads = std::max(1, request.hardware->host().threads() / k);
    tandem::v1::PlanModelResponse response;
    WallSeconds(stage, &response);
    const tandem::v1::Plan* best = FastestFeasible(response);
    const std::string name = absl::StrCat("pipeline x", k, " + host, ", micro_batches, " micro-b.");
    if (best == nullptr) {
      std::printf("  %-22s %-36s %-9s  stage %d (layers %d-%d) fits under no strategy\n", "",
                  name.c_str(), "no", s, firsts[s], last);
      return false;
    }
    const double step = best->prediction().iteration_seconds();
    slowest = std::max(slowest, step);
    busiest = std::max(busiest, step - best->prediction().accelerator_idle_seconds());
    largest = std::max(largest, best->prediction().accelerator_peak_bytes());
    absl::StrAppend(&mix, s > 0 ? ", " : "", StrategyName(best->strategy()));
  }
  const double step = slowest + (k - 1) * busiest / micro_batches;
  std::printf("  %-22s %-36s %-9s %13s %11.1f %14s  stages: %s\n", "",
              absl::StrCat("pipeline x", k, " + host, ", micro_batches, " micro-b.").c_str(), "yes",
              FormatSeconds(step).c_str(), request.batch_size / step, FormatBytes(largest).c_str(),
              mix.c_str());
  return true;
}

// Pipelines over 2, 4 and 8 of `spec`'s accelerators (1F1B, 4 micro-batches
// per stage), next to the best single-accelerator plan with the host
// (zero_offload or reuse_distance, or gpu_only where it fits) and to
// pipelines whose stages offload too (PrintPipelineWithOffload's estimate):
// predicted step and the largest stage's memory.
void PipelineVsOffload(const tandem::v1::HardwareSpec& spec, tandem::v1::Precision precision) {
  const Gpt models[] = {
      {"GPT-2 XL 1.6B", {32, 1024, 1600, 48, 25, 50257}},
      {"GPT 6.7B (32 x 4096)", {32, 1024, 4096, 32, 32, 50257}},
      {"GPT 13B (40 x 5120)", {32, 1024, 5120, 40, 40, 50257}},
  };
  std::printf(
      "== Pipelines over %s's accelerators against one accelerator with the host, %s, Adam,\n"
      "   batch 32, context 1024; pipelines 1F1B with 4 micro-batches per stage, each stage\n"
      "   on one accelerator (%s); a stage that does not fit recomputes its activations or\n"
      "   keeps its optimizer state on the host (each layer updated there once its last\n"
      "   backward is done, beside the rest of it), and where nothing else fits streams\n"
      "   those layers' weights up for each forward and backward, as the runner does.\n"
      "   \"+ host\": each\n"
      "   stage runs a hybrid plan, planned alone with 1/K of\n"
      "   the host (an estimate: the runner's stages do not run hybrid plans).\n\n",
      spec.name().c_str(), IsMixed(precision) ? "bf16 mixed precision" : "fp32",
      FormatBytes(spec.accelerators(0).memory_bytes()).c_str());
  std::printf("  %-22s %-36s %-9s %13s %11s %14s\n", "model", "plan", "feasible", "step",
              "samples/s", "largest stage");
  for (const Gpt& m : models) {
    PlanRequest request;
    request.clips_gradients = ClipsGradients();
    request.profile = GptIn(m.shape, precision);
    request.hardware = spec;
    request.batch_size = m.shape.batch_size;
    request.compare = {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                       tandem::v1::STRATEGY_REUSE_DISTANCE};
    tandem::v1::PlanModelResponse response;
    WallSeconds(request, &response);
    const tandem::v1::Plan* best = FastestFeasible(response);
    if (best != nullptr) {
      std::printf("  %-22s %-36s %-9s %13s %11.1f %14s\n", m.name,
                  ("1 accelerator + host, " + StrategyName(best->strategy())).c_str(), "yes",
                  FormatSeconds(best->prediction().iteration_seconds()).c_str(),
                  m.shape.batch_size / best->prediction().iteration_seconds(),
                  FormatBytes(best->prediction().accelerator_peak_bytes()).c_str());
    } else {
      std::printf("  %-22s %-36s %-9s\n", m.name, "1 accelerator + host", "no");
    }
    for (int k : {2, 4, 8}) {
      if (k > spec.accelerators_size()) break;
      PlanRequest p = request;
      p.pipeline_devices = k;
      p.micro_batch_size = std::max(1, m.shape.batch_size / (4 * k));
      absl::StatusOr<tandem::v1::Plan> plan =
          SolvePipelinePlan(p, tandem::v1::PIPELINE_SCHEDULE_ONE_F_ONE_B);
      const std::string name = absl::StrCat(
          "pipeline x", k, ", ", plan.ok() ? plan->micro_batches() : 0, " micro-batches");
      if (!plan.ok() || !plan->feasible()) {
        std::printf("  %-22s %-36s %-9s  %s\n", "", name.c_str(), "no",
                    plan.ok() ? plan->solver().note().c_str()
                              : std::string(plan.status().message()).c_str());
        continue;
      }
      // How its stages hold their layers: r(ecompute), a(ctivations
      // offloaded), o(ptimizer state offloaded), s(treamed weights), - (all
      // on the device).
      std::string held;
      for (const tandem::v1::PipelineStage& st : plan->pipeline()) {
        std::string how =
            absl::StrCat(st.recompute() ? "r" : "", st.offload_activations() ? "a" : "",
                         st.offload_optimizer() ? "o" : "", st.stream_weights() ? "s" : "");
        absl::StrAppend(&held, held.empty() ? "  stages: " : " ", how.empty() ? "-" : how);
      }
      std::printf("  %-22s %-36s %-9s %13s %11.1f %14s%s\n", "", name.c_str(), "yes",
                  FormatSeconds(plan->prediction().iteration_seconds()).c_str(),
                  m.shape.batch_size / plan->prediction().iteration_seconds(),
                  FormatBytes(plan->prediction().accelerator_peak_bytes()).c_str(), held.c_str());
    }
    for (int k : {2, 4, 8}) {
      if (k > spec.accelerators_size()) break;
      PrintPipelineWithOffload(request, k, std::max(1, m.shape.batch_size / (4 * k)));
    }
  }
  std::printf("\n");
}

// Data parallelism over 1 to 64 nodes of `spec` (docs/distributed.md): one
// rank per accelerator, 8 sequences per rank (weak scaling), the planner's
// choice of replicated or partitioned, next to published scaling figures
// (other models and machines: they say what efficiency such systems reach,
// not what this model would).
void ScaleOutTable(const tandem::v1::HardwareSpec& spec) {
  const Gpt models[] = {
      {"GPT-2 XL 1.6B", {64, 1024, 1600, 48, 25, 50257}},
      {"GPT 6.7B (32 x 4096)", {64, 1024, 4096, 32, 32, 50257}},
  };
  std::printf(
      "== Data parallel over nodes of %s (bf16, Adam, 8 sequences of 1024 per accelerator,\n"
      "   25 MiB buckets; links: %.0f GB/s between a node's accelerators, %.0f GB/s each to the\n"
      "   network). Predictions, not measurements.\n\n",
      spec.name().c_str(), spec.accelerator_to_accelerator().bandwidth_bytes_per_second() / 1e9,
      spec.network().bandwidth_bytes_per_second() / 1e9);
  for (const Gpt& m : models) {
    ScaleOutRequest r;
    r.rank.profile = GptIn(m.shape, tandem::v1::PRECISION_BF16);
    r.rank.hardware = spec;
    r.rank.batch_size = m.shape.batch_size;
    r.rank.clips_gradients = ClipsGradients();
    r.rank.compare = {tandem::v1::STRATEGY_GPU_ONLY, tandem::v1::STRATEGY_ZERO_OFFLOAD,
                      tandem::v1::STRATEGY_REUSE_DISTANCE};
    r.nodes = {1, 2, 4, 8, 64};
    r.gradient_bytes_per_element = 2;
    absl::StatusOr<std::vector<tandem::v1::ScaleOutPlan>> plans = PlanScaleOut(r);
    if (!plans.ok()) {
      std::printf("  %s: %s\n", m.name, std::string(plans.status().message()).c_str());
      continue;
    }
    tandem::v1::PlanModelResponse response;
    for (auto& p : *plans) *response.add_scale_out() = p;
    std::printf("  %s\n%s\n", m.name, RenderScaleOut(response).c_str());
  }
  std::printf(
      "  Published, for comparison (other models, other machines):\n"
      "  - Horovod (docs/benchmarks.md): 512 GPUs (128 servers x 4 Pascal, 25 Gbit/s RoCE),\n"
      "    90%% scaling efficiency for Inception V3 and ResNet-101, 68%% for VGG-16.\n"
      "  - Hugging Face's Ultra-Scale Playbook, data-parallel throughput per GPU: 40,150 tokens/s\n"
      "    on 8 GPUs, 35,368 on 32, 31,112 on 64, 26,446 on 128, 15,700 on 256, i.e. 88%%, 77%%,\n"
      "    66%% and 39%% of the 8-GPU rate (nanotron/ultrascale-playbook, dp_scaling).\n\n");
}

}  // namespace
}  // namespace tandem::planner

// Usage: planner_bench [HARDWARE_SPEC [gpt | streamed | pipeline | scaleout | solve LAYERS RUNS
// [all]]]; "streamed" prints the streamed-state table alone, "pipeline" the pipeline tables,
// "scaleout" the data-parallel table; "gpt" skips the solve times; "solve" times one chain length
// only (for profilers). PLANNER_BENCH_CLIP=1: every job clips its gradients.
int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "planner/hardware/h100_sxm_node.textproto";
  const bool gpt_only = argc > 2 && std::string(argv[2]) == "gpt";
  const bool streamed_only = argc > 2 && std::string(argv[2]) == "streamed";
  absl::StatusOr<tandem::v1::HardwareSpec> spec = tandem::planner::LoadHardwareSpec(path);
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", std::string(spec.status().message()).c_str());
    return 1;
  }
  if (argc > 4 && std::string(argv[2]) == "solve") {
    tandem::planner::SolveOne(*spec, std::atoi(argv[3]), std::atoi(argv[4]),
                              argc > 5 && std::string(argv[5]) == "all");
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "pipeline") {
    tandem::planner::PipelineVsOffload(*spec, tandem::v1::PRECISION_FP32);
    tandem::planner::PipelineVsOffload(*spec, tandem::v1::PRECISION_BF16);
    return 0;
  }
  if (argc > 2 && std::string(argv[2]) == "scaleout") {
    tandem::planner::ScaleOutTable(*spec);
    return 0;
  }
  if (streamed_only) {
    tandem::planner::StreamedState(*spec, tandem::v1::PRECISION_BF16, 1);
    tandem::planner::StreamedState(*spec, tandem::v1::PRECISION_BF16, 8);
    return 0;
  }
  if (!gpt_only) tandem::planner::SolveTimes(*spec);
  tandem::planner::GptSpeedups(*spec, tandem::v1::PRECISION_FP32);
  tandem::planner::GptSpeedups(*spec, tandem::v1::PRECISION_BF16);
  tandem::planner::StreamedState(*spec, tandem::v1::PRECISION_BF16, 1);
  tandem::planner::StreamedState(*spec, tandem::v1::PRECISION_BF16, 8);
  tandem::planner::LargestGpt(*spec, tandem::v1::PRECISION_BF16);
  tandem::planner::PipelineVsOffload(*spec, tandem::v1::PRECISION_FP32);
  tandem::planner::PipelineVsOffload(*spec, tandem::v1::PRECISION_BF16);
  tandem::planner::ScaleOutTable(*spec);
  return 0;
}
