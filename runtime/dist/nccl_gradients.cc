#include "runtime/dist/nccl_gradients.h"

#include <utility>
#include <vector>

#include "base/status_macros.h"
#include "runtime/cuda/context.h"

namespace tandem {
namespace {

// The communicator and the stream its sums run on, made on the first call
// (on the NETWORK worker's thread, with the rank's device current).
struct NcclBuckets {
  std::shared_ptr<NcclCommunicator> comm;
  int device = 0;
  cudaStream_t stream = nullptr;
  ~NcclBuckets() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }

  absl::Status Sum(const std::vector<GradientCollective::Range>& ranges) {
    TANDEM_RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
    if (stream == nullptr) {
      TANDEM_RETURN_IF_ERROR(cuda::CudaStatus(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"));
    }
    std::vector<std::pair<float*, int64_t>> spans;
    spans.reserve(ranges.size());
    for (const GradientCollective::Range& r : ranges) {
      if (r.n > 0) spans.emplace_back(r.data, r.n);
    }
    TANDEM_RETURN_IF_ERROR(comm->AllReduceSumGroup(spans, stream));
    return cuda::CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

}  // namespace

DeviceAllReduce NcclDeviceAllReduce(std::shared_ptr<NcclCommunicator> comm, int device_ordinal) {
  auto state = std::make_shared<NcclBuckets>();
  state->comm = std::move(comm);
  state->device = device_ordinal;
  return [state](Accelerator*, const std::vector<GradientCollective::Range>& ranges) {
    return state->Sum(ranges);
  };
}

}  // namespace tandem
