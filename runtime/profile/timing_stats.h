// Summary statistics of repeated timings: the median and spread the profiler
// reports for every phase (TimingStats in profile.proto). Percentiles
// interpolate linearly between order statistics (NumPy's default), so the
// median of an even count is the mean of the middle two. Stateless functions;
// thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_TIMING_STATS_H_
#define TANDEM_RUNTIME_PROFILE_TIMING_STATS_H_

#include <vector>

#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// The q-th quantile (q in [0, 1]) of `values`; NaN when empty.
double Quantile(std::vector<double> values, double q);
inline double Median(std::vector<double> values) { return Quantile(std::move(values), 0.5); }

// Samples, median, p10, p90, min, max, mean and standard deviation (n - 1 in
// the denominator; 0 for one sample) of `wall_seconds`. thread_cpu_seconds is
// left unset: only CPU devices know it.
tandem::v1::TimingStats SummarizeTimings(const std::vector<double>& wall_seconds);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_TIMING_STATS_H_
