// What bf16 compute would buy the CPU engine on this machine, before the
// engine computes in bf16 (docs/planning.md, "Mixed precision"): every GEMM
// shape of the mlp and gpt presets of bench/cpu_training (forward, and
// backward's two products), timed through oneDNN's matmul in three ways in the
// same run:
//   - fp32: the engine's path today (runtime/cpu/matmul.h);
//   - bf16: bf16 inputs already in memory, fp32 accumulation and output, as an
//     engine that keeps bf16 activations and a bf16 weight copy would run it;
//   - bf16 + conversion: the same after converting both fp32 inputs to bf16
//     (oneDNN reorders), as an engine that keeps fp32 and converts per call.
// Prints the CPU, the ISA oneDNN dispatches to and each primitive's
// implementation, then one JSON object per shape. Asserts nothing.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "runtime/core/clock.h"
#include "runtime/core/random.h"
#include "runtime/cpu/matmul.h"
#include "runtime/cpu/onednn.h"
#include "runtime/profile/cpu_device.h"

ABSL_FLAG(int, threads, 2, "OpenMP threads.");
ABSL_FLAG(double, seconds, 0.3, "Timed seconds per shape and precision.");

namespace tandem {
namespace {

using dnnl::memory;

struct Gemm {
  std::string name;
  int64_t m, n, k;
};

// m x k times k x n, row-major: the forward is (tokens x in) (in x out); the
// input gradient (tokens x out) (out x in); the weight gradient (in x tokens)
// (tokens x out).
std::vector<Gemm> Shapes() {
  std::vector<Gemm> out;
  auto layer = [&](const std::string& layer_name, int64_t tokens, int64_t in, int64_t o) {
    out.push_back({layer_name + " fwd", tokens, o, in});
    out.push_back({layer_name + " dx", tokens, in, o});
    out.push_back({layer_name + " dw", in, o, tokens});
  };
  // mlp preset: batch 128, 784-1024-1024-10.
  layer("mlp fc1 784x1024", 128, 784, 1024);
  layer("mlp fc2 1024x1024", 128, 1024, 1024);
  // gpt preset: batch 16 x context 128 tokens, d_model 256, vocab 256.
  layer("gpt qkv 256x768", 2048, 256, 768);
  layer("gpt proj 256x256", 2048, 256, 256);
  layer("gpt mlp_up 256x1024", 2048, 256, 1024);
  layer("gpt mlp_down 1024x256", 2048, 1024, 256);
  return out;
}

// Median seconds per call of f over about `seconds`, after a warm-up call.
template <typename F>
double PerCall(double seconds, F f) {
  f();
  std::vector<double> t;
  const double end = WallSeconds() + seconds;
  do {
    const double start = WallSeconds();
    f();
    t.push_back(WallSeconds() - start);
  } while (WallSeconds() < end || t.size() < 5);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

memory::desc Plain(int64_t rows, int64_t cols, memory::data_type type) {
  return memory::desc({1, rows, cols}, type, memory::format_tag::abc);
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  using namespace tandem;
  absl::ParseCommandLine(argc, argv);
  omp_set_num_threads(absl::GetFlag(FLAGS_threads));
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::printf("# CPU: %s; oneDNN %s, ISA %s; %d threads\n", profile::HostCpuName().c_str(),
              cpu::OneDnnVersion().c_str(), cpu::OneDnnIsa().c_str(), omp_get_max_threads());
  for (const Gemm& g : Shapes()) {
    std::vector<float> a(g.m * g.k), b(g.k * g.n), c(g.m * g.n);
    FillUniform(a.data(), a.size(), -1, 1, 1, 1);
    FillUniform(b.data(), b.size(), -1, 1, 1, 2);
    cpu::MatmulShape shape;
    shape.m = g.m;
    shape.n = g.n;
    shape.k = g.k;
    const double t32 = PerCall(seconds, [&] { cpu::Matmul(shape, a.data(), b.data(), c.data()); });

    // bf16 inputs, fp32 accumulation and output.
    const memory::data_type bf16 = memory::data_type::bf16, f32 = memory::data_type::f32;
    const memory::desc a16 = Plain(g.m, g.k, bf16), b16 = Plain(g.k, g.n, bf16);
    const memory::desc c32 = Plain(g.m, g.n, f32);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a16, b16, c32), cpu::UserScratchpad(),
                                          cpu::CpuEngine());
    const dnnl::matmul prim(pd);
    memory a_mem(a16, cpu::CpuEngine()), b_mem(b16, cpu::CpuEngine());
    memory a_src = cpu::Wrap(Plain(g.m, g.k, f32), a.data());
    memory b_src = cpu::Wrap(Plain(g.k, g.n, f32), b.data());
    const memory c_mem = cpu::Wrap(c32, c.data());
    const dnnl::reorder to_a(a_src, a_mem), to_b(b_src, b_mem);
    auto convert = [&] {
      to_a.execute(cpu::ThreadStream(), a_src, a_mem);
      to_b.execute(cpu::ThreadStream(), b_src, b_mem);
      cpu::ThreadStream().wait();
    };
    auto multiply = [&] {
      cpu::Execute(prim, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    };
    convert();
    const double t16 = PerCall(seconds, multiply);
    const double t16c = PerCall(seconds, [&] {
      convert();
      multiply();
    });
    const double flops = 2.0 * g.m * g.n * g.k;
    std::printf(
        "{\"shape\": \"%s\", \"m\": %ld, \"n\": %ld, \"k\": %ld, \"fp32_seconds\": %.3e, "
        "\"bf16_seconds\": %.3e, \"bf16_convert_seconds\": %.3e, \"fp32_gflops\": %.1f, "
        "\"bf16_gflops\": %.1f, \"bf16_speedup\": %.2f, \"bf16_convert_speedup\": %.2f, "
        "\"fp32_impl\": \"%s\", \"bf16_impl\": \"%s\"}\n",
        g.name.c_str(), static_cast<long>(g.m), static_cast<long>(g.n), static_cast<long>(g.k), t32,
        t16, t16c, flops / t32 / 1e9, flops / t16 / 1e9, t32 / t16, t32 / t16c,
        cpu::MatmulImplementation(shape).c_str(), pd.impl_info_str());
    std::fflush(stdout);
  }
  return 0;
}
