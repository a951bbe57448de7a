#include "runtime/emulated/emulated_accelerator.h"

#include <sys/mman.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/core/clock.h"
#include "runtime/optim/kernels.h"

namespace tandem {
namespace {

constexpr int64_t kAlign = kAllocationAlignment;

int64_t RoundUp(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ArenaAllocator::ArenaAllocator(std::string device_id, int64_t region_bytes, int64_t budget_bytes)
    : AccountingAllocator(std::move(device_id), budget_bytes),
      region_bytes_(RoundUp(region_bytes)) {
  // Reserved, not committed: pages appear as they are touched.
  void* p = mmap(nullptr, region_bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p != MAP_FAILED) {
    base_ = static_cast<char*>(p);
    MutexLock lock(&mu_);
    free_by_offset_.emplace(0, region_bytes_);
    free_by_size_.emplace(region_bytes_, 0);
  }
}

ArenaAllocator::~ArenaAllocator() {
  if (base_ != nullptr) munmap(base_, region_bytes_);
}

bool ArenaAllocator::Contains(const void* ptr, int64_t bytes) const {
  const char* p = static_cast<const char*>(ptr);
  return base_ != nullptr && p >= base_ && p + bytes <= base_ + region_bytes_;
}

void* ArenaAllocator::RawAllocate(int64_t bytes) {
  const int64_t size = RoundUp(bytes);
  MutexLock lock(&mu_);
  auto fit = free_by_size_.lower_bound(size);
  if (fit == free_by_size_.end()) return nullptr;
  const int64_t block_size = fit->first, offset = fit->second;
  free_by_size_.erase(fit);
  free_by_offset_.erase(offset);
  if (block_size > size) {
    free_by_offset_.emplace(offset + size, block_size - size);
    free_by_size_.emplace(block_size - size, offset + size);
  }
  return base_ + offset;
}

void ArenaAllocator::RawFree(void* ptr, int64_t bytes) {
  int64_t offset = static_cast<char*>(ptr) - base_;
  int64_t size = RoundUp(bytes);
  MutexLock lock(&mu_);
  auto erase_free = [&](std::map<int64_t, int64_t>::iterator it) {
    auto range = free_by_size_.equal_range(it->second);
    for (auto s = range.first; s != range.second; ++s) {
      if (s->second == it->first) {
        free_by_size_.erase(s);
        break;
      }
    }
    return free_by_offset_.erase(it);
  };
  // Coalesce with the following and the preceding free blocks.
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + size) {
    size += next->second;
    erase_free(next);
  }
  auto prev = free_by_offset_.lower_bound(offset);
  if (prev != free_by_offset_.begin()) {
    --prev;
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  free_by_offset_.emplace(offset, size);
  free_by_size_.emplace(size, offset);
}

EmulatedAccelerator::EmulatedAccelerator(EmulatedOptions options, int ordinal)
    : options_(options),
      id_(absl::StrCat("emulated:", ordinal)),
      // Headroom over the capacity absorbs fragmentation; the budget is the capacity.
      arena_(id_, options.capacity_bytes + options.capacity_bytes / 4 + (int64_t{64} << 20),
             options.capacity_bytes),
      staging_(/*budget_bytes=*/0, "cpu:staging") {}

LayerContext EmulatedAccelerator::ComputeContext() {
  LayerContext ctx;
  ctx.device = DeviceKind::kEmulated;
  return ctx;
}

absl::Status EmulatedAccelerator::Copy(std::mutex& engine, void* dst, const void* src,
                                       int64_t bytes, double cap, double latency) {
  std::unique_lock<std::mutex> busy(engine, std::defer_lock);
  if (cap > 0 || latency > 0) busy.lock();
  const double start = WallSeconds();
  std::memcpy(dst, src, bytes);
  double target = latency;
  if (cap > 0) target += static_cast<double>(bytes) / cap;
  const double remaining = target - (WallSeconds() - start);
  if (remaining > 0) absl::SleepFor(absl::Seconds(remaining));
  return absl::OkStatus();
}

bool EmulatedAccelerator::HasPeerLink(Accelerator& from) {
  // Every kEmulated accelerator is an EmulatedAccelerator (final).
  return &from != this && from.kind() == DeviceKind::kEmulated && options_.peer_link &&
         static_cast<EmulatedAccelerator&>(from).options_.peer_link;
}

absl::Status EmulatedAccelerator::CopyFromPeer(void* dst, Accelerator& from, const void* src,
                                               int64_t bytes) {
  if (!HasPeerLink(from)) {
    return absl::FailedPreconditionError(absl::StrCat(id_, " has no peer link to ", from.id()));
  }
  auto& peer = static_cast<EmulatedAccelerator&>(from);
  if (!arena_.Contains(dst, bytes) || !peer.arena_.Contains(src, bytes)) {
    return absl::InternalError(
        absl::StrCat(id_, ": peer copy from ", from.id(), " outside the two devices' memory"));
  }
  bytes_from_peers_ += bytes;
  return Copy(peer_engine_, dst, src, bytes, options_.peer_bytes_per_second,
              options_.peer_latency_seconds);
}

absl::Status EmulatedAccelerator::CopyToDevice(void* dst, const void* src, int64_t bytes) {
  if (!arena_.Contains(dst, bytes)) {
    return absl::InternalError(absl::StrCat(id_, ": copy to a pointer outside device memory"));
  }
  bytes_to_device_ += bytes;
  return Copy(to_device_engine_, dst, src, bytes, options_.link_bytes_per_second,
              options_.link_latency_seconds);
}

absl::Status EmulatedAccelerator::CopyToHost(void* dst, const void* src, int64_t bytes) {
  if (!arena_.Contains(src, bytes)) {
    return absl::InternalError(absl::StrCat(id_, ": copy from a pointer outside device memory"));
  }
  bytes_to_host_ += bytes;
  return Copy(to_host_engine_, dst, src, bytes, options_.link_bytes_per_second,
              options_.link_latency_seconds);
}

absl::Status EmulatedAccelerator::CopyOnDevice(void* dst, const void* src, int64_t bytes) {
  if (!arena_.Contains(dst, bytes) || !arena_.Contains(src, bytes)) {
    return absl::InternalError(absl::StrCat(id_, ": device copy outside device memory"));
  }
  std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status EmulatedAccelerator::Fill(float* dst, float value, int64_t n) {
  std::fill(dst, dst + n, value);
  return absl::OkStatus();
}

absl::Status EmulatedAccelerator::UpdateSlice(const StepConstants& step, float* params,
                                              const float* grads, float* const* states, int64_t n) {
  Optimizer::UpdateSlice(step, params, grads, states, n);
  return absl::OkStatus();
}

absl::StatusOr<double> EmulatedAccelerator::SumOfSquares(const float* x, int64_t n) {
  return optim::SumOfSquares(x, n);
}

}  // namespace tandem
