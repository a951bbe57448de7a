#include "base/units.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(FormatBytesTest, PicksTheLargestUnitBelowTheValue) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 20), "3.00 MiB");
  EXPECT_EQ(FormatBytes((int64_t{23} << 30) + (int64_t{1} << 29)), "23.50 GiB");
}

TEST(FormatBytesTest, DecimalsAreTheCallersChoice) {
  EXPECT_EQ(FormatBytes(3000, 1), "2.9 KiB");
  EXPECT_EQ(FormatBytes(int64_t{1} << 20, 1), "1.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 30, 0), "5 GiB");
}

TEST(FormatBytesTest, NegativeSizesKeepTheirSignAndUnit) {
  EXPECT_EQ(FormatBytes(-512), "-512 B");
  EXPECT_EQ(FormatBytes(-(int64_t{3} << 20)), "-3.00 MiB");
}

TEST(FormatSecondsTest, PicksMicrosecondsMillisecondsOrSeconds) {
  EXPECT_EQ(FormatSeconds(42e-6), "42 us");
  EXPECT_EQ(FormatSeconds(0.0125), "12.500 ms");
  EXPECT_EQ(FormatSeconds(2.5), "2.500 s");
}

}  // namespace
}  // namespace tandem
