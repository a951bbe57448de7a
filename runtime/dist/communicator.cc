#include "runtime/dist/communicator.h"

#include <chrono>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "runtime/core/clock.h"

namespace tandem {
namespace {

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// Gloo reports a peer that stopped answering as an IoException whose text says
// "Timed out"; anything else from the transport means the peer is gone.
absl::Status FromGloo(const char* what, const std::exception& e) {
  const std::string text = e.what();
  const std::string message = absl::StrCat(what, ": ", text);
  if (text.find("imed out") != std::string::npos || text.find("imeout") != std::string::npos) {
    return absl::DeadlineExceededError(message);
  }
  if (dynamic_cast<const gloo::IoException*>(&e) != nullptr) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace

Communicator::Communicator(std::shared_ptr<gloo::Context> context, int rank, int size,
                           absl::Duration timeout)
    : context_(std::move(context)), rank_(rank), size_(size), timeout_(timeout) {}

Communicator::~Communicator() = default;

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Connect(
    gloo::rendezvous::Store& store, const std::string& prefix, int rank, int size,
    const CommunicatorOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size, " ranks"));
  }
  try {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(Millis(options.rendezvous_timeout > absl::ZeroDuration()
                                   ? options.rendezvous_timeout
                                   : options.timeout));
    gloo::rendezvous::PrefixStore prefixed(prefix, store);
    context->connectFullMesh(prefixed, device);
    context->setTimeout(Millis(options.timeout));
    return std::unique_ptr<Communicator>(
        new Communicator(std::move(context), rank, size, options.timeout));
  } catch (const std::exception& e) {
    return FromGloo(absl::StrCat("rendezvous of rank ", rank, " of ", size).c_str(), e);
  }
}

int64_t Communicator::BusBytes(int64_t bytes) const { return bytes * (size_ - 1) / size_; }

template <typename Op>
absl::Status Communicator::Run(const char* what, int64_t bytes, Op op) {
  const double start = WallSeconds();
  try {
    op();
  } catch (const std::exception& e) {
    return FromGloo(what, e);
  }
  stats_.calls += 1;
  stats_.bytes += bytes;
  stats_.seconds += WallSeconds() - start;
  return absl::OkStatus();
}

template <typename T>
absl::Status Communicator::AllReduceOf(T* data, int64_t n) {
  if (size_ == 1 || n == 0) return absl::OkStatus();
  return Run("all-reduce", BusBytes(2 * n * static_cast<int64_t>(sizeof(T))), [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(n));
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setTimeout(Millis(timeout_));
    gloo::allreduce(opts);
  });
}

absl::Status Communicator::AllReduceSum(float* data, int64_t n) { return AllReduceOf(data, n); }

absl::Status Communicator::AllReduceSum(double* data, int64_t n) { return AllReduceOf(data, n); }

absl::Status Communicator::ReduceScatterSum(float* data, const std::vector<int64_t>& counts) {
  if (static_cast<int>(counts.size()) != size_) {
    return absl::InvalidArgumentError("reduce-scatter: one count per rank");
  }
  int64_t total = 0, offset = 0;
  for (int r = 0; r < size_; ++r) {
    // Gloo's halving-doubling hangs on an empty slice; every caller checks the
    // same counts, so every rank refuses together.
    if (counts[r] <= 0 && size_ > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("reduce-scatter: rank ", r, "'s slice is empty"));
    }
    if (r == rank_) offset = total;
    total += counts[r];
  }
  if (size_ == 1 || total == 0) return absl::OkStatus();
  if (total > INT32_MAX) return absl::InvalidArgumentError("reduce-scatter: 2^31 floats or more");
  auto& algorithm = reduce_scatters_[ReduceScatterKey{data, counts}];
  return Run("reduce-scatter", BusBytes(total * 4), [&] {
    if (algorithm == nullptr) {
      std::vector<int> recv(counts.begin(), counts.end());
      algorithm = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
          context_, std::vector<float*>{data}, static_cast<int>(total), recv);
    }
    algorithm->run();
    // Gloo leaves this rank's reduced slice at the start of the buffer.
    if (offset != 0 && counts[rank_] > 0) {
      std::memmove(data + offset, data, counts[rank_] * sizeof(float));
    }
  });
}

template <typename T>
absl::Status Communicator::AllGatherOf(T* data, const std::vector<int64_t>& counts) {
  if (static_cast<int>(counts.size()) != size_) {
    return absl::InvalidArgumentError("all-gather: one count per rank");
  }
  int64_t total = 0, offset = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) offset = total;
    total += counts[r];
  }
  if (size_ == 1 || total == 0) return absl::OkStatus();
  // Gloo's input and output may not overlap.
  const auto* own = reinterpret_cast<const char*>(data + offset);
  gather_scratch_.assign(own, own + counts[rank_] * sizeof(T));
  return Run("all-gather", BusBytes(total * static_cast<int64_t>(sizeof(T))), [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(reinterpret_cast<T*>(gather_scratch_.data()), static_cast<size_t>(counts[rank_]));
    opts.setOutput(data, std::vector<size_t>(counts.begin(), counts.end()));
    opts.setTimeout(Millis(timeout_));
    gloo::allgatherv(opts);
  });
}

absl::Status Communicator::AllGather(float* data, const std::vector<int64_t>& counts) {
  return AllGatherOf(data, counts);
}

absl::Status Communicator::AllGather(uint16_t* data, const std::vector<int64_t>& counts) {
  return AllGatherOf(data, counts);
}

template <typename T>
absl::Status Communicator::BroadcastOf(T* data, int64_t n, int root) {
  if (root < 0 || root >= size_) return absl::InvalidArgumentError("broadcast: no such root");
  if (size_ == 1 || n == 0) return absl::OkStatus();
  return Run("broadcast", n * static_cast<int64_t>(sizeof(T)), [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(n));
    opts.setRoot(root);
    opts.setTimeout(Millis(timeout_));
    gloo::broadcast(opts);
  });
}

absl::Status Communicator::Broadcast(float* data, int64_t n, int root) {
  return BroadcastOf(data, n, root);
}

absl::Status Communicator::Broadcast(double* data, int64_t n, int root) {
  return BroadcastOf(data, n, root);
}

absl::Status Communicator::Barrier() {
  if (size_ == 1) return absl::OkStatus();
  return Run("barrier", 0, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(Millis(timeout_));
    gloo::barrier(opts);
  });
}

}  // namespace tandem
