#include "runtime/core/allocator.h"

#include <unistd.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tandem {

const char* MemoryCategoryName(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer_state";
    case MemoryCategory::kActivations:
      return "activations";
    case MemoryCategory::kWorkspace:
      return "workspace";
  }
  return "unknown";
}

AccountingAllocator::AccountingAllocator(std::string device_id, int64_t budget_bytes)
    : device_id_(std::move(device_id)) {
  stats_.budget_bytes = budget_bytes;
}

absl::StatusOr<void*> AccountingAllocator::Allocate(int64_t bytes, MemoryCategory category) {
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative allocation: ", bytes));
  if (bytes == 0) return nullptr;
  const int c = static_cast<int>(category);
  {
    MutexLock lock(&mu_);
    if (stats_.budget_bytes > 0 && stats_.total_in_use_bytes + bytes > stats_.budget_bytes) {
      ++stats_.refusals;
      std::string in_use;
      for (int i = 0; i < kMemoryCategoryCount; ++i) {
        absl::StrAppend(&in_use, i ? ", " : "", MemoryCategoryName(static_cast<MemoryCategory>(i)),
                        " ", FormatBytes(stats_.in_use_bytes[i], 1));
      }
      return absl::ResourceExhaustedError(absl::StrCat(
          device_id_, " memory budget exceeded: cannot allocate ", FormatBytes(bytes, 1), " of ",
          MemoryCategoryName(category), " with ", FormatBytes(stats_.total_in_use_bytes, 1), " of ",
          FormatBytes(stats_.budget_bytes, 1), " in use (", in_use, ")"));
    }
    // Reserve before the raw allocation so concurrent callers cannot overshoot.
    stats_.total_in_use_bytes += bytes;
    stats_.in_use_bytes[c] += bytes;
  }
  void* ptr = RawAllocate(bytes);
  MutexLock lock(&mu_);
  if (ptr == nullptr) {
    stats_.total_in_use_bytes -= bytes;
    stats_.in_use_bytes[c] -= bytes;
    ++stats_.refusals;
    return absl::ResourceExhaustedError(
        absl::StrCat(device_id_, " is out of memory: cannot allocate ", FormatBytes(bytes, 1),
                     " of ", MemoryCategoryName(category)));
  }
  ++stats_.allocations;
  stats_.peak_bytes[c] = std::max(stats_.peak_bytes[c], stats_.in_use_bytes[c]);
  stats_.peak_total_bytes = std::max(stats_.peak_total_bytes, stats_.total_in_use_bytes);
  return ptr;
}

void AccountingAllocator::Free(void* ptr, int64_t bytes, MemoryCategory category) {
  if (ptr == nullptr) return;
  RawFree(ptr, bytes);
  MutexLock lock(&mu_);
  stats_.total_in_use_bytes -= bytes;
  stats_.in_use_bytes[static_cast<int>(category)] -= bytes;
}

MemoryStats AccountingAllocator::stats() const {
  MutexLock lock(&mu_);
  return stats_;
}

void AccountingAllocator::ResetPeak() {
  MutexLock lock(&mu_);
  stats_.peak_total_bytes = stats_.total_in_use_bytes;
  stats_.peak_bytes = stats_.in_use_bytes;
}

void AccountingAllocator::set_budget_bytes(int64_t bytes) {
  MutexLock lock(&mu_);
  stats_.budget_bytes = bytes;
}

HostAllocator::HostAllocator(int64_t budget_bytes, std::string device_id)
    : AccountingAllocator(std::move(device_id), budget_bytes) {}

void* HostAllocator::RawAllocate(int64_t bytes) {
  const int64_t rounded =
      (bytes + kAllocationAlignment - 1) / kAllocationAlignment * kAllocationAlignment;
  return std::aligned_alloc(kAllocationAlignment, rounded);
}

void HostAllocator::RawFree(void* ptr, int64_t) { std::free(ptr); }

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

Allocator* DefaultHostAllocator() {
  static auto* allocator = new HostAllocator();
  return allocator;
}

absl::StatusOr<Buffer> Buffer::Allocate(Allocator* allocator, int64_t bytes,
                                        MemoryCategory category) {
  absl::StatusOr<void*> ptr = allocator->Allocate(bytes, category);
  if (!ptr.ok()) return ptr.status();
  Buffer buffer;
  buffer.allocator_ = allocator;
  buffer.data_ = *ptr;
  buffer.bytes_ = bytes;
  buffer.category_ = category;
  return buffer;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    allocator_ = other.allocator_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    category_ = other.category_;
    other.allocator_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::Reset() {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->Free(data_, bytes_, category_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace tandem
