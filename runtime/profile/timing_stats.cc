#include "runtime/profile/timing_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem::profile {

double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(values.begin(), values.end());
  const double position = std::clamp(q, 0.0, 1.0) * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(position));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  const double fraction = position - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * fraction;
}

tandem::v1::TimingStats SummarizeTimings(const std::vector<double>& wall_seconds) {
  tandem::v1::TimingStats stats;
  if (wall_seconds.empty()) return stats;
  const double n = static_cast<double>(wall_seconds.size());
  double sum = 0;
  for (double v : wall_seconds) sum += v;
  const double mean = sum / n;
  double squares = 0;
  for (double v : wall_seconds) squares += (v - mean) * (v - mean);
  stats.set_samples(static_cast<int32_t>(wall_seconds.size()));
  stats.set_median_seconds(Quantile(wall_seconds, 0.5));
  stats.set_p10_seconds(Quantile(wall_seconds, 0.1));
  stats.set_p90_seconds(Quantile(wall_seconds, 0.9));
  stats.set_min_seconds(*std::min_element(wall_seconds.begin(), wall_seconds.end()));
  stats.set_max_seconds(*std::max_element(wall_seconds.begin(), wall_seconds.end()));
  stats.set_mean_seconds(mean);
  stats.set_stddev_seconds(wall_seconds.size() > 1 ? std::sqrt(squares / (n - 1)) : 0.0);
  return stats;
}

}  // namespace tandem::profile
