// Device memory for the plan executor's spans. The planner's simulator decides
// what fits from predicted timings; at run time a copy can finish later than
// predicted (a slower link, a busier host), so a span may find memory that the
// plan counted as freed still held by a copy in flight. Rather than failing the
// job, an allocation the budget refuses waits for memory to be freed while
// other spans are still active (queued or running on another resource, and not
// themselves waiting here), and fails with the allocator's RESOURCE_EXHAUSTED
// only when nothing else could free memory. The hard budget is never exceeded.
//
// Thread-safe: spans on every resource allocate and free through it.
#ifndef TANDEM_RUNTIME_EXEC_BACKPRESSURE_ALLOCATOR_H_
#define TANDEM_RUNTIME_EXEC_BACKPRESSURE_ALLOCATOR_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "runtime/core/allocator.h"

namespace tandem {

class BackpressureAllocator final : public Allocator {
 public:
  // `base` must outlive this. `active_spans` counts spans queued or running
  // (SpanEngine::active), the caller's own included when it runs in a span.
  BackpressureAllocator(Allocator* base, std::function<int64_t()> active_spans);

  absl::StatusOr<void*> Allocate(int64_t bytes, MemoryCategory category) override;
  void Free(void* ptr, int64_t bytes, MemoryCategory category) override;
  MemoryStats stats() const override { return base_->stats(); }
  void ResetPeak() override { base_->ResetPeak(); }
  void set_budget_bytes(int64_t bytes) override { base_->set_budget_bytes(bytes); }
  const std::string& device_id() const override { return base_->device_id(); }

  // Allocations that had to wait, since creation.
  int64_t waits() const;

 private:
  Allocator* const base_;
  const std::function<int64_t()> active_spans_;
  mutable std::mutex mu_;
  std::condition_variable freed_;
  // Frees so far, so a waiter sees a free that raced with its refusal.
  uint64_t frees_ = 0;
  int64_t waiters_ = 0;
  int64_t waits_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_EXEC_BACKPRESSURE_ALLOCATOR_H_
