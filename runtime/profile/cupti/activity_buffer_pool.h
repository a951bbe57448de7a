// The bounded memory CUPTI writes activity records into: a fixed number of
// equally sized buffers, allocated once. CUPTI asks for a buffer whenever it
// needs one and hands it back full (or flushed); when every buffer is out,
// Acquire() returns null, the tracer hands CUPTI no buffer, and CUPTI drops
// records (counted, and reported in the profile) instead of the tracer
// allocating more. Thread-safe: CUPTI calls from its own threads.
//
// Built with or without CUDA: it knows nothing of CUPTI but its alignment.
#ifndef TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_BUFFER_POOL_H_
#define TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tandem::profile {

class ActivityBufferPool {
 public:
  // CUPTI wants activity buffers aligned to 8 bytes; a cache line is more.
  static constexpr size_t kAlignment = 64;

  ActivityBufferPool(int buffers, size_t buffer_bytes);
  ~ActivityBufferPool();
  ActivityBufferPool(const ActivityBufferPool&) = delete;
  ActivityBufferPool& operator=(const ActivityBufferPool&) = delete;

  // A free buffer of buffer_bytes(), or null (counted) when all are out.
  uint8_t* Acquire();
  // Returns a buffer from Acquire; anything else is ignored.
  void Release(uint8_t* buffer);

  size_t buffer_bytes() const { return buffer_bytes_; }
  int capacity() const { return static_cast<int>(all_.size()); }
  int in_use() const;
  // Acquire calls answered with null.
  int64_t refusals() const;

 private:
  const size_t buffer_bytes_;
  std::vector<uint8_t*> all_;
  mutable absl::Mutex mu_;
  std::vector<uint8_t*> free_ ABSL_GUARDED_BY(mu_);
  int64_t refusals_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_CUPTI_ACTIVITY_BUFFER_POOL_H_
