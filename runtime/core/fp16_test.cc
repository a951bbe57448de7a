// FloatToHalf and HalfToFloat: every fp16 value round-trips, every midpoint
// between neighbours rounds to the even one, overflow and the subnormal range
// land where IEEE says, and on a CPU with F16C the conversions agree with the
// hardware's on a million random floats spread over every exponent.
#include "runtime/core/fp16.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "runtime/core/random.h"

namespace tandem {
namespace {

bool IsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

TEST(Fp16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t half = static_cast<uint16_t>(h);
    const float f = HalfToFloat(half);
    if (IsNan(half)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(IsNan(FloatToHalf(f))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), half) << std::hex << h << " -> " << f;
  }
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00u);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000u);
  EXPECT_EQ(FloatToHalf(kHalfMax), 0x7bffu);
  EXPECT_EQ(HalfToFloat(0x7bffu), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001u), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x0400u), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000u);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_TRUE(IsNan(FloatToHalf(std::numeric_limits<float>::quiet_NaN())));
}

TEST(Fp16Test, OverflowStartsAtTheMidpointAboveTheLargestFinite) {
  // 65520 is halfway between 65504 and the next step (65536, not finite):
  // ties to even go up, to infinity; anything below stays 65504.
  EXPECT_EQ(FloatToHalf(65519.996f), 0x7bffu);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00u);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00u);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00u);
}

TEST(Fp16Test, MidpointsRoundToEven) {
  // Neighbouring finite positive halves a < b: their midpoint is exact in
  // fp32; it rounds to whichever of a and b has an even mantissa, and a hair
  // either side rounds to the nearer.
  for (uint32_t h = 0; h < 0x7bffu; ++h) {
    const uint16_t a = static_cast<uint16_t>(h), b = static_cast<uint16_t>(h + 1);
    const float mid = 0.5f * (HalfToFloat(a) + HalfToFloat(b));
    ASSERT_EQ(FloatToHalf(mid), (a & 1u) == 0 ? a : b) << std::hex << h;
    EXPECT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), a) << std::hex << h;
    EXPECT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), b) << std::hex << h;
    EXPECT_EQ(FloatToHalf(-mid), ((a & 1u) == 0 ? a : b) | 0x8000u) << std::hex << h;
  }
}

__attribute__((target("f16c"))) uint16_t HardwareHalf(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, 0));  // 0: round to nearest even
}

TEST(Fp16Test, AgreesWithF16cOnRandomFloats) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "no F16C on this CPU";
  int compared = 0;
  for (int i = 0; i < 1000000; ++i) {
    // Exponents from 2^-30 to 2^19: subnormal, normal and overflowing halves.
    uint32_t bits = Philox4x32(7, 0, static_cast<uint64_t>(i))[0];
    bits = (bits & 0x807fffffu) | ((97u + (bits >> 23) % 50u) << 23);
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    ASSERT_EQ(FloatToHalf(x), HardwareHalf(x)) << x;
    ++compared;
  }
  EXPECT_EQ(compared, 1000000);
}

}  // namespace
}  // namespace tandem
