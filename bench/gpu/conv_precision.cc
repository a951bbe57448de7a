// What cuDNN's bf16 convolutions buy over fp32 (TF32) on this GPU, pass by
// pass, for the convolutions of Tandem's presets: the algorithms cuDNN's
// heuristics give Tandem (cudnn_ops.h) and the median of 20 timed calls of each
// pass after 3 warm-ups (CUDA events), fp32 and bf16 side by side in one run.
// Needs a GPU; prints figures and asserts nothing.
//
//   bazel-bin/bench/gpu/conv_precision
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "runtime/cuda/allocator.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/cudnn_ops.h"
#include "runtime/cuda/device_query.h"

namespace tandem::cuda {
namespace {

struct Case {
  const char* name;
  ConvGeometry g;
};

ConvGeometry Same(int64_t batch, int64_t hw, int64_t in, int64_t out, int64_t kernel) {
  return {.batch = batch,
          .height = hw,
          .width = hw,
          .in_channels = in,
          .out_channels = out,
          .kernel = kernel,
          .stride = 1,
          .padding = kernel / 2,
          .out_height = hw,
          .out_width = hw};
}

// Median milliseconds of `call` on ctx's stream; -1 when it fails.
double TimeMs(CudaContext* ctx, const std::function<absl::Status()>& call) {
  for (int i = 0; i < 3; ++i) {
    if (!call().ok()) return -1;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    cudaEventRecord(start, ctx->stream);
    if (!call().ok()) return -1;
    cudaEventRecord(stop, ctx->stream);
    cudaEventSynchronize(stop);
    float t = 0;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Main() {
  if (QueryCudaDevices().empty()) {
    std::printf("no CUDA device\n");
    return 1;
  }
  CudaAllocator allocator(0);
  CudaContextOptions options;
  options.allow_tf32 = true;  // the accelerator's default
  absl::StatusOr<std::unique_ptr<CudaContext>> ctx = CudaContext::Create(0, &allocator, options);
  if (!ctx.ok()) {
    std::printf("%s\n", std::string(ctx.status().message()).c_str());
    return 1;
  }
  CudaContext* c = ctx->get();
  std::printf("device: %s\n", QueryCudaDevices()[0].name.c_str());
  const std::vector<Case> cases = {
      {"cnn conv1 (batch 512)", Same(512, 28, 1, 32, 5)},
      {"cnn conv2 (batch 512)", Same(512, 14, 32, 64, 5)},
      {"cnn conv1 (batch 128)", Same(128, 28, 1, 32, 5)},
      {"cnn conv2 (batch 128)", Same(128, 14, 32, 64, 5)},
      {"resnet 3x3 16 (batch 128)", Same(128, 32, 16, 16, 3)},
      {"resnet 3x3 64 (batch 128)", Same(128, 16, 64, 64, 3)},
  };
  std::printf("%-27s %-5s %9s %9s %9s  algorithms\n", "convolution", "type", "fwd ms", "bwd-d ms",
              "bwd-w ms");
  for (const Case& k : cases) {
    for (bool bf16 : {false, true}) {
      ConvGeometry g = k.g;
      g.bf16 = bf16;
      const int64_t bytes = bf16 ? 2 : 4;
      const int64_t nx = g.batch * g.height * g.width * g.in_channels;
      const int64_t ny = g.batch * g.out_height * g.out_width * g.out_channels;
      const int64_t nw = g.out_channels * g.in_channels * g.kernel * g.kernel;
      void *x = nullptr, *y = nullptr, *w = nullptr, *dx = nullptr, *dw = nullptr;
      for (auto [p, n] : {std::pair{&x, nx}, {&y, ny}, {&w, nw}, {&dx, nx}, {&dw, nw}}) {
        cudaMalloc(p, n * bytes);
        cudaMemset(*p, 0, n * bytes);
      }
      absl::StatusOr<std::string> algos = ConvolutionAlgorithms(c, g);
      const double fwd = TimeMs(c, [&] { return ConvolutionForward(c, g, x, w, y); });
      const double data = TimeMs(c, [&] { return ConvolutionBackwardData(c, g, y, w, dx); });
      const double filter = TimeMs(c, [&] { return ConvolutionBackwardFilter(c, g, x, y, dw); });
      std::printf("%-27s %-5s %9.3f %9.3f %9.3f  %s\n", k.name, bf16 ? "bf16" : "tf32", fwd, data,
                  filter,
                  algos.ok() ? algos->c_str() : std::string(algos.status().message()).c_str());
      for (void* p : {x, y, w, dx, dw}) cudaFree(p);
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem::cuda

int main() { return tandem::cuda::Main(); }
