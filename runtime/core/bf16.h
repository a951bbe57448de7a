// bfloat16 as the high half of an fp32: widening is exact; narrowing rounds to
// nearest, ties to even (as PyTorch's and oneDNN's conversions), and keeps a
// NaN a (quiet) NaN rather than letting the rounding carry it into infinity.
#ifndef TANDEM_RUNTIME_CORE_BF16_H_
#define TANDEM_RUNTIME_CORE_BF16_H_

#include <cstdint>
#include <cstring>

namespace tandem {

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Branch-free, so that loops over it vectorise (cpu::ToBf16).
inline uint16_t FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet = (bits | 0x00400000u) >> 16;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_BF16_H_
