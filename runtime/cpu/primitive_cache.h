// Caches of oneDNN primitives, per layer keyed by batch size (or by shape, the
// matmul primitives): creating a primitive
// costs far more than running a small one, and a layer sees only a few batch
// sizes (training, the last partial batch, evaluation). Thread-safe; entries live
// as long as the cache.
#ifndef TANDEM_RUNTIME_CPU_PRIMITIVE_CACHE_H_
#define TANDEM_RUNTIME_CPU_PRIMITIVE_CACHE_H_

#include <cstdint>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "runtime/core/mutex.h"
#include "runtime/cpu/onednn.h"

namespace tandem::cpu {

template <typename T, typename Key = int64_t>
class PrimitiveCache {
 public:
  // The entry for `key`, built by `make()` on first use.
  template <typename Make>
  const T& Get(const Key& key, Make make) const {
    {
      ReaderMutexLock lock(&mu_);
      auto it = entries_.find(key);
      if (it != entries_.end()) return *it->second;
    }
    std::unique_ptr<T> entry;
    {
      MutexLock creating(&PrimitiveCreationMutex());
      entry = std::make_unique<T>(make());
    }
    MutexLock lock(&mu_);
    auto [it, inserted] = entries_.try_emplace(key, std::move(entry));
    return *it->second;
  }

 private:
  mutable Mutex mu_;
  mutable absl::flat_hash_map<Key, std::unique_ptr<T>> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::cpu

#endif  // TANDEM_RUNTIME_CPU_PRIMITIVE_CACHE_H_
