// How a data-parallel rank's plan executor sums gradients over the ranks: the
// work of the step program's ALL_REDUCE operations (schedule/lower.h, DATA-
// PARALLEL RANKS). Each bucket is summed where its updates read it: host
// gradients in host memory, accelerator gradients in the accelerator's.
// runtime/dist implements it over Gloo (host tensors) and NCCL or host staging
// (device tensors).
//
// Called from one thread (the executor's NETWORK worker), in the same order on
// every rank.
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
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_GRADIENT_COLLECTIVE_H_
