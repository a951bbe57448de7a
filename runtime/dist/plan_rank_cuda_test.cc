// A data-parallel rank on a GPU (GPU machines only; skipped without a
// device): one rank running the reuse-distance plan on a CUDA accelerator,
// its accelerator's gradient buckets summed by NCCL (a 1-rank communicator),
// its host's by Gloo, trains as the same rank whose device buckets are staged
// through host memory, and the device buckets went through NCCL.
#include <cmath>
#include <memory>
#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/core/allocator.h"
#include "runtime/cuda/accelerator_factory.h"
#include "runtime/cuda/device_query.h"
#include "runtime/dist/nccl_gradients.h"
#include "runtime/dist/plan_rank.h"
#include "runtime/exec/plan_test_util.h"

namespace tandem {
namespace {

using exec_test::Case;
using exec_test::Cases;
using exec_test::Fixture;
using exec_test::MakeFixture;

struct CudaRankRun {
  std::vector<double> losses;
  int device_buckets = 0;
  CollectiveStats gradients;
};

CudaRankRun RunOneCudaRank(const Fixture& f, const Case& c, bool nccl, int steps) {
  CudaRankRun run;
  gloo::rendezvous::HashStore store;
  CommunicatorOptions copts;
  copts.timeout = absl::Seconds(60);
  auto comm = Communicator::Connect(store, "cuda_dp", 0, 1, copts);
  auto control = Communicator::Connect(store, "cuda_dp_control", 0, 1, copts);
  EXPECT_TRUE(comm.ok() && control.ok());
  if (!comm.ok() || !control.ok()) return run;
  absl::StatusOr<std::unique_ptr<Accelerator>> gpu = cuda::CreateCudaAccelerator(0, 1 << 30);
  EXPECT_TRUE(gpu.ok()) << gpu.status();
  if (!gpu.ok()) return run;
  DeviceAllReduce device_sum;
  if (nccl) {
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> n =
        NcclCommunicator::Connect(store, "cuda_dp_nccl", 0, 1);
    EXPECT_TRUE(n.ok()) << n.status();
    if (!n.ok()) return run;
    device_sum = NcclDeviceAllReduce(std::shared_ptr<NcclCommunicator>(*std::move(n)), 0);
  }
  HostAllocator host;
  const int64_t batch = f.spec.training().batch_size();
  ExecutorOptions options;
  options.plan = c.plan(*f.model, static_cast<int>(batch));
  options.optimizer = f.spec.optimizer();
  options.max_batch = batch;
  options.init_seed = f.spec.training().seed();
  options.host_allocator = &host;
  options.accelerator = gpu->get();
  auto runner =
      PlanRankRunner::Create(*f.model, options, batch, *std::move(comm), *std::move(control),
                             DataParallelOptions{}, *std::move(gpu), device_sum);
  EXPECT_TRUE(runner.ok()) << runner.status();
  if (!runner.ok()) return run;
  run.losses = exec_test::RunSteps(f, **runner, steps);
  const tandem::v1::Schedule program = (*runner)->program();
  for (const auto& op : program.ops()) {
    if (op.kind() == tandem::v1::Schedule::OP_KIND_ALL_REDUCE && !op.host_replica()) {
      ++run.device_buckets;
    }
  }
  run.gradients = (*runner)->gradient_stats();
  return run;
}

TEST(PlanRankCudaTest, NcclSumsTheDeviceBucketsOfOneRankAsStagingDoes) {
  if (cuda::QueryCudaDevices().empty()) GTEST_SKIP() << "no CUDA device";
  const Fixture f = MakeFixture(exec_test::kGpt);
  const Case* c = nullptr;
  for (const Case& x : Cases()) {
    if (std::string(x.name) == "reuse_distance") c = &x;
  }
  ASSERT_NE(c, nullptr);
  const int steps = 10;
  const CudaRankRun staged = RunOneCudaRank(f, *c, /*nccl=*/false, steps);
  const CudaRankRun nccl = RunOneCudaRank(f, *c, /*nccl=*/true, steps);
  ASSERT_EQ(nccl.losses.size(), static_cast<size_t>(steps));
  ASSERT_EQ(staged.losses.size(), nccl.losses.size());
  ASSERT_GT(nccl.device_buckets, 0) << "the plan has no accelerator bucket";
  for (int s = 0; s < steps; ++s) {
    // A sum over one rank is the data: the same values either way, up to a
    // GPU kernel that sums in its own order from run to run.
    EXPECT_NEAR(nccl.losses[s], staged.losses[s], 1e-6 * std::abs(staged.losses[s]))
        << "step " << s;
  }
  EXPECT_GE(nccl.gradients.calls, steps * nccl.device_buckets);
  EXPECT_LT(nccl.losses.back(), nccl.losses.front());
}

}  // namespace
}  // namespace tandem
