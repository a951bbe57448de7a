// NCCL's sum of a CUDA rank's gradient buckets (plan_rank.h's DeviceAllReduce):
// a bucket's ranges of the rank's GPU memory are all-reduced as one NCCL group
// on a stream of their own, and the call returns when they are summed (the
// executor's NETWORK worker calls it once the bucket's backward has finished
// on the compute stream). Host buckets stay Gloo's. CUDA builds only; compiled,
// and not yet run on a GPU.
#ifndef TANDEM_RUNTIME_DIST_NCCL_GRADIENTS_H_
#define TANDEM_RUNTIME_DIST_NCCL_GRADIENTS_H_

#include <memory>

#include "runtime/dist/nccl_communicator.h"
#include "runtime/dist/plan_rank.h"

namespace tandem {

// `comm` joins the job's ranks on CUDA device `device_ordinal`, the rank's
// accelerator; every call makes that device current on the calling thread.
DeviceAllReduce NcclDeviceAllReduce(std::shared_ptr<NcclCommunicator> comm, int device_ordinal);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_NCCL_GRADIENTS_H_
