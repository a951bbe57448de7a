// Deterministic random numbers for initialisation, dropout, shuffling and
// synthetic data.
//
// Counter-based (Philox4x32-10, Salmon et al., SC'11): the value at (seed, stream,
// index) is a pure function, so a dropout mask is regenerated in backward instead
// of stored, a GPU kernel draws the same numbers as the CPU, and resuming from a
// checkpoint needs no generator state. `stream` separates independent uses (a
// layer's weights, a step's dropout). Everything here is thread-safe.
#ifndef TANDEM_RUNTIME_CORE_RANDOM_H_
#define TANDEM_RUNTIME_CORE_RANDOM_H_

#include <array>
#include <cstdint>
#include <vector>

namespace tandem {

// Four 32-bit outputs of Philox4x32-10 for a 128-bit counter and 64-bit key.
std::array<uint32_t, 4> Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo);

// Mixes several words into one stream id (splitmix64 finaliser chain).
uint64_t MixStream(uint64_t a, uint64_t b, uint64_t c = 0);

// Uniform in [0, 1) with 24 random bits, at position `index` of (seed, stream).
float UniformAt(uint64_t seed, uint64_t stream, uint64_t index);

// out[i] = uniform in [low, high) at position i of (seed, stream).
void FillUniform(float* out, int64_t n, float low, float high, uint64_t seed, uint64_t stream);
// out[i] = normal(mean, stddev) at position i of (seed, stream) (Box-Muller).
void FillNormal(float* out, int64_t n, float mean, float stddev, uint64_t seed, uint64_t stream);

// 0, 1, ..., n-1 in an order that depends only on (seed, stream): Fisher-Yates
// driven by the counter-based generator.
std::vector<int64_t> Permutation(int64_t n, uint64_t seed, uint64_t stream);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_RANDOM_H_
