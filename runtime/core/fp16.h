// IEEE binary16 (fp16) conversions, as CUDA's __float2half_rn and
// __half2float compute them: narrowing rounds to nearest, ties to even;
// magnitudes from 65520 up become infinity (the overflow that dynamic loss
// scaling watches for); results below 2^-14 become subnormals or zero; a NaN
// stays a NaN (the quiet NaN 0x7e00 with the input's sign). Widening is exact.
#ifndef TANDEM_RUNTIME_CORE_FP16_H_
#define TANDEM_RUNTIME_CORE_FP16_H_

#include <cstdint>
#include <cstring>

namespace tandem {

// The largest finite fp16, 65504.
inline constexpr float kHalfMax = 65504.0f;

inline uint16_t FloatToHalf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520: infinity
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a multiple of 2^-24 (fp16's subnormal step). Adding 0.5,
    // whose ulp is 2^-24, rounds to that step in the FPU's nearest-even mode;
    // the sum's low mantissa bits are then the fp16 bits (0x400 when it
    // rounds up to the smallest normal, which is the right encoding too).
    float f;
    std::memcpy(&f, &magnitude, sizeof(f));
    f += 0.5f;
    uint32_t sum;
    std::memcpy(&sum, &f, sizeof(sum));
    return sign | static_cast<uint16_t>(sum - 0x3f000000u);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to
  // 10 bits, ties to even; a carry out of the mantissa bumps the exponent,
  // which is the correctly rounded result (up to 0x7bff; 0x7c00 was caught).
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rebiased = magnitude - (uint32_t{112} << 23) + 0xfffu + odd;
  return sign | static_cast<uint16_t>(rebiased >> 13);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    float f = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof(bits));
    bits |= sign;
  }
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_FP16_H_
