// Collectives on device memory through NCCL (in the CUDA toolkit), for ranks
// whose gradients live on their GPU (docs/distributed.md). Ranks meet as the
// host Communicator's do: rank 0 makes NCCL's unique id and puts it in the
// job's rendezvous Store, the others read it. Every call is enqueued on the
// caller's CUDA stream; errors (a peer gone, an NCCL failure) come back as
// statuses. CUDA builds only. A CUDA rank's gradient buckets go through it
// (nccl_gradients.h); that path has not run on a GPU, and no job reaches it
// yet (CUDA jobs with replicas > 1 are refused).
#ifndef TANDEM_RUNTIME_DIST_NCCL_COMMUNICATOR_H_
#define TANDEM_RUNTIME_DIST_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "cuda_runtime_api.h"
#include "gloo/rendezvous/store.h"
#include "nccl.h"

namespace tandem {

class NcclCommunicator {
 public:
  // Joins `size` ranks as `rank` on the current CUDA device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(gloo::rendezvous::Store& store,
                                                                   const std::string& prefix,
                                                                   int rank, int size);
  ~NcclCommunicator();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // In place: data[i] = sum over ranks (device memory, n floats), on `stream`.
  absl::Status AllReduceSum(float* data, int64_t n, cudaStream_t stream);
  // AllReduceSum of each (data, n) range, launched as one NCCL group.
  absl::Status AllReduceSumGroup(const std::vector<std::pair<float*, int64_t>>& ranges,
                                 cudaStream_t stream);
  // `data` holds size() * count floats; rank r's slice [r count, (r+1) count)
  // becomes the sum of that slice over the ranks (in place).
  absl::Status ReduceScatterSum(float* data, int64_t count, cudaStream_t stream);
  // Rank r's slice of `data` (size() * count floats) to every rank.
  absl::Status AllGather(float* data, int64_t count, cudaStream_t stream);

 private:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ncclComm_t comm_;
  const int rank_;
  const int size_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_NCCL_COMMUNICATOR_H_
