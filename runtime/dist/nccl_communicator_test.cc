// NCCL on one GPU (GPU machines only; skipped without a device): a 1-rank
// communicator's all-reduce, reduce-scatter and all-gather leave device data
// as the CPU reference says (the sum over one rank is the data).
#include "runtime/dist/nccl_communicator.h"

#include <vector>

#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"
#include "runtime/cuda/device_query.h"

namespace tandem {
namespace {

TEST(NcclCommunicatorTest, OneRankCollectivesKeepTheData) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  gloo::rendezvous::HashStore store;
  auto comm = NcclCommunicator::Connect(store, "test", 0, 1);
  ASSERT_TRUE(comm.ok()) << comm.status();
  const int n = 1 << 20;
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = 0.25f * (i % 101);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), n * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_TRUE((*comm)->AllReduceSum(device, n, stream).ok());
  ASSERT_TRUE((*comm)->ReduceScatterSum(device, n, stream).ok());
  ASSERT_TRUE((*comm)->AllGather(device, n, stream).ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> back(n);
  ASSERT_EQ(cudaMemcpy(back.data(), device, n * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  cudaFree(device);
  cudaStreamDestroy(stream);
}

TEST(NcclCommunicatorTest, RefusesABadRank) {
  gloo::rendezvous::HashStore store;
  EXPECT_EQ(NcclCommunicator::Connect(store, "x", 1, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
