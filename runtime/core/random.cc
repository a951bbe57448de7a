#include "runtime/core/random.h"

#include <cmath>
#include <numeric>

namespace tandem {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline float ToUnit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }

}  // namespace

std::array<uint32_t, 4> Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kPhiloxM0, c0, &hi0, &lo0);
    MulHiLo(kPhiloxM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return {c0, c1, c2, c3};
}

uint64_t MixStream(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}

float UniformAt(uint64_t seed, uint64_t stream, uint64_t index) {
  return ToUnit(Philox4x32(seed, stream, index / 4)[index % 4]);
}

void FillUniform(float* out, int64_t n, float low, float high, uint64_t seed, uint64_t stream) {
  const float span = high - low;
  for (int64_t block = 0; block * 4 < n; ++block) {
    const auto r = Philox4x32(seed, stream, static_cast<uint64_t>(block));
    for (int j = 0; j < 4 && block * 4 + j < n; ++j) out[block * 4 + j] = low + span * ToUnit(r[j]);
  }
}

void FillNormal(float* out, int64_t n, float mean, float stddev, uint64_t seed, uint64_t stream) {
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t block = 0; block * 4 < n; ++block) {
    const auto r = Philox4x32(seed, stream, static_cast<uint64_t>(block));
    for (int pair = 0; pair < 2; ++pair) {
      // u1 in (0, 1] so the log is finite.
      const double u1 = (static_cast<double>(r[2 * pair] >> 8) + 1.0) / 16777216.0;
      const double u2 = static_cast<double>(r[2 * pair + 1] >> 8) / 16777216.0;
      const double radius = std::sqrt(-2.0 * std::log(u1));
      const int64_t i = block * 4 + 2 * pair;
      if (i < n) out[i] = mean + stddev * static_cast<float>(radius * std::cos(kTwoPi * u2));
      if (i + 1 < n)
        out[i + 1] = mean + stddev * static_cast<float>(radius * std::sin(kTwoPi * u2));
    }
  }
}

std::vector<int64_t> Permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto r = Philox4x32(seed, stream, static_cast<uint64_t>(i));
    const uint64_t draw = (static_cast<uint64_t>(r[0]) << 32) | r[1];
    std::swap(order[i], order[draw % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

}  // namespace tandem
