// How a data-parallel rank's plan executor sums gradients over the ranks: the
// work of the step program's ALL_REDUCE operations (schedule/lower.h, DATA-
// PARALLEL RANKS). Each bucket is summed where its updates read it: host
// gradients in host memory, accelerator gradients in the accelerator's.
// runtime/dist implements it over Gloo (host tensors) and NCCL or host staging
// (device tensors).
//
// Called from one thread at a time (the executor's NETWORK worker during a
// step; SyncStateToHost's gather of partitioned masters once the step has
// drained), in the same order on every rank.
#ifndef TANDEM_RUNTIME_EXEC_GRADIENT_COLLECTIVE_H_
#define TANDEM_RUNTIME_EXEC_GRADIENT_COLLECTIVE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/device/accelerator.h"

namespace tandem {

class GradientCollective {
 public:
  // A range of floats in one memory.
  struct Range {
    float* data = nullptr;
    int64_t n = 0;
  };

  virtual ~GradientCollective() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Sums `n` floats of host memory over the ranks, in place.
  virtual absl::Status AllReduceHost(float* data, int64_t n) = 0;
  // Sums each range of `accelerator`'s memory over the ranks, in place, as one
  // collective (the bucket's ranges are one message).
  virtual absl::Status AllReduceDevice(Accelerator* accelerator,
                                       const std::vector<Range>& ranges) = 0;
  // ZeRO-partitioned host state. `data` holds sum(pieces) floats of host
  // memory on every rank, cut into consecutive pieces of pieces[0],
  // pieces[1], ... floats. ReduceScatterHost: on return rank r's piece holds
  // the sum over the ranks of that piece (the rest of `data` is scratch).
  // AllGatherHost: every rank's own piece to every rank; the 16-bit form for
  // bf16 working copies, whose fp32 masters each rank keeps its pieces of.
  virtual absl::Status ReduceScatterHost(float* data, const std::vector<int64_t>& pieces) = 0;
  virtual absl::Status AllGatherHost(float* data, const std::vector<int64_t>& pieces) = 0;
  virtual absl::Status AllGatherHost(uint16_t* data, const std::vector<int64_t>& pieces) = 0;
  // Sums `n` doubles over the ranks, in place: the partitioned gradient
  // norm's squares. Called while no other collective of the step is in
  // flight (the GRADIENT_NORM follows every bucket's sum, and the gathers
  // follow the updates that wait for it).
  virtual absl::Status SumOverRanks(double* data, int64_t n) = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_GRADIENT_COLLECTIVE_H_
