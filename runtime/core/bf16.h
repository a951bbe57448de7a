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

inline uint16_t FloatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (x != x) return static_cast<uint16_t>((bits | 0x00400000u) >> 16);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_BF16_H_
