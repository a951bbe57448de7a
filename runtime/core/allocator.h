// Device memory with byte accounting by category and a hard budget.
//
// Every byte Tandem allocates on any device goes through an Allocator and is
// counted under one MemoryCategory, so the profiler can report measured bytes per
// layer, the daemon can export memory by category, and a plan's budget is
// enforced where memory is actually taken: an allocation that would exceed the
// budget fails with RESOURCE_EXHAUSTED and the accounting in its message, never
// with a crash. AccountingAllocator holds the accounting; subclasses (host, the
// emulated accelerator's arena, the CUDA caching allocator) only provide raw
// memory. All methods are thread-safe.
#ifndef TANDEM_RUNTIME_CORE_ALLOCATOR_H_
#define TANDEM_RUNTIME_CORE_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "runtime/core/mutex.h"

namespace tandem {

enum class MemoryCategory : uint8_t {
  kParameters = 0,
  kGradients = 1,
  kOptimizerState = 2,
  kActivations = 3,
  kWorkspace = 4,
};
constexpr int kMemoryCategoryCount = 5;

// "parameters", "gradients", "optimizer_state", "activations", "workspace".
const char* MemoryCategoryName(MemoryCategory category);

struct MemoryStats {
  std::array<int64_t, kMemoryCategoryCount> in_use_bytes{};
  std::array<int64_t, kMemoryCategoryCount> peak_bytes{};
  int64_t total_in_use_bytes = 0;
  // Peak of the total since construction or the last ResetPeak().
  int64_t peak_total_bytes = 0;
  // 0 = unlimited.
  int64_t budget_bytes = 0;
  int64_t allocations = 0;
  // Allocations refused for the budget or by the device.
  int64_t refusals = 0;

  int64_t in_use(MemoryCategory c) const { return in_use_bytes[static_cast<int>(c)]; }
};

// Alignment of every allocation, in bytes: a cache line, and an AVX-512 vector.
constexpr int64_t kAllocationAlignment = 64;

class Allocator {
 public:
  virtual ~Allocator() = default;

  // `bytes` of memory for `category`, aligned to kAllocationAlignment. Zero bytes
  // gives a null pointer. RESOURCE_EXHAUSTED when the budget or the device refuses.
  virtual absl::StatusOr<void*> Allocate(int64_t bytes, MemoryCategory category) = 0;
  // Returns memory from Allocate with the same size and category.
  virtual void Free(void* ptr, int64_t bytes, MemoryCategory category) = 0;

  virtual MemoryStats stats() const = 0;
  // Starts a new peak measurement from the current usage.
  virtual void ResetPeak() = 0;
  // 0 = unlimited. Lowering it below current usage refuses new allocations only.
  virtual void set_budget_bytes(int64_t bytes) = 0;
  // "cpu", "emulated:0", "cuda:0".
  virtual const std::string& device_id() const = 0;
};

// The accounting and budget shared by every device's allocator.
class AccountingAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes, MemoryCategory category) final;
  void Free(void* ptr, int64_t bytes, MemoryCategory category) final;
  MemoryStats stats() const final;
  void ResetPeak() final;
  void set_budget_bytes(int64_t bytes) final;
  const std::string& device_id() const final { return device_id_; }

 protected:
  AccountingAllocator(std::string device_id, int64_t budget_bytes);
  // Raw memory from the device; null when it has none.
  virtual void* RawAllocate(int64_t bytes) = 0;
  virtual void RawFree(void* ptr, int64_t bytes) = 0;

 private:
  const std::string device_id_;
  mutable Mutex mu_;
  MemoryStats stats_ ABSL_GUARDED_BY(mu_);
};

// Host memory from the C heap, 64-byte aligned.
class HostAllocator final : public AccountingAllocator {
 public:
  explicit HostAllocator(int64_t budget_bytes = 0, std::string device_id = "cpu");

 protected:
  void* RawAllocate(int64_t bytes) override;
  void RawFree(void* ptr, int64_t bytes) override;
};

// The process-wide host allocator (unlimited budget); jobs that need a budget
// make their own HostAllocator.
Allocator* DefaultHostAllocator();

// The machine's physical memory in bytes (not a container's limit).
int64_t PhysicalMemoryBytes();

// Owns one allocation; returns it on destruction. Move-only.
class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Allocate(Allocator* allocator, int64_t bytes,
                                         MemoryCategory category);
  ~Buffer() { Reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  float* f32() const { return static_cast<float*>(data_); }
  uint16_t* bf16() const { return static_cast<uint16_t*>(data_); }
  int64_t bytes() const { return bytes_; }
  MemoryCategory category() const { return category_; }
  Allocator* allocator() const { return allocator_; }
  bool empty() const { return data_ == nullptr; }
  // Frees now.
  void Reset();

 private:
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  MemoryCategory category_ = MemoryCategory::kWorkspace;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_ALLOCATOR_H_
