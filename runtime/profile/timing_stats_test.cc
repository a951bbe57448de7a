// Medians and spreads as the profile reports them.
#include "runtime/profile/timing_stats.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem::profile {
namespace {

TEST(TimingStatsTest, QuantilesInterpolateBetweenOrderStatistics) {
  EXPECT_DOUBLE_EQ(Median({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(Quantile({10, 20, 30, 40, 50}, 0.1), 14);
  EXPECT_DOUBLE_EQ(Quantile({10, 20, 30, 40, 50}, 0.9), 46);
  EXPECT_DOUBLE_EQ(Quantile({7}, 0.9), 7);
  EXPECT_TRUE(std::isnan(Median({})));
}

TEST(TimingStatsTest, SummarizesEveryField) {
  const tandem::v1::TimingStats s = SummarizeTimings({0.004, 0.001, 0.002, 0.003, 0.010});
  EXPECT_EQ(s.samples(), 5);
  EXPECT_DOUBLE_EQ(s.median_seconds(), 0.003);
  EXPECT_DOUBLE_EQ(s.min_seconds(), 0.001);
  EXPECT_DOUBLE_EQ(s.max_seconds(), 0.010);
  EXPECT_DOUBLE_EQ(s.mean_seconds(), 0.004);
  EXPECT_NEAR(s.p10_seconds(), 0.0014, 1e-12);
  EXPECT_NEAR(s.p90_seconds(), 0.0076, 1e-12);
  // Sample standard deviation (n - 1).
  EXPECT_NEAR(s.stddev_seconds(), std::sqrt((9 + 4 + 1 + 0 + 36) * 1e-6 / 4), 1e-12);
  EXPECT_EQ(s.thread_cpu_seconds(), 0);
}

TEST(TimingStatsTest, NoSamplesGiveAnEmptySummary) {
  const tandem::v1::TimingStats s = SummarizeTimings({});
  EXPECT_EQ(s.samples(), 0);
  EXPECT_EQ(s.ByteSizeLong(), 0u);
}

}  // namespace
}  // namespace tandem::profile
