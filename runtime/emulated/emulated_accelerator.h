// The emulated accelerator (docs/planning.md, "The emulated accelerator"): for tests and CPU-only
// development, never reported as a GPU. Its memory is a separate arena of host
// memory with a hard capacity; its compute runs the CPU kernels on that memory
// from the executor's compute thread; its link to the host is a copy engine
// with an optional bandwidth cap (each copy takes at least bytes / cap), and
// the node's other emulated accelerators reach its memory over a peer link
// with a cap of its own (a pipeline's stages, docs/pipeline.md).
//
// The arena is one mapping sub-allocated best-fit with coalescing, so device
// pointers are recognisably the device's (copies check them) and fragmentation
// behaves like a real device's. The hard capacity is enforced on accounted bytes
// (AccountingAllocator), with the arena sized above it so fragmentation alone
// never refuses an allocation the budget allows. Thread-safe.
#ifndef TANDEM_RUNTIME_EMULATED_EMULATED_ACCELERATOR_H_
#define TANDEM_RUNTIME_EMULATED_EMULATED_ACCELERATOR_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "runtime/core/mutex.h"
#include "runtime/device/accelerator.h"

namespace tandem {

// Sub-allocates one region; thread-safe.
class ArenaAllocator final : public AccountingAllocator {
 public:
  // A region of `region_bytes`, charged against `budget_bytes`.
  ArenaAllocator(std::string device_id, int64_t region_bytes, int64_t budget_bytes);
  ~ArenaAllocator() override;
  bool Contains(const void* ptr, int64_t bytes) const;
  int64_t region_bytes() const { return region_bytes_; }

 protected:
  void* RawAllocate(int64_t bytes) override;
  void RawFree(void* ptr, int64_t bytes) override;

 private:
  char* base_ = nullptr;
  const int64_t region_bytes_;
  Mutex mu_;
  // Free blocks by offset -> size, and by size for best fit.
  std::map<int64_t, int64_t> free_by_offset_ ABSL_GUARDED_BY(mu_);
  std::multimap<int64_t, int64_t> free_by_size_ ABSL_GUARDED_BY(mu_);
};

struct EmulatedOptions {
  // Hard capacity of device memory, in bytes.
  int64_t capacity_bytes = int64_t{1} << 30;
  // Copy-engine bandwidth cap, in bytes per second; 0 = as fast as memcpy.
  double link_bytes_per_second = 0;
  // Fixed cost of each copy, in seconds (a DMA setup).
  double link_latency_seconds = 0;
  // The peer link: copies from another emulated accelerator's memory into
  // this one's (CopyFromPeer), capped and delayed alike; false: none, and
  // such copies are staged through host memory by the caller.
  bool peer_link = true;
  double peer_bytes_per_second = 0;
  double peer_latency_seconds = 0;
};

class EmulatedAccelerator final : public Accelerator {
 public:
  explicit EmulatedAccelerator(EmulatedOptions options, int ordinal = 0);

  DeviceKind kind() const override { return DeviceKind::kEmulated; }
  const std::string& id() const override { return id_; }
  Allocator* allocator() override { return &arena_; }
  // The stand-in for CUDA's pinned staging memory: ordinary host memory, but
  // accounted per accelerator as pinned memory is.
  Allocator* host_staging_allocator() override { return &staging_; }
  LayerContext ComputeContext() override;
  absl::Status FinishCompute() override { return absl::OkStatus(); }
  absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) override;
  absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) override;
  // A memcpy within the arena; not throttled (the link is not used).
  absl::Status CopyOnDevice(void* dst, const void* src, int64_t bytes) override;
  // Another emulated accelerator, both with peer_link.
  bool HasPeerLink(Accelerator& from) override;
  // A memcpy from `from`'s arena into this one's, taking at least
  // peer_latency_seconds + bytes / peer_bytes_per_second.
  absl::Status CopyFromPeer(void* dst, Accelerator& from, const void* src, int64_t bytes) override;
  absl::Status Fill(float* dst, float value, int64_t n) override;
  absl::Status UpdateSlice(const StepConstants& step, float* params, const float* grads,
                           float* const* states, int64_t n) override;
  absl::StatusOr<double> SumOfSquares(const float* x, int64_t n) override;

  const EmulatedOptions& options() const { return options_; }
  // Bytes copied over the link so far, each way (tests: what a plan moves).
  int64_t bytes_to_device() const { return bytes_to_device_.load(); }
  int64_t bytes_to_host() const { return bytes_to_host_.load(); }
  // Bytes copied in from peers so far.
  int64_t bytes_from_peers() const { return bytes_from_peers_.load(); }

 private:
  // memcpy, then sleeps out the rest of latency + bytes / cap (cap 0: none).
  // A modelled link (a cap or a latency) is one copy engine per direction:
  // copies from several threads (a pipeline stage's, its activation and
  // host-update threads) queue on `engine` instead of each getting the cap.
  static absl::Status Copy(std::mutex& engine, void* dst, const void* src, int64_t bytes,
                           double cap, double latency);

  const EmulatedOptions options_;
  const std::string id_;
  ArenaAllocator arena_;
  HostAllocator staging_;
  std::atomic<int64_t> bytes_to_device_{0}, bytes_to_host_{0}, bytes_from_peers_{0};
  std::mutex to_device_engine_, to_host_engine_, peer_engine_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EMULATED_EMULATED_ACCELERATOR_H_
