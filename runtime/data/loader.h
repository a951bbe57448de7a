// Batches in training order: each epoch visits every sample once, in a seeded
// random order (or in order without shuffling), the last batch possibly smaller
// (PyTorch's DataLoader with drop_last=False). The next batch is prepared on a
// background thread while the caller trains on the current one. The position
// (epoch, offset) is checkpointed so a resumed job sees the same batches.
// Not thread-safe: one consumer.
#ifndef TANDEM_RUNTIME_DATA_LOADER_H_
#define TANDEM_RUNTIME_DATA_LOADER_H_

#include <future>
#include <memory>
#include <vector>

#include "runtime/core/thread_pool.h"
#include "runtime/data/dataset.h"

namespace tandem {

struct Batch {
  int64_t size = 0;
  // Where the batch starts: epoch, and position within that epoch's order.
  int64_t epoch = 0;
  int64_t offset = 0;
  DType input_dtype = DType::kF32;
  // size x sample elements (f32 or i32 bits), and size x targets_per_sample.
  std::vector<float> inputs;
  std::vector<int32_t> targets;
  void* input_data() { return inputs.data(); }
};

class BatchLoader {
 public:
  BatchLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed,
              bool prefetch = true);
  ~BatchLoader();

  // Continue from `offset` samples into `epoch` (a checkpoint's position).
  void Seek(int64_t epoch, int64_t offset);
  // The next batch; valid until the following call.
  const Batch& Next();
  int64_t batches_per_epoch() const { return (dataset_.size() + batch_size_ - 1) / batch_size_; }
  // Position of the batch Next() will return.
  int64_t epoch() const { return epoch_; }
  int64_t offset() const { return offset_; }

 private:
  void Fill(int64_t epoch, int64_t offset, Batch* batch);
  const std::vector<int64_t>& Order(int64_t epoch);
  void StartPrefetch();

  const Dataset& dataset_;
  const int64_t batch_size_;
  const bool shuffle_;
  const uint64_t seed_;
  int64_t epoch_ = 0, offset_ = 0;
  // Epoch orders in use: the current one and, near the end, the next.
  std::vector<std::pair<int64_t, std::vector<int64_t>>> orders_;
  Batch slots_[2];
  int current_ = 0;
  bool prefetched_ = false;
  // The prefetch in flight (a std::future, which ThreadSanitizer sees through,
  // unlike Debian's uninstrumented absl::Notification); invalid when none.
  std::future<void> ready_;
  std::unique_ptr<ThreadPool> worker_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DATA_LOADER_H_
