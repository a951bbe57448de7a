#include "runtime/exec/backpressure_allocator.h"

#include <chrono>
#include <utility>

#include "runtime/exec/span_engine.h"

namespace tandem {

BackpressureAllocator::BackpressureAllocator(Allocator* base, std::function<int64_t()> active_spans)
    : base_(base), active_spans_(std::move(active_spans)) {}

absl::StatusOr<void*> BackpressureAllocator::Allocate(int64_t bytes, MemoryCategory category) {
  bool waited = false;
  while (true) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen = frees_;
    }
    absl::StatusOr<void*> p = base_->Allocate(bytes, category);
    if (p.ok() || p.status().code() != absl::StatusCode::kResourceExhausted) return p;
    std::unique_lock<std::mutex> lock(mu_);
    if (frees_ != seen) continue;  // freed meanwhile: try again
    // Others that may still free memory: active spans, less the caller's own
    // and those blocked here.
    const int64_t self = SpanEngine::OnWorkerThread() ? 1 : 0;
    if (active_spans_() - self - waiters_ <= 0) return p.status();
    if (!waited) ++waits_;
    waited = true;
    ++waiters_;
    // A bounded wait: the active count changes without a free (a span that
    // frees nothing completes), so look again now and then.
    freed_.wait_for(lock, std::chrono::milliseconds(5), [&] { return frees_ != seen; });
    --waiters_;
  }
}

void BackpressureAllocator::Free(void* ptr, int64_t bytes, MemoryCategory category) {
  base_->Free(ptr, bytes, category);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++frees_;
  }
  freed_.notify_all();
}

int64_t BackpressureAllocator::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

}  // namespace tandem
