#include "runtime/profile/cupti/activity_buffer_pool.h"

#include <algorithm>
#include <cstdlib>

namespace tandem::profile {

ActivityBufferPool::ActivityBufferPool(int buffers, size_t buffer_bytes)
    : buffer_bytes_((buffer_bytes + kAlignment - 1) / kAlignment * kAlignment) {
  for (int i = 0; i < buffers; ++i) {
    auto* b = static_cast<uint8_t*>(std::aligned_alloc(kAlignment, buffer_bytes_));
    if (b == nullptr) break;
    all_.push_back(b);
  }
  free_ = all_;
}

ActivityBufferPool::~ActivityBufferPool() {
  for (uint8_t* b : all_) std::free(b);
}

uint8_t* ActivityBufferPool::Acquire() {
  absl::MutexLock lock(&mu_);
  if (free_.empty()) {
    ++refusals_;
    return nullptr;
  }
  uint8_t* b = free_.back();
  free_.pop_back();
  return b;
}

void ActivityBufferPool::Release(uint8_t* buffer) {
  if (std::find(all_.begin(), all_.end(), buffer) == all_.end()) return;
  absl::MutexLock lock(&mu_);
  if (std::find(free_.begin(), free_.end(), buffer) == free_.end()) free_.push_back(buffer);
}

int ActivityBufferPool::in_use() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(all_.size() - free_.size());
}

int64_t ActivityBufferPool::refusals() const {
  absl::MutexLock lock(&mu_);
  return refusals_;
}

}  // namespace tandem::profile
