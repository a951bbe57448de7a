#include "runtime/data/loader.h"

#include <numeric>

#include "runtime/core/random.h"

namespace tandem {

BatchLoader::BatchLoader(const Dataset& dataset, int64_t batch_size, bool shuffle, uint64_t seed,
                         bool prefetch)
    : dataset_(dataset), batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  if (prefetch) worker_ = std::make_unique<ThreadPool>(1, "loader");
}

BatchLoader::~BatchLoader() {
  if (ready_.valid()) ready_.wait();
}

void BatchLoader::Seek(int64_t epoch, int64_t offset) {
  if (ready_.valid()) ready_.wait();
  ready_ = std::future<void>();
  prefetched_ = false;
  epoch_ = epoch;
  offset_ = offset;
  if (offset_ >= dataset_.size()) {
    ++epoch_;
    offset_ = 0;
  }
}

const std::vector<int64_t>& BatchLoader::Order(int64_t epoch) {
  for (auto& [e, order] : orders_) {
    if (e == epoch) return order;
  }
  if (orders_.size() >= 2) orders_.erase(orders_.begin());
  std::vector<int64_t> order;
  if (shuffle_) {
    order = Permutation(dataset_.size(), seed_, MixStream(0x5eed, static_cast<uint64_t>(epoch)));
  } else {
    order.resize(dataset_.size());
    std::iota(order.begin(), order.end(), 0);
  }
  orders_.emplace_back(epoch, std::move(order));
  return orders_.back().second;
}

void BatchLoader::Fill(int64_t epoch, int64_t offset, Batch* batch) {
  const std::vector<int64_t>& order = Order(epoch);
  const int64_t n = std::min(batch_size_, dataset_.size() - offset);
  const DataInfo& info = dataset_.info();
  batch->size = n;
  batch->epoch = epoch;
  batch->offset = offset;
  batch->input_dtype = info.input_dtype;
  batch->inputs.resize(n * info.sample_shape.elements());
  batch->targets.resize(n * info.targets_per_sample);
  dataset_.Fill(epoch, order.data() + offset, n, batch->inputs.data(), batch->targets.data());
}

void BatchLoader::StartPrefetch() {
  // Orders are computed on this thread, so the worker only reads them.
  const int64_t epoch = epoch_, offset = offset_;
  Order(epoch);
  Batch* slot = &slots_[1 - current_];
  auto done = std::make_shared<std::promise<void>>();
  ready_ = done->get_future();
  worker_->Schedule([this, epoch, offset, slot, done] {
    Fill(epoch, offset, slot);
    done->set_value();
  });
  prefetched_ = true;
}

const Batch& BatchLoader::Next() {
  if (worker_ == nullptr) {
    Fill(epoch_, offset_, &slots_[current_]);
  } else {
    if (!prefetched_) StartPrefetch();
    ready_.wait();
    current_ = 1 - current_;
  }
  const Batch& batch = slots_[current_];
  offset_ += batch.size;
  if (offset_ >= dataset_.size()) {
    ++epoch_;
    offset_ = 0;
  }
  if (worker_ != nullptr) StartPrefetch();
  return batch;
}

}  // namespace tandem
