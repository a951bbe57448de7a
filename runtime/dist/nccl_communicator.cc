#include "runtime/dist/nccl_communicator.h"

#include <cstring>
#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

absl::Status FromNccl(const char* what, ncclResult_t r) {
  if (r == ncclSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(what, ": NCCL ", ncclGetErrorString(r));
  // A remote or system error is a peer or link gone: retriable like Gloo's.
  if (r == ncclRemoteError || r == ncclSystemError) return absl::UnavailableError(message);
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) {
    return absl::InvalidArgumentError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    gloo::rendezvous::Store& store, const std::string& prefix, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size, " ranks"));
  }
  ncclUniqueId id;
  const std::string key = prefix + "/nccl_unique_id";
  try {
    if (rank == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
        return FromNccl("ncclGetUniqueId", r);
      }
      store.set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    } else {
      store.wait({key});
      const std::vector<char> bytes = store.get(key);
      if (bytes.size() != sizeof(id.internal)) {
        return absl::InternalError("the rendezvous holds an NCCL id of the wrong size");
      }
      std::memcpy(id.internal, bytes.data(), bytes.size());
    }
  } catch (const std::exception& e) {
    return absl::DeadlineExceededError(
        absl::StrCat("NCCL rendezvous of rank ", rank, " of ", size, ": ", e.what()));
  }
  ncclComm_t comm = nullptr;
  if (ncclResult_t r = ncclCommInitRank(&comm, size, id, rank); r != ncclSuccess) {
    return FromNccl("ncclCommInitRank", r);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(comm, rank, size));
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

absl::Status NcclCommunicator::AllReduceSum(float* data, int64_t n, cudaStream_t stream) {
  return FromNccl("all-reduce", ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat,
                                              ncclSum, comm_, stream));
}

absl::Status NcclCommunicator::AllReduceSumGroup(
    const std::vector<std::pair<float*, int64_t>>& ranges, cudaStream_t stream) {
  TANDEM_RETURN_IF_ERROR(FromNccl("group start", ncclGroupStart()));
  absl::Status first;
  for (const auto& [data, n] : ranges) {
    absl::Status s = AllReduceSum(data, n, stream);
    if (first.ok()) first = s;
  }
  // The group ends whatever failed inside it, so that NCCL's state stays whole.
  const absl::Status end = FromNccl("group end", ncclGroupEnd());
  return first.ok() ? end : first;
}

absl::Status NcclCommunicator::ReduceScatterSum(float* data, int64_t count, cudaStream_t stream) {
  return FromNccl("reduce-scatter",
                  ncclReduceScatter(data, data + rank_ * count, static_cast<size_t>(count),
                                    ncclFloat, ncclSum, comm_, stream));
}

absl::Status NcclCommunicator::AllGather(float* data, int64_t count, cudaStream_t stream) {
  return FromNccl("all-gather",
                  ncclAllGather(data + rank_ * count, data, static_cast<size_t>(count), ncclFloat,
                                comm_, stream));
}

}  // namespace tandem
