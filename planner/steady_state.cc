#include "planner/steady_state.h"

#include <algorithm>
#include <cmath>

namespace tandem::planner {

bool PeriodSettled(const std::vector<double>& starts) {
  const size_t n = starts.size();
  if (n < 3) return false;
  const double reported = starts[n - 1] - starts[n - 2];
  const double before = starts[n - 2] - starts[n - 3];
  return std::fabs(reported - before) <= 1e-9 * std::max(std::fabs(reported), 1e-12);
}

int64_t PeakInWindow(const std::vector<MemoryChange>& changes, int64_t base, double window_start,
                     double window_end,
                     google::protobuf::RepeatedPtrField<tandem::v1::MemorySample>* samples) {
  int64_t level = base;
  size_t i = 0;
  const size_t n = changes.size();
  while (i < n && changes[i].time_seconds <= window_start) level += changes[i++].delta_bytes;
  int64_t peak = level;
  auto sample = [&](double t) {
    if (samples == nullptr) return;
    tandem::v1::MemorySample* s = samples->Add();
    s->set_time_seconds(t - window_start);
    s->set_bytes(level);
  };
  sample(window_start);
  while (i < n && changes[i].time_seconds < window_end) {
    const double t = changes[i].time_seconds;
    while (i < n && changes[i].time_seconds == t) level += changes[i++].delta_bytes;
    peak = std::max(peak, level);
    sample(t);
  }
  return peak;
}

}  // namespace tandem::planner
