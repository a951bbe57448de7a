// The CUDA accelerator against the Accelerator contract and the CPU references:
// copies from concurrent threads, the budget, Fill, UpdateSlice against
// runtime/optim, SumOfSquares against optim::SumOfSquares, errors recorded by
// layers, and above all the plan executor on it matching the CPU engine under
// every plan shape. Tests run on the last device, so that on a multi-GPU machine
// a worker thread that forgot to make the device current would fail. Skipped
// without a GPU.
#include "runtime/cuda/cuda_accelerator.h"

#include <cuda_runtime.h>

#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/core/random.h"
#include "runtime/cuda/device_query.h"
#include "runtime/cuda/test_util.h"
#include "runtime/data/loader.h"
#include "runtime/exec/cpu_runner.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/exec/plan_test_util.h"
#include "runtime/optim/kernels.h"

namespace tandem::cuda {
namespace {

using exec_test::Case;
using exec_test::Cases;
using exec_test::Fixture;
using exec_test::kGpt;
using exec_test::kMlp;
using exec_test::MakeFixture;
using exec_test::RunSteps;

constexpr int64_t kBudgetBytes = int64_t{256} << 20;

int TestOrdinal() { return QueryCudaDevices().back().ordinal; }

std::unique_ptr<CudaAccelerator> Open(int64_t budget_bytes = kBudgetBytes,
                                      bool allow_tf32 = false) {
  CudaAcceleratorOptions options;
  options.allow_tf32 = allow_tf32;
  absl::StatusOr<std::unique_ptr<CudaAccelerator>> a =
      CudaAccelerator::Create(TestOrdinal(), budget_bytes, options);
  EXPECT_TRUE(a.ok()) << a.status();
  return a.ok() ? std::move(a).value() : nullptr;
}

std::vector<float> Uniform(int64_t n, uint64_t stream, float low, float high) {
  std::vector<float> v(n);
  FillUniform(v.data(), n, low, high, 5, stream);
  return v;
}

Buffer DeviceBuffer(Accelerator& a, int64_t n) {
  absl::StatusOr<Buffer> b = Buffer::Allocate(a.allocator(), n * 4, MemoryCategory::kActivations);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(b).value() : Buffer();
}

Buffer ToDevice(Accelerator& a, const std::vector<float>& host) {
  Buffer b = DeviceBuffer(a, static_cast<int64_t>(host.size()));
  EXPECT_TRUE(a.CopyToDevice(b.data(), host.data(), b.bytes()).ok());
  return b;
}

std::vector<float> ToHost(Accelerator& a, const Buffer& b) {
  std::vector<float> host(b.bytes() / 4);
  const absl::Status s = a.CopyToHost(host.data(), b.data(), b.bytes());
  EXPECT_TRUE(s.ok()) << s;
  return host;
}

TEST(CudaAcceleratorTest, IsTheDeviceWithItsContextAndPinnedStaging) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  const std::string id = absl::StrCat("cuda:", TestOrdinal());
  EXPECT_EQ(a->kind(), DeviceKind::kCuda);
  EXPECT_EQ(a->id(), id);
  EXPECT_EQ(a->allocator()->device_id(), id);
  EXPECT_EQ(a->allocator()->stats().budget_bytes, kBudgetBytes);
  EXPECT_EQ(a->host_staging_allocator()->device_id(), "cpu:pinned");
  const LayerContext ctx = a->ComputeContext();
  EXPECT_EQ(ctx.device, DeviceKind::kCuda);
  EXPECT_EQ(ctx.cuda, a->context());
  EXPECT_EQ(a->context()->device, TestOrdinal());
  EXPECT_FALSE(a->context()->allow_tf32());
  // Its own workspace (cuBLAS's) counts against the budget from the start.
  EXPECT_GE(a->allocator()->stats().in_use(MemoryCategory::kWorkspace), int64_t{32} << 20);
  EXPECT_TRUE(a->FinishCompute().ok());
}

// Two accelerators of one GPU (two pipeline stages on it): a peer link, and
// a pull from the other's memory copies device to device; every other GPU
// the driver calls a peer is one too. A pointer outside this device's
// memory is refused.
TEST(CudaAcceleratorTest, PullsFromAnotherAcceleratorsMemoryOverItsPeerLink) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open(), b = Open();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  EXPECT_TRUE(b->HasPeerLink(*a));
  EXPECT_FALSE(b->HasPeerLink(*b));
  constexpr int64_t kBytes = 4 << 20;
  std::vector<char> host(kBytes), back(kBytes, 0);
  for (int64_t i = 0; i < kBytes; ++i) host[i] = static_cast<char>(i * 7);
  Buffer from = *Buffer::Allocate(a->allocator(), kBytes, MemoryCategory::kActivations);
  Buffer to = *Buffer::Allocate(b->allocator(), kBytes, MemoryCategory::kActivations);
  ASSERT_TRUE(a->CopyToDevice(from.data(), host.data(), kBytes).ok());
  ASSERT_TRUE(b->CopyFromPeer(to.data(), *a, from.data(), kBytes).ok());
  ASSERT_TRUE(b->CopyToHost(back.data(), to.data(), kBytes).ok());
  EXPECT_EQ(host, back);
  EXPECT_EQ(b->CopyFromPeer(host.data(), *a, from.data(), 64).code(), absl::StatusCode::kInternal);
  const int devices = static_cast<int>(QueryCudaDevices().size());
  for (int other = 0; other < devices; ++other) {
    if (other == TestOrdinal()) continue;
    absl::StatusOr<std::unique_ptr<CudaAccelerator>> c =
        CudaAccelerator::Create(other, kBudgetBytes);
    ASSERT_TRUE(c.ok()) << c.status();
    int can = 0;
    ASSERT_EQ(cudaDeviceCanAccessPeer(&can, TestOrdinal(), other), cudaSuccess);
    EXPECT_EQ(b->HasPeerLink(**c), can != 0) << "cuda:" << other;
    std::cout << "cuda:" << TestOrdinal() << " -> cuda:" << other << ": peer link " << can << "\n";
  }
}

TEST(CudaAcceleratorTest, ZeroBudgetIsTheDevicesFreeMemory) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaAccelerator>> a = CudaAccelerator::Create(TestOrdinal(), 0);
  ASSERT_TRUE(a.ok()) << a.status();
  const MemoryStats stats = (*a)->allocator()->stats();
  EXPECT_GT(stats.budget_bytes, stats.total_in_use_bytes);
  EXPECT_LE(stats.budget_bytes, QueryCudaDevices().back().memory_bytes);
}

TEST(CudaAcceleratorTest, BudgetIsAHardLimitOnAccountedBytes) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t kBudget = int64_t{64} << 20, kMiB = int64_t{1} << 20;
  std::unique_ptr<CudaAccelerator> a = Open(kBudget);
  ASSERT_NE(a, nullptr);
  Allocator* alloc = a->allocator();
  const int64_t fixed = alloc->stats().total_in_use_bytes;
  ASSERT_LT(fixed, kBudget - 2 * kMiB);
  absl::StatusOr<Buffer> big =
      Buffer::Allocate(alloc, kBudget - fixed - kMiB, MemoryCategory::kActivations);
  ASSERT_TRUE(big.ok()) << big.status();
  absl::StatusOr<Buffer> refused = Buffer::Allocate(alloc, 2 * kMiB, MemoryCategory::kActivations);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find(a->id() + " memory budget exceeded"), std::string::npos)
      << refused.status();
  MemoryStats stats = alloc->stats();
  EXPECT_EQ(stats.refusals, 1);
  EXPECT_EQ(stats.in_use(MemoryCategory::kActivations), kBudget - fixed - kMiB);
  EXPECT_LE(stats.peak_total_bytes, kBudget);
  // Freed memory is available again, from the cache.
  big->Reset();
  EXPECT_TRUE(Buffer::Allocate(alloc, 2 * kMiB, MemoryCategory::kActivations).ok());
  EXPECT_EQ(alloc->stats().total_in_use_bytes, fixed);
}

TEST(CudaAcceleratorTest, ABudgetBelowItsOwnWorkspaceIsRefusedAtCreation) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<std::unique_ptr<CudaAccelerator>> a =
      CudaAccelerator::Create(TestOrdinal(), int64_t{1} << 20);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted) << a.status();
}

TEST(CudaAcceleratorTest, RegisteredHostMemoryIsCountedCopiedAndReleased) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  constexpr int64_t n = (int64_t{4} << 20) + 5;  // 16 MiB and a bit
  CudaAcceleratorOptions options;
  options.pinned_host_budget_bytes = 3 * n * 4 / 2;  // room for one, not two
  absl::StatusOr<std::unique_ptr<CudaAccelerator>> opened =
      CudaAccelerator::Create(TestOrdinal(), kBudgetBytes, options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  CudaAccelerator& a = **opened;
  const int64_t before = a.pinned_host_bytes();
  std::vector<float> host = Uniform(n, 11, -1, 1), back(n, -7.0f), other(n);
  ASSERT_TRUE(a.RegisterHost(host.data(), n * 4).ok());
  EXPECT_EQ(a.pinned_host_bytes(), before + n * 4);
  EXPECT_EQ(a.RegisterHost(host.data(), n * 4).code(), absl::StatusCode::kInvalidArgument);
  // Past the budget: refused, and the memory is still usable pageable.
  const absl::Status over = a.RegisterHost(other.data(), n * 4);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_EQ(a.pinned_host_bytes(), before + n * 4);
  ASSERT_TRUE(a.RegisterHost(back.data(), n * 4).code() == absl::StatusCode::kResourceExhausted);
  Buffer d = DeviceBuffer(a, n);
  ASSERT_TRUE(a.CopyToDevice(d.data(), host.data(), n * 4).ok());
  ASSERT_TRUE(a.CopyToHost(back.data(), d.data(), n * 4).ok());
  EXPECT_EQ(back, host);
  a.UnregisterHost(host.data());
  EXPECT_EQ(a.pinned_host_bytes(), before);
  a.UnregisterHost(host.data());  // Twice is harmless.
  // Now the other fits.
  EXPECT_TRUE(a.RegisterHost(other.data(), n * 4).ok());
  a.UnregisterHost(other.data());
}

TEST(CudaAcceleratorTest, CopiesRoundTripConcurrentlyFromTwoThreadsWhileComputeRuns) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  constexpr int kBuffers = 6, kRounds = 4;
  constexpr int64_t n = (int64_t{1} << 20) + 3;  // 4 MiB and a bit, per buffer
  auto pattern = [](int buffer, int round, int64_t i) {
    return static_cast<float>(buffer * 1000 + round) + static_cast<float>(i % 7) * 0.25f;
  };
  std::vector<Buffer> uploaded, downloaded, filled;
  for (int b = 0; b < kBuffers; ++b) {
    uploaded.push_back(DeviceBuffer(*a, n));
    filled.push_back(DeviceBuffer(*a, n));
    std::vector<float> host(n);
    for (int64_t i = 0; i < n; ++i) host[i] = pattern(b, -1, i);
    downloaded.push_back(ToDevice(*a, host));
  }
  // Host sides: pinned staging for even buffers, pageable memory for odd ones.
  auto host_buffer = [&](int b) {
    if (b % 2 == 1) {
      return Buffer::Allocate(DefaultHostAllocator(), n * 4, MemoryCategory::kActivations);
    }
    return Buffer::Allocate(a->host_staging_allocator(), n * 4, MemoryCategory::kActivations);
  };
  std::vector<std::string> errors[3];
  std::thread h2d([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int b = 0; b < kBuffers; ++b) {
        absl::StatusOr<Buffer> src = host_buffer(b);
        if (!src.ok()) return errors[0].push_back(src.status().ToString());
        for (int64_t i = 0; i < n; ++i) src->f32()[i] = pattern(b, r, i);
        const absl::Status s = a->CopyToDevice(uploaded[b].data(), src->data(), n * 4);
        if (!s.ok()) errors[0].push_back(s.ToString());
      }
    }
  });
  std::thread d2h([&] {
    for (int r = 0; r < kRounds; ++r) {
      for (int b = 0; b < kBuffers; ++b) {
        absl::StatusOr<Buffer> dst = host_buffer(b);
        if (!dst.ok()) return errors[1].push_back(dst.status().ToString());
        const absl::Status s = a->CopyToHost(dst->data(), downloaded[b].data(), n * 4);
        if (!s.ok()) errors[1].push_back(s.ToString());
        for (int64_t i = 0; i < n; ++i) {
          if (dst->f32()[i] != pattern(b, -1, i)) {
            errors[1].push_back(
                absl::StrCat("buffer ", b, " element ", i, " came back as ", dst->f32()[i]));
            break;
          }
        }
      }
    }
  });
  std::thread compute([&] {
    for (int b = 0; b < kBuffers; ++b) {
      const absl::Status s = a->Fill(filled[b].f32(), 0.5f + b, n);
      if (!s.ok()) errors[2].push_back(s.ToString());
    }
    const absl::Status s = a->FinishCompute();
    if (!s.ok()) errors[2].push_back(s.ToString());
  });
  h2d.join();
  d2h.join();
  compute.join();
  for (const auto& e : errors) EXPECT_TRUE(e.empty()) << e.front();
  for (int b = 0; b < kBuffers; ++b) {
    const std::vector<float> up = ToHost(*a, uploaded[b]);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(up[i], pattern(b, kRounds - 1, i)) << "buffer " << b << " element " << i;
    }
    const std::vector<float> fill = ToHost(*a, filled[b]);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(fill[i], 0.5f + b) << "buffer " << b;
  }
}

TEST(CudaAcceleratorTest, CopiesRefuseAPointerOutsideDeviceMemory) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  std::vector<float> host(16, 1.0f), other(16, 0.0f);
  absl::Status s = a->CopyToDevice(other.data(), host.data(), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("outside device memory"), std::string::npos) << s;
  s = a->CopyToHost(other.data(), host.data(), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(other[0], 0.0f);
  // Zero bytes is nothing to check and nothing to do.
  EXPECT_TRUE(a->CopyToDevice(nullptr, nullptr, 0).ok());
}

TEST(CudaAcceleratorTest, FillSetsExactlyTheRange) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  constexpr int64_t n = 100003;
  Buffer b = DeviceBuffer(*a, n);
  ASSERT_TRUE(a->Fill(b.f32(), -2.5f, n).ok());
  ASSERT_TRUE(a->Fill(b.f32() + 10, 7.0f, 20).ok());
  ASSERT_TRUE(a->Fill(b.f32(), 3.0f, 0).ok());
  const std::vector<float> host = ToHost(*a, b);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(host[i], i >= 10 && i < 30 ? 7.0f : -2.5f) << "element " << i;
  }
}

tandem::v1::OptimizerSpec Spec(tandem::v1::OptimizerKind kind) {
  tandem::v1::OptimizerSpec spec;
  spec.set_kind(kind);
  spec.set_learning_rate(1e-3f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  spec.set_weight_decay(0.01f);
  spec.set_momentum(0.9f);
  return spec;
}

// Three steps over a slice in the middle of larger buffers (the executor updates
// layer slices), against Optimizer::UpdateSlice on the host with the same
// constants; the elements around the slice stay untouched.
void ExpectUpdateSliceMatchesTheCpu(const tandem::v1::OptimizerSpec& spec) {
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  constexpr int64_t n = 100003, offset = 64, total = n + 2 * offset;
  std::unique_ptr<Optimizer> constants = Optimizer::Stateless(spec);
  const int states = constants->state_count();
  std::vector<float> p = Uniform(total, 1, -1, 1);
  std::vector<std::vector<float>> m(states, std::vector<float>(total, 0.0f));
  Buffer dp = ToDevice(*a, p);
  std::vector<Buffer> dm;
  for (const auto& v : m) dm.push_back(ToDevice(*a, v));
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g = Uniform(total, 10 + step, -3, 3);
    g[offset + 17] = 0.0f;
    const StepConstants& c = constants->BeginStep(1e-3f * (1 + step), step == 1 ? 0.5f : 1.0f);
    std::vector<float*> host_states, device_states;
    for (int s = 0; s < states; ++s) {
      host_states.push_back(m[s].data() + offset);
      device_states.push_back(dm[s].f32() + offset);
    }
    Optimizer::UpdateSlice(c, p.data() + offset, g.data() + offset, host_states.data(), n);
    Buffer dg = ToDevice(*a, g);
    const absl::Status s =
        a->UpdateSlice(c, dp.f32() + offset, dg.f32() + offset, device_states.data(), n);
    ASSERT_TRUE(s.ok()) << s;
  }
  // The kernels follow runtime/optim's arithmetic operation for operation.
  EXPECT_TRUE(Close(p, ToHost(*a, dp), 1e-6, "parameters"));
  for (int s = 0; s < states; ++s) {
    EXPECT_TRUE(Close(m[s], ToHost(*a, dm[s]), 1e-6, absl::StrCat("moment ", s)));
  }
}

TEST(CudaAcceleratorTest, UpdateSliceMatchesTheCpuOptimizerForAdamW) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  ExpectUpdateSliceMatchesTheCpu(Spec(tandem::v1::OPTIMIZER_KIND_ADAMW));
}

TEST(CudaAcceleratorTest, UpdateSliceMatchesTheCpuOptimizerForSgdWithMomentum) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  ExpectUpdateSliceMatchesTheCpu(Spec(tandem::v1::OPTIMIZER_KIND_SGD));
}

TEST(CudaAcceleratorTest, SumOfSquaresMatchesTheCpuInDoubleAndRepeatsExactly) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  constexpr int64_t n = 1000003;
  const std::vector<float> x = Uniform(n, 3, -2, 2);
  Buffer dx = ToDevice(*a, x);
  double exact = 0;
  for (float v : x) exact += static_cast<double>(v) * v;
  absl::StatusOr<double> got = a->SumOfSquares(dx.f32(), n);
  ASSERT_TRUE(got.ok()) << got.status();
  // Squares of floats are exact in double and the device sums them in double:
  // only the order of the sum differs from a plain loop.
  EXPECT_NEAR(*got, exact, 1e-12 * exact);
  // The CPU optimizer sums blocks of 4096 in fp32 (runtime/optim/kernels.cc),
  // so it agrees to fp32 rounding only (seen on an H100: 7.4e-10 relative).
  const double cpu = optim::SumOfSquares(x.data(), n);
  EXPECT_NEAR(*got, cpu, 1e-6 * cpu);
  EXPECT_EQ(*a->SumOfSquares(dx.f32(), n), *got);
  EXPECT_EQ(*a->SumOfSquares(dx.f32() + 5, 1), static_cast<double>(x[5]) * x[5]);
  EXPECT_EQ(*a->SumOfSquares(dx.f32(), 0), 0.0);
}

TEST(CudaAcceleratorTest, FinishComputeReturnsTheErrorALayerRecorded) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaAccelerator> a = Open();
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->FinishCompute().ok());
  // What a layer does when a CUDA call fails (device_ops.cc).
  const LayerContext ctx = a->ComputeContext();
  ctx.cuda->Check(cudaErrorLaunchOutOfResources, "SomeKernel");
  absl::Status s = a->FinishCompute();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("SomeKernel"), std::string::npos) << s;
  // Sticky: the step's device state is undefined, so later compute reports it too.
  Buffer b = DeviceBuffer(*a, 16);
  s = a->Fill(b.f32(), 1.0f, 16);
  EXPECT_NE(s.message().find("SomeKernel"), std::string::npos) << s;
}

// ---- The plan executor on the GPU ----

std::vector<float> HostParams(StepRunner& runner, const Model& model) {
  const absl::Status s = runner.SyncStateToHost();
  EXPECT_TRUE(s.ok()) << s;
  const float* p = runner.host_state().params;
  return std::vector<float>(p, p + model.parameter_elements());
}

// ||actual - expected|| / ||expected||.
double RelativeL2(const std::vector<float>& expected, const std::vector<float>& actual) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < expected.size() && i < actual.size(); ++i) {
    const double d = static_cast<double>(actual[i]) - expected[i];
    diff += d * d;
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct Tolerances {
  // Each step's loss, relative.
  double loss = 0;
  // The final weights, relative L2. Adam divides by sqrt(v): an element whose
  // gradient is near zero turns rounding differences into whole steps of
  // lr, so the maximum error says little; the norm of the error does.
  double weights = 0;
  // The evaluation loss of the trained model on one batch, relative.
  double eval = 0;
};

// Trains `steps` steps of `c`'s plan on a CudaAccelerator and on the CPU
// engine, and compares losses, weights and an evaluation; returns the largest
// relative loss deviation.
double ExpectExecutorMatchesCpu(const Fixture& f, const Case& c, bool allow_tf32, int steps,
                                const Tolerances& tol) {
  const int batch = f.spec.training().batch_size();
  HostAllocator cpu_host;
  std::unique_ptr<CpuRunner> cpu =
      *CpuRunner::Create(*f.model, f.spec.optimizer(), batch, f.spec.training().seed(), &cpu_host);
  const std::vector<double> reference = RunSteps(f, *cpu, steps);
  const std::vector<float> reference_params = HostParams(*cpu, *f.model);

  std::unique_ptr<CudaAccelerator> device = Open(kBudgetBytes, allow_tf32);
  if (device == nullptr) return INFINITY;
  HostAllocator host;
  ExecutorOptions options;
  options.plan = c.plan(*f.model, batch);
  options.optimizer = f.spec.optimizer();
  options.max_batch = batch;
  options.init_seed = f.spec.training().seed();
  options.host_allocator = &host;
  options.accelerator = device.get();
  absl::StatusOr<std::unique_ptr<PlanExecutor>> executor = PlanExecutor::Create(*f.model, options);
  EXPECT_TRUE(executor.ok()) << c.name << ": " << executor.status();
  if (!executor.ok()) return INFINITY;
  const std::vector<double> losses = RunSteps(f, **executor, steps);
  EXPECT_EQ(losses.size(), reference.size()) << c.name;
  double worst = 0;
  for (size_t s = 0; s < losses.size() && s < reference.size(); ++s) {
    const double deviation = std::fabs(losses[s] - reference[s]) / std::fabs(reference[s]);
    worst = std::max(worst, deviation);
    EXPECT_LE(deviation, tol.loss)
        << c.name << " step " << s << ": " << losses[s] << " vs " << reference[s];
  }
  if (!losses.empty()) {
    EXPECT_LT(losses.back(), losses.front()) << c.name;
  }
  const double weights = RelativeL2(reference_params, HostParams(**executor, *f.model));
  EXPECT_LE(weights, tol.weights) << c.name << ": final weights";

  // Evaluation drives the accelerator from this thread, not the executor's workers.
  BatchLoader loader(*f.data.train, batch, false, 1, false);
  const Batch& eval_batch = loader.Next();
  absl::StatusOr<EvalResult> cpu_eval = cpu->EvalBatch(eval_batch);
  absl::StatusOr<EvalResult> gpu_eval = (*executor)->EvalBatch(eval_batch);
  EXPECT_TRUE(cpu_eval.ok() && gpu_eval.ok()) << c.name;
  if (cpu_eval.ok() && gpu_eval.ok()) {
    EXPECT_NEAR(gpu_eval->loss_sum, cpu_eval->loss_sum, tol.eval * std::fabs(cpu_eval->loss_sum))
        << c.name;
    EXPECT_EQ(gpu_eval->positions, cpu_eval->positions);
  }

  const MemoryStats stats = device->allocator()->stats();
  EXPECT_LE(stats.peak_total_bytes, kBudgetBytes) << c.name;
  EXPECT_EQ(stats.refusals, 0) << c.name;
  const tandem::v1::Timeline t = (*executor)->last_timeline();
  EXPECT_EQ(t.source(), "measured") << c.name;
  EXPECT_GT(t.spans_size(), 0) << c.name;
  const std::string precision = f.compute == DType::kBF16  ? "bf16"
                                : f.compute == DType::kF16 ? "fp16"
                                : allow_tf32               ? "tf32"
                                                           : "fp32";
  std::cout << c.name << " (" << precision << "): max relative loss deviation " << worst
            << ", final weights relative L2 error " << weights << "\n";
  ::testing::Test::RecordProperty(c.name + "_" + precision + "_loss_deviation",
                                  std::to_string(worst));
  ::testing::Test::RecordProperty(c.name + "_" + precision + "_weights_error",
                                  std::to_string(weights));
  return worst;
}

// Every plan shape that uses the accelerator (not cpu_only).
std::vector<int> AcceleratorCases() {
  std::vector<int> cases;
  const std::vector<Case> all = Cases();
  for (int i = 0; i < static_cast<int>(all.size()); ++i) {
    if (all[i].name != "cpu_only") cases.push_back(i);
  }
  return cases;
}

class CudaExecutorMatchesCpuTest : public testing::TestWithParam<std::tuple<const char*, int>> {};

// TF32 off: the GPU differs from the CPU in summation order only (cuBLAS and
// the reductions against oneDNN), so losses agree to ~1e-4 over 20 steps.
TEST_P(CudaExecutorMatchesCpuTest, LossesWeightsAndEvaluationMatchTheCpuEngine) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const auto [yaml, which] = GetParam();
  const Fixture f = MakeFixture(yaml);
  ExpectExecutorMatchesCpu(f, Cases()[which], /*allow_tf32=*/false, /*steps=*/20,
                           {.loss = 1e-4, .weights = 5e-3, .eval = 1e-3});
}

INSTANTIATE_TEST_SUITE_P(Plans, CudaExecutorMatchesCpuTest,
                         testing::Combine(testing::Values(kMlp, kGpt),
                                          testing::ValuesIn(AcceleratorCases())),
                         [](const testing::TestParamInfo<std::tuple<const char*, int>>& info) {
                           return std::string(std::get<0>(info.param) == kMlp ? "mlp_" : "gpt_") +
                                  Cases()[std::get<1>(info.param)].name;
                         });

// TF32 on (the default): products keep a 10-bit mantissa, so the bounds are
// loose; the deviation is printed and recorded for calibration.
TEST(CudaExecutorTest, WithTf32TheLossesStayCloseToTheCpuEngine) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = MakeFixture(kMlp);
  ExpectExecutorMatchesCpu(f, Cases()[0], /*allow_tf32=*/true, /*steps=*/20,
                           {.loss = 2e-2, .weights = 5e-2, .eval = 2e-2});
}

// bf16 on both: the CPU engine multiplies on oneDNN, the executor on cuBLAS, the
// same bf16 operands each step; fp32 sums in another order can round an
// intermediate to a neighbouring bf16 value, so the bounds are TF32's.
TEST(CudaExecutorTest, InBf16EveryPlanStaysCloseToTheCpuEngineInBf16) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = MakeFixture(kGpt, DType::kBF16);
  for (int which : AcceleratorCases()) {
    ExpectExecutorMatchesCpu(f, Cases()[which], /*allow_tf32=*/true, /*steps=*/20,
                             {.loss = 2e-2, .weights = 5e-2, .eval = 2e-2});
  }
}

// fp16 on both with a fixed loss scale: cuBLAS's fp16 GEMMs against the CPU's
// (the same fp16 operands), the state fp32 on both.
TEST(CudaExecutorTest, InFp16WithLossScalingEveryPlanStaysCloseToTheCpuEngineInFp16) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  Fixture f = MakeFixture(kGpt, DType::kF16);
  f.loss_scale = 1024;
  for (int which : AcceleratorCases()) {
    ExpectExecutorMatchesCpu(f, Cases()[which], /*allow_tf32=*/true, /*steps=*/20,
                             {.loss = 5e-3, .weights = 2e-2, .eval = 5e-3});
  }
}

// A scale that overflows fp16 on the GPU: the step is skipped, the weights
// on the device untouched, and the CPU engine skips the same step.
TEST(CudaExecutorTest, AnOverflowingLossScaleSkipsTheStepOnTheGpu) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = MakeFixture(kGpt, DType::kF16);
  for (int which : AcceleratorCases()) {
    const Case& c = Cases()[which];
    std::unique_ptr<CudaAccelerator> device = Open(kBudgetBytes, true);
    ASSERT_NE(device, nullptr);
    HostAllocator host;
    auto executor = PlanExecutor::Create(
        *f.model, exec_test::ExecutorOptionsFor(f, c.plan(*f.model, 16), 16, device.get(), &host));
    ASSERT_TRUE(executor.ok()) << c.name << ": " << executor.status();
    const std::vector<float> before = HostParams(**executor, *f.model);
    BatchLoader loader(*f.data.train, 16, true, 1, false);
    StepOptions o;
    o.learning_rate = 0.01f;
    o.loss_scale = 1e30f;
    absl::StatusOr<StepResult> r = (*executor)->TrainStep(loader.Next(), o);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status();
    EXPECT_TRUE(r->skipped) << c.name;
    EXPECT_EQ(HostParams(**executor, *f.model), before) << c.name;
    EXPECT_EQ((*executor)->host_state().optimizer->step(), 0) << c.name;
  }
}

TEST(CudaExecutorTest, DeviceRefusalIsAClearError) {
  if (QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = MakeFixture(kMlp);
  std::unique_ptr<CudaAccelerator> device = Open();
  ASSERT_NE(device, nullptr);
  // Room for the weights but not the activations of a batch, over the
  // accelerator's own workspace.
  const int64_t budget = device->allocator()->stats().total_in_use_bytes + (20 << 10);
  device->allocator()->set_budget_bytes(budget);
  HostAllocator host;
  ExecutorOptions options;
  options.plan = Cases()[1].plan(*f.model, 32);
  options.optimizer = f.spec.optimizer();
  options.max_batch = 32;
  options.host_allocator = &host;
  options.accelerator = device.get();
  absl::StatusOr<std::unique_ptr<PlanExecutor>> e = PlanExecutor::Create(*f.model, options);
  ASSERT_TRUE(e.ok()) << e.status();
  BatchLoader loader(*f.data.train, 32, false, 1, false);
  absl::StatusOr<StepResult> r = (*e)->TrainStep(loader.Next(), StepOptions());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find(device->id() + " memory budget exceeded"), std::string::npos)
      << r.status();
  EXPECT_LE(device->allocator()->stats().peak_total_bytes, budget);
  EXPECT_FALSE((*e)->TrainStep(loader.Next(), StepOptions()).ok());
}

}  // namespace
}  // namespace tandem::cuda
