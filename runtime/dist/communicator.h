// Collectives between the ranks of a distributed job, on host memory, through
// Gloo (libgloo-dev): its TCP transport and its rendezvous Store. A
// Communicator is one rank's full mesh of connections to the others; every rank
// must call the same collectives in the same order. Gloo's errors (a peer gone,
// a timeout) come back as statuses, never as exceptions. Device tensors go
// through NCCL (nccl_communicator.h); this class never sees device memory.
//
// Not thread-safe: one thread at a time issues collectives (the gradient
// reducer's thread during backward, the trainer's after it).
#ifndef TANDEM_RUNTIME_DIST_COMMUNICATOR_H_
#define TANDEM_RUNTIME_DIST_COMMUNICATOR_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gloo {
class Algorithm;
class Context;
namespace rendezvous {
class Store;
}  // namespace rendezvous
}  // namespace gloo

namespace tandem {

struct CommunicatorOptions {
  // The address this rank accepts its peers' connections on.
  std::string hostname = "127.0.0.1";
  // Bounds every collective: a peer that does not answer within it fails the
  // call with DEADLINE_EXCEEDED or UNAVAILABLE.
  absl::Duration timeout = absl::Seconds(30);
  // Bounds the rendezvous (every rank joining); zero = `timeout`.
  absl::Duration rendezvous_timeout = absl::ZeroDuration();
};

// What one rank's collectives moved, and how long it spent in them.
struct CollectiveStats {
  int64_t calls = 0;
  // Bytes each rank sends, counted as the bandwidth-optimal algorithms do
  // (NCCL's "bus bytes"): an all-reduce of n bytes 2(N-1)/N n, a
  // reduce-scatter or an all-gather of n bytes in all (N-1)/N n, a broadcast
  // n. So a partitioned step (reduce-scatter + all-gather) counts what a
  // replicated one (all-reduce) does.
  int64_t bytes = 0;
  double seconds = 0;
};

class Communicator {
 public:
  // Joins `size` ranks as `rank` through `store` (every rank uses the same
  // store and the same `prefix`, which keeps one job's keys from another's).
  static absl::StatusOr<std::unique_ptr<Communicator>> Connect(gloo::rendezvous::Store& store,
                                                               const std::string& prefix, int rank,
                                                               int size,
                                                               const CommunicatorOptions& options);
  ~Communicator();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // data[i] = sum over ranks of data[i], on every rank.
  absl::Status AllReduceSum(float* data, int64_t n);
  absl::Status AllReduceSum(double* data, int64_t n);
  // `data` holds sum(counts) floats on every rank, split into consecutive
  // slices of counts[0], counts[1], ... On return rank r's slice holds the sum
  // over ranks of that slice; the rest of `data` is scratch. Every count must be
  // positive (INVALID_ARGUMENT otherwise).
  absl::Status ReduceScatterSum(float* data, const std::vector<int64_t>& counts);
  // The inverse: rank r's slice of `data` (laid out as above) to every rank.
  // The 16-bit form moves bf16 weights (ZeRO's gathered working copies).
  absl::Status AllGather(float* data, const std::vector<int64_t>& counts);
  absl::Status AllGather(uint16_t* data, const std::vector<int64_t>& counts);
  // data from rank `root` to every rank.
  absl::Status Broadcast(float* data, int64_t n, int root);
  absl::Status Broadcast(double* data, int64_t n, int root);
  absl::Status Barrier();

  const CollectiveStats& stats() const { return stats_; }

 private:
  Communicator(std::shared_ptr<gloo::Context> context, int rank, int size, absl::Duration timeout);
  // Runs `op` (which may throw Gloo's exceptions), turning them into a status
  // naming `what`, and counts `bytes` and the time taken.
  // (N-1)/N of `bytes`: what a bandwidth-optimal collective sends per rank.
  int64_t BusBytes(int64_t bytes) const;
  template <typename T>
  absl::Status AllReduceOf(T* data, int64_t n);
  template <typename T>
  absl::Status BroadcastOf(T* data, int64_t n, int root);
  template <typename T>
  absl::Status AllGatherOf(T* data, const std::vector<int64_t>& counts);
  template <typename Op>
  absl::Status Run(const char* what, int64_t bytes, Op op);

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int size_;
  const absl::Duration timeout_;
  CollectiveStats stats_;
  // Gloo's reduce-scatter is an algorithm object bound to one buffer and its
  // split, set up once (it registers buffers with every peer) and run each step.
  struct ReduceScatterKey {
    float* data;
    std::vector<int64_t> counts;
    bool operator<(const ReduceScatterKey& o) const {
      return std::tie(data, counts) < std::tie(o.data, o.counts);
    }
  };
  std::map<ReduceScatterKey, std::unique_ptr<gloo::Algorithm>> reduce_scatters_;
  // An all-gather's own slice (Gloo's input and output may not overlap).
  std::vector<char> gather_scratch_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_COMMUNICATOR_H_
