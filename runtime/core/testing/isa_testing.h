// Test support for running a kernel at every instruction-set level rather than
// the one the dispatch picks: a value-parameterised fixture over CpuIsa that
// skips a level this CPU lacks (naming it), the lengths that leave every
// remainder of the 8- and 16-lane loops to their tails, and buffers at chosen
// misalignments with guard zones either side, which catch a vector store past
// either end. Header-only; for tests.
#ifndef TANDEM_RUNTIME_CORE_TESTING_ISA_TESTING_H_
#define TANDEM_RUNTIME_CORE_TESTING_ISA_TESTING_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/cpu_features.h"

namespace tandem {

// Names a level in gtest's messages, which print parameters.
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << CpuIsaName(isa); }

namespace isa_testing {

// Every level, scalar (the baseline build) first.
inline std::vector<CpuIsa> AllCpuIsas() {
  return {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512};
}

// Parameterised over the level; the test body runs the kernel at GetParam().
class IsaTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!CpuSupports(GetParam())) {
      GTEST_SKIP() << "this CPU lacks " << CpuIsaName(GetParam()) << "; its path is not run";
    }
  }
};

// For INSTANTIATE_TEST_SUITE_P: names each instance after its level.
inline std::string IsaName(const ::testing::TestParamInfo<CpuIsa>& info) {
  return CpuIsaName(info.param);
}

// 0 to 66 (every remainder of 8 and 16 lanes, with zero to four full vectors
// before it), lengths either side of powers of two, of SumOfSquares' 4096 blocks,
// and one large enough that every thread's share has a main loop and a tail.
inline std::vector<int64_t> TailLengths() {
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 66; ++n) lengths.push_back(n);
  for (int64_t n : {127, 129, 255, 257, 1000, 4095, 4096, 4097, 8193, 100003}) {
    lengths.push_back(n);
  }
  return lengths;
}

// Where a buffer starts, in floats past a 64-byte boundary: aligned, and two
// misalignments that put a different remainder in front of the first full vector.
inline std::vector<int64_t> Misalignments() { return {0, 1, 7}; }

// n floats starting `misalignment` floats past a 64-byte boundary, between guard
// zones of kGuard floats. The guards hold a signalling NaN whose payload is this
// buffer's own: arithmetic on it gives a quiet NaN and a copy of another buffer's
// guard has another payload, so a store past either end changes them whatever
// it stores.
class GuardedBuffer {
 public:
  static constexpr int64_t kGuard = 64;

  GuardedBuffer(int64_t n, int64_t misalignment)
      : n_(n), guard_bits_(NextGuardBits()), storage_(n + 2 * kGuard + 32) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(storage_.data());
    const int64_t to_boundary = static_cast<int64_t>((64 - address % 64) % 64 / sizeof(float));
    begin_ = to_boundary + kGuard + misalignment;
    for (float& x : storage_) std::memcpy(&x, &guard_bits_, sizeof(x));
  }

  float* data() { return storage_.data() + begin_; }
  const float* data() const { return storage_.data() + begin_; }
  int64_t size() const { return n_; }
  std::vector<float> values() const { return std::vector<float>(data(), data() + n_); }
  void assign(const std::vector<float>& values) {
    std::memcpy(data(), values.data(), n_ * sizeof(float));
  }

  // Whether the kGuard floats on each side still hold this buffer's pattern
  // (compared as bits: loading a signalling NaN as a float may quieten it).
  bool GuardsIntact() const {
    for (int64_t i = 1; i <= kGuard; ++i) {
      if (!IsGuard(data() - i) || !IsGuard(data() + n_ - 1 + i)) return false;
    }
    return true;
  }

 private:
  // Exponent all ones, quiet bit clear, and a payload that is never zero.
  static uint32_t NextGuardBits() {
    static std::atomic<uint32_t> next{0};
    return 0x7f800000u | (1 + next.fetch_add(1) % 0x3ffffe);
  }

  bool IsGuard(const float* x) const {
    uint32_t bits;
    std::memcpy(&bits, x, sizeof(bits));
    return bits == guard_bits_;
  }

  int64_t n_;
  uint32_t guard_bits_;
  int64_t begin_ = 0;
  std::vector<float> storage_;
};

}  // namespace isa_testing
}  // namespace tandem

#endif  // TANDEM_RUNTIME_CORE_TESTING_ISA_TESTING_H_
