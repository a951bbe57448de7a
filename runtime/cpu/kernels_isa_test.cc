// Every vector path of the compiler-vectorised CPU kernels (ColumnSum, Add,
// CopyOrAccumulate, ToBf16), forced through their ForIsa entry points for AVX-512, AVX2
// and the baseline, on lengths that leave every remainder to the tails (n = 0
// and 1 included) and at three misalignments, with nothing stored outside the
// buffers. Each output element is one fp32 add, or a chain of them in row order,
// at every level, so the results must equal the reference here to the bit. A
// level this CPU lacks is skipped, by name.
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/core/bf16.h"
#include "runtime/core/cpu_features.h"
#include "runtime/core/random.h"
#include "runtime/core/testing/isa_testing.h"
#include "runtime/cpu/kernels.h"

namespace tandem::cpu {
namespace {

using isa_testing::GuardedBuffer;
using isa_testing::IsaTest;
using isa_testing::Misalignments;
using isa_testing::TailLengths;

std::vector<float> Uniform(int64_t n, uint64_t stream) {
  std::vector<float> x(n);
  FillUniform(x.data(), n, -1, 1, 11, stream);
  return x;
}

// Whether actual equals expected bit for bit (as floats: no NaNs here); on
// failure, says where and how many.
::testing::AssertionResult BitwiseEqual(const std::vector<float>& actual,
                                        const std::vector<float>& expected) {
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (actual[i] != expected[i] && bad++ < 3) {
      first << "\n  [" << i << "] = " << actual[i] << ", expected " << expected[i];
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << expected.size() << " elements wrong:" << first.str();
}

std::string Where(int64_t n, int64_t misalignment) {
  std::ostringstream s;
  s << "n=" << n << " misalignment=" << misalignment;
  return s.str();
}

using ColumnSumIsaTest = IsaTest;

TEST_P(ColumnSumIsaTest, MatchesRowOrderSumsOnEveryWidthAndTail) {
  for (int64_t rows : {0, 1, 3, 17}) {
    for (int64_t cols : TailLengths()) {
      for (int64_t misalignment : Misalignments()) {
        for (bool accumulate : {false, true}) {
          const std::vector<float> dy_values = Uniform(rows * cols, 1);
          GuardedBuffer dy(rows * cols, misalignment), db(cols, misalignment);
          dy.assign(dy_values);
          const std::vector<float> db_before = Uniform(cols, 2);
          db.assign(db_before);
          std::vector<float> expected(cols);
          for (int64_t j = 0; j < cols; ++j) {
            float sum = accumulate ? db_before[j] : 0.0f;
            for (int64_t i = 0; i < rows; ++i) sum += dy_values[i * cols + j];
            expected[j] = sum;
          }
          internal::ColumnSumForIsa(GetParam(), dy.data(), rows, cols, db.data(), accumulate);
          const std::string where = "rows=" + std::to_string(rows) + " cols " +
                                    Where(cols, misalignment) +
                                    (accumulate ? " accumulate" : " overwrite");
          ASSERT_TRUE(BitwiseEqual(db.values(), expected)) << where;
          ASSERT_TRUE(db.GuardsIntact()) << "stored outside db, " << where;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, ColumnSumIsaTest, ::testing::ValuesIn(isa_testing::AllCpuIsas()),
                         isa_testing::IsaName);

using AddIsaTest = IsaTest;

TEST_P(AddIsaTest, MatchesElementwiseSumOnEveryLengthAndTail) {
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer a(n, misalignment), b(n, misalignment), out(n, misalignment);
      a.assign(Uniform(n, 3));
      b.assign(Uniform(n, 4));
      std::vector<float> expected(n);
      for (int64_t i = 0; i < n; ++i) expected[i] = a.data()[i] + b.data()[i];
      internal::AddForIsa(GetParam(), a.data(), b.data(), out.data(), n);
      ASSERT_TRUE(BitwiseEqual(out.values(), expected)) << Where(n, misalignment);
      ASSERT_TRUE(out.GuardsIntact()) << "stored outside out, " << Where(n, misalignment);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, AddIsaTest, ::testing::ValuesIn(isa_testing::AllCpuIsas()),
                         isa_testing::IsaName);

using CopyOrAccumulateIsaTest = IsaTest;

TEST_P(CopyOrAccumulateIsaTest, AccumulatesOrCopiesOnEveryLengthAndTail) {
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer a(n, misalignment), out(n, misalignment);
      a.assign(Uniform(n, 5));
      const std::vector<float> before = Uniform(n, 6);
      out.assign(before);
      std::vector<float> expected(n);
      for (int64_t i = 0; i < n; ++i) expected[i] = before[i] + a.data()[i];
      internal::CopyOrAccumulateForIsa(GetParam(), a.data(), out.data(), n, /*accumulate=*/true);
      ASSERT_TRUE(BitwiseEqual(out.values(), expected)) << "accumulate " << Where(n, misalignment);
      internal::CopyOrAccumulateForIsa(GetParam(), a.data(), out.data(), n, /*accumulate=*/false);
      ASSERT_TRUE(BitwiseEqual(out.values(), a.values())) << "copy " << Where(n, misalignment);
      // In place without accumulating is a no-op.
      internal::CopyOrAccumulateForIsa(GetParam(), out.data(), out.data(), n, false);
      ASSERT_TRUE(BitwiseEqual(out.values(), a.values())) << "in place " << Where(n, misalignment);
      ASSERT_TRUE(out.GuardsIntact()) << "stored outside out, " << Where(n, misalignment);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, CopyOrAccumulateIsaTest,
                         ::testing::ValuesIn(isa_testing::AllCpuIsas()), isa_testing::IsaName);

using ToBf16IsaTest = IsaTest;

// Values whose rounding is easy to get wrong: ties to even both ways, a carry
// into the exponent, the largest float (rounds to infinity), infinities,
// subnormals, and NaNs (quiet, signalling, and one whose payload is all in the
// low half, which rounding would turn into infinity).
std::vector<uint32_t> Bf16EdgeBits() {
  return {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3fffffffu, 0x7f7fffffu,
          0x7f800000u, 0xff800000u, 0x00000001u, 0x80008000u, 0x7fc00000u,
          0x7f800001u, 0xffa00000u, 0x00000000u, 0x80000000u};
}

// The scalar conversion itself, on those values, against their worked-out
// bf16 bits (the vector paths are checked against it below).
TEST(ToBf16Test, ScalarConversionRoundsToNearestEvenAndKeepsNaNs) {
  const std::vector<uint32_t> edges = Bf16EdgeBits();
  const std::vector<uint16_t> expected = {0x3f80, 0x3f82, 0x3f81, 0x4000, 0x7f80, 0x7f80, 0xff80,
                                          0x0000, 0x8000, 0x7fc0, 0x7fc0, 0xffe0, 0x0000, 0x8000};
  ASSERT_EQ(edges.size(), expected.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    float x;
    std::memcpy(&x, &edges[i], sizeof(x));
    EXPECT_EQ(FloatToBf16(x), expected[i]) << std::hex << "bits 0x" << edges[i];
  }
}

TEST_P(ToBf16IsaTest, RoundsAsTheScalarConversionOnEveryLengthAndTail) {
  constexpr int64_t kGuard = 32;
  constexpr uint16_t kGuardBits = 0xbeef;
  const std::vector<uint32_t> edges = Bf16EdgeBits();
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer x(n, misalignment);
      std::vector<float> values = Uniform(n, 7);
      for (int64_t i = 0; i < n; i += 3) {
        std::memcpy(&values[i], &edges[(i / 3) % edges.size()], sizeof(float));
      }
      x.assign(values);
      std::vector<uint16_t> out(n + 2 * kGuard + misalignment, kGuardBits);
      uint16_t* begin = out.data() + kGuard + misalignment;
      internal::ToBf16ForIsa(GetParam(), x.data(), begin, n);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t expected = FloatToBf16(x.data()[i]);
        if (begin[i] != expected && bad++ < 3) {
          uint32_t bits;
          std::memcpy(&bits, &x.data()[i], sizeof(bits));
          ADD_FAILURE() << "element " << i << " bits 0x" << std::hex << bits << ": got 0x"
                        << begin[i] << ", expected 0x" << expected << std::dec << "; "
                        << Where(n, misalignment);
        }
      }
      ASSERT_EQ(bad, 0) << Where(n, misalignment);
      for (int64_t i = 0; i < kGuard + misalignment; ++i) {
        ASSERT_EQ(out[i], kGuardBits) << "stored before out, " << Where(n, misalignment);
      }
      for (int64_t i = kGuard + misalignment + n; i < static_cast<int64_t>(out.size()); ++i) {
        ASSERT_EQ(out[i], kGuardBits) << "stored after out, " << Where(n, misalignment);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, ToBf16IsaTest, ::testing::ValuesIn(isa_testing::AllCpuIsas()),
                         isa_testing::IsaName);

// Widening is exact: every one of the 65,536 bf16 values widens to its fp32
// value (the high half), and rounds back to itself (a NaN to a quiet NaN).
TEST(FromBf16Test, WidensEveryValueExactly) {
  std::vector<uint16_t> all(65536), back(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(65536);
  FromBf16(all.data(), wide.data(), 65536);
  ToBf16(wide.data(), back.data(), 65536);
  for (int i = 0; i < 65536; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &wide[i], 4);
    ASSERT_EQ(bits, static_cast<uint32_t>(i) << 16) << i;
    const bool nan = (i & 0x7fff) > 0x7f80;
    ASSERT_EQ(back[i], nan ? (i | 0x40) : i) << i;
  }
}

}  // namespace
}  // namespace tandem::cpu
