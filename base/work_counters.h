// How often the expensive steps of a job's life have run in this process:
// resolving a job spec, building a model, solving a plan. A job should be
// resolved and planned once, at submission, and its model built once there and
// once per run attempt; tests read these counts to hold the daemon to that.
// Relaxed atomics: a count, not a synchronisation point. Thread-safe.
#ifndef TANDEM_BASE_WORK_COUNTERS_H_
#define TANDEM_BASE_WORK_COUNTERS_H_

#include <atomic>
#include <cstdint>

namespace tandem::work_counters {

inline std::atomic<int64_t> spec_resolutions{0};
inline std::atomic<int64_t> model_builds{0};
inline std::atomic<int64_t> plan_solves{0};

inline void Count(std::atomic<int64_t>& counter) {
  counter.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace tandem::work_counters

#endif  // TANDEM_BASE_WORK_COUNTERS_H_
