// Every vector path of the optimizer kernels, forced through their ForIsa entry
// points: Adam's AVX-512 and AVX2 intrinsics and its scalar loop, and SGD and
// SumOfSquares as the compiler vectorises them for AVX-512, AVX2 and the
// baseline. Each runs on lengths that leave every remainder to the tails
// (n = 0 and 1 included), at three misalignments, against a reference written
// out here, with nothing stored outside the buffers. The dispatched entry points
// are checked to be these at the level they claim. A level this CPU lacks is
// skipped, by name.
#include <algorithm>
#include <cfloat>
#include <cmath>
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
#include "runtime/optim/kernels.h"
#include "runtime/optim/kernels_internal.h"

namespace tandem::optim {
namespace {

using isa_testing::GuardedBuffer;
using isa_testing::IsaTest;
using isa_testing::Misalignments;
using isa_testing::TailLengths;

// The rounding a float kernel result may carry per operation behind it,
// relative to the magnitudes that went into the operation: a few roundings, with
// or without fused multiply-adds.
constexpr double kRounding = 4 * FLT_EPSILON;

// The exact value of an output (computed in double from the same fp32 inputs
// and constants) and how far a correct fp32 kernel may be from it, propagated
// through the formula from kRounding per operation.
struct Expected {
  double value = 0;
  double tolerance = 0;
};

// Whether every actual[i] is within tolerance of expected[i]; on failure, says
// where, how far off and how many.
::testing::AssertionResult AllClose(const char* what, const float* actual,
                                    const std::vector<Expected>& expected) {
  int64_t bad = 0;
  std::ostringstream first;
  for (size_t i = 0; i < expected.size(); ++i) {
    const double error = std::fabs(actual[i] - expected[i].value);
    if (!(error <= expected[i].tolerance + 1e-37) && bad++ < 3) {
      first << "\n  " << what << "[" << i << "] = " << actual[i] << ", expected "
            << expected[i].value << " (off by " << error << ", tolerance " << expected[i].tolerance
            << ")";
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << expected.size() << " elements of " << what << " wrong:" << first.str();
}

std::string Where(int64_t n, int64_t misalignment) {
  std::ostringstream s;
  s << "n=" << n << " misalignment=" << misalignment;
  return s.str();
}

// Magnitudes from 1e-10 to 100 with random signs and some exact zeros, so that
// every term of the updates (eps included) decides some elements.
std::vector<float> WideRange(int64_t n, uint64_t stream) {
  std::vector<float> exponent(n), sign(n), x(n);
  FillUniform(exponent.data(), n, -10, 2, 7, stream);
  FillUniform(sign.data(), n, -1, 1, 7, stream + 1000);
  for (int64_t i = 0; i < n; ++i) {
    x[i] = i % 11 == 5 ? 0.0f : std::copysign(std::pow(10.0f, exponent[i]), sign[i]);
  }
  return x;
}

std::vector<float> Uniform(int64_t n, float low, float high, uint64_t stream) {
  std::vector<float> x(n);
  FillUniform(x.data(), n, low, high, 7, stream);
  return x;
}

// One Adam step per element from the state before it (AdamConstants' formula).
void AdamReference(const std::vector<float>& p, const std::vector<float>& g,
                   const std::vector<float>& m, const std::vector<float>& v, const AdamStep& s,
                   std::vector<Expected>* p_out, std::vector<Expected>* m_out,
                   std::vector<Expected>* v_out) {
  const AdamConstants c = MakeAdamConstants(s);
  const size_t n = p.size();
  p_out->resize(n);
  m_out->resize(n);
  v_out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    // The gradient's rounding is relative to its terms (they may cancel), and
    // m and v are sums of non-cancelling products of it: bound them by the terms.
    const double grad = double{g[i]} * c.grad_scale + double{c.l2} * p[i];
    const double grad_terms = std::fabs(double{g[i]} * c.grad_scale) + std::fabs(c.l2 * p[i]);
    const double mi = double{c.beta1} * m[i] + double{c.one_minus_beta1} * grad;
    const double m_tol =
        kRounding * (std::fabs(double{c.beta1} * m[i]) + c.one_minus_beta1 * grad_terms);
    const double vi = double{c.beta2} * v[i] + double{c.one_minus_beta2} * grad * grad;
    const double v_tol =
        kRounding * (double{c.beta2} * v[i] + c.one_minus_beta2 * grad_terms * grad_terms);
    // sqrt moves an error d in v by at most d / (2 sqrt(v)), and never by more
    // than sqrt(d).
    const double root = std::sqrt(vi);
    const double root_tol = std::min(v_tol / (2 * root), std::sqrt(v_tol)) + kRounding * root;
    const double denom = root * c.inv_sqrt_bc2 + c.eps;
    const double denom_tol = root_tol * c.inv_sqrt_bc2 + kRounding * denom;
    const double ratio = mi / denom;
    const double ratio_tol =
        m_tol / denom + std::fabs(mi) * denom_tol / (denom * denom) + kRounding * std::fabs(ratio);
    (*m_out)[i] = {mi, m_tol};
    (*v_out)[i] = {vi, v_tol};
    (*p_out)[i] = {double{p[i]} * c.decay - double{c.step_size} * ratio,
                   kRounding * std::fabs(double{p[i]} * c.decay) +
                       c.step_size * (ratio_tol + kRounding * std::fabs(ratio))};
  }
}

using AdamIsaTest = IsaTest;

TEST_P(AdamIsaTest, MatchesReferenceOnEveryLengthAndTail) {
  // Three steps on the same buffers, each checked from the state before it: L2
  // weight decay at t = 1, decoupled (AdamW) with a gradient scale at t = 2, and
  // a loss-scaled gradient late in training, where the bias corrections are ~1.
  const AdamStep steps[] = {
      {.lr = 1e-3f, .weight_decay = 0.01f, .t = 1},
      {.lr = 3e-4f, .weight_decay = 0.1f, .decoupled = true, .grad_scale = 0.5f, .t = 2},
      {.lr = 1e-2f,
       .beta1 = 0.8f,
       .beta2 = 0.99f,
       .eps = 1e-6f,
       .grad_scale = 1.0f / 1024,
       .t = 1000},
  };
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer p(n, misalignment), g(n, misalignment), m(n, misalignment), v(n, misalignment);
      p.assign(Uniform(n, -1, 1, 1));
      m.assign(std::vector<float>(n, 0.0f));
      v.assign(std::vector<float>(n, 0.0f));
      for (int k = 0; k < 3; ++k) {
        g.assign(WideRange(n, 10 + k));
        std::vector<Expected> p_ref, m_ref, v_ref;
        AdamReference(p.values(), g.values(), m.values(), v.values(), steps[k], &p_ref, &m_ref,
                      &v_ref);
        internal::AdamUpdateForIsa(GetParam(), p.data(), g.data(), m.data(), v.data(), n, steps[k]);
        const std::string where = Where(n, misalignment) + " step=" + std::to_string(k);
        ASSERT_TRUE(AllClose("p", p.data(), p_ref)) << where;
        ASSERT_TRUE(AllClose("m", m.data(), m_ref)) << where;
        ASSERT_TRUE(AllClose("v", v.data(), v_ref)) << where;
        ASSERT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact() && g.GuardsIntact())
            << "stored outside the buffers, " << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, AdamIsaTest, ::testing::ValuesIn(isa_testing::AllCpuIsas()),
                         isa_testing::IsaName);

// The mixed-precision step: bf16 gradients widened, fp32 master and state as
// the fp32 step on the widened gradients to the bit, and its working copy the
// master weights rounded to bf16, nothing stored past the copy's end.
TEST_P(AdamIsaTest, Bf16StepIsTheFp32StepOnWidenedGradientsWithItsRoundedCopy) {
  const AdamStep step{.lr = 3e-4f, .weight_decay = 0.1f, .decoupled = true, .t = 2};
  constexpr uint16_t kGuard = 0xabcd;
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer p(n, misalignment), m(n, misalignment), v(n, misalignment);
      GuardedBuffer p32(n, misalignment), m32(n, misalignment), v32(n, misalignment);
      GuardedBuffer widened(n, misalignment);
      std::vector<uint16_t> g16(n + misalignment), copy(n + misalignment + 16, kGuard);
      const std::vector<float> g = WideRange(n, 20);
      std::vector<float> g_widened(n);
      for (int64_t i = 0; i < n; ++i) {
        g16[misalignment + i] = FloatToBf16(g[i]);
        g_widened[i] = Bf16ToFloat(g16[misalignment + i]);
      }
      widened.assign(g_widened);
      for (GuardedBuffer* b : {&p, &p32}) b->assign(Uniform(n, -1, 1, 21));
      for (GuardedBuffer* b : {&m, &m32}) b->assign(Uniform(n, -0.1f, 0.1f, 22));
      for (GuardedBuffer* b : {&v, &v32}) b->assign(Uniform(n, 0, 0.01f, 23));
      internal::AdamUpdateForIsa(GetParam(), p32.data(), widened.data(), m32.data(), v32.data(), n,
                                 step);
      internal::AdamUpdateBf16ForIsa(GetParam(), p.data(), g16.data() + misalignment, m.data(),
                                     v.data(), copy.data() + misalignment, n, step);
      const std::string where = Where(n, misalignment);
      ASSERT_EQ(p.values(), p32.values()) << where;
      ASSERT_EQ(m.values(), m32.values()) << where;
      ASSERT_EQ(v.values(), v32.values()) << where;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(copy[misalignment + i], FloatToBf16(p.data()[i])) << where << " i=" << i;
      }
      for (int64_t i = 0; i < misalignment; ++i) ASSERT_EQ(copy[i], kGuard) << where;
      for (size_t i = misalignment + n; i < copy.size(); ++i) ASSERT_EQ(copy[i], kGuard) << where;
      ASSERT_TRUE(p.GuardsIntact() && m.GuardsIntact() && v.GuardsIntact()) << where;
    }
  }
}

// The copy's rounding on the values where rounding is hard: ties (to even),
// carries into the exponent and to infinity, NaNs that must not become
// infinities, signed zeros and subnormals. With lr = 0 a finite master weight
// stays as it is, so the copy is its rounding; a NaN weight stays a NaN (its
// sign and payload are the arithmetic's). The scalar conversion is checked on
// the infinities too, which Adam turns into NaNs (0 * inf).
TEST_P(AdamIsaTest, Bf16CopyRoundsToNearestEvenAndKeepsNaNs) {
  const std::pair<uint32_t, uint16_t> finite[] = {
      {0x3f808000, 0x3f80},  // tie, even below: down
      {0x3f818000, 0x3f82},  // tie, odd below: up
      {0x3f808001, 0x3f81},  // above the tie: up
      {0x3f807fff, 0x3f80},  // below the tie: down
      {0x3fffffff, 0x4000},  // carries into the exponent
      {0x7f7fffff, 0x7f80},  // the largest float rounds to infinity
      {0x80000000, 0x8000},  // -0
      {0x00018000, 0x0002},  // subnormal tie, odd below: up
      {0xbf7fffff, 0xbf80},  // negative, carries
      {0x7f800001, 0},       // signalling NaN: a NaN, not infinity
      {0xffc00001, 0},       // negative quiet NaN
      {0x7fffffff, 0},       // all-ones payload: rounding would carry it into -0
  };
  const int n_cases = sizeof(finite) / sizeof(finite[0]);
  const int64_t n = 37;  // every path: two vectors of 16 (or four of 8), then a tail of 5
  std::vector<float> p(n), m(n, 0), v(n, 0);
  std::vector<uint16_t> g16(n, 0), copy(n, 0);
  for (int64_t i = 0; i < n; ++i) std::memcpy(&p[i], &finite[i % n_cases].first, sizeof(float));
  internal::AdamUpdateBf16ForIsa(GetParam(), p.data(), g16.data(), m.data(), v.data(), copy.data(),
                                 n, AdamStep{.lr = 0.0f, .t = 1});
  for (int64_t i = 0; i < n; ++i) {
    const auto& [bits, rounded] = finite[i % n_cases];
    if (rounded == 0) {
      EXPECT_TRUE((copy[i] & 0x7f80) == 0x7f80 && (copy[i] & 0x7f) != 0)
          << std::hex << "p = 0x" << bits << " gave 0x" << copy[i] << ", not a NaN";
    } else {
      EXPECT_EQ(copy[i], rounded) << std::hex << "p = 0x" << bits << ", i = " << std::dec << i;
    }
  }
  const std::pair<uint32_t, uint16_t> scalar[] = {
      {0x3f808000, 0x3f80}, {0x3f818000, 0x3f82}, {0x7f7fffff, 0x7f80},
      {0x7f800000, 0x7f80}, {0xff800000, 0xff80}, {0x7f800001, 0x7fc0},
      {0xffc00001, 0xffc0}, {0x00018000, 0x0002}, {0x7fffffff, 0x7fff},
  };
  for (const auto& [bits, rounded] : scalar) {
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    EXPECT_EQ(FloatToBf16(x), rounded) << std::hex << "scalar, x = 0x" << bits;
    if ((rounded & 0x7fff) <= 0x7f80) {
      EXPECT_EQ(FloatToBf16(Bf16ToFloat(rounded)), rounded) << "widening is exact";
    }
  }
}

// One SGD step per element from the state before it. Every result is a sum of
// terms computed from the inputs: its rounding is bounded by theirs.
void SgdReference(const std::vector<float>& p, const std::vector<float>& g,
                  const std::vector<float>& buf, const SgdStep& s, std::vector<Expected>* p_out,
                  std::vector<Expected>* buf_out) {
  const size_t n = p.size();
  p_out->resize(n);
  buf_out->resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double grad = double{g[i]} * s.grad_scale + double{s.weight_decay} * p[i];
    const double grad_terms =
        std::fabs(double{g[i]} * s.grad_scale) + std::fabs(double{s.weight_decay} * p[i]);
    if (s.momentum == 0.0f) {
      (*p_out)[i] = {p[i] - double{s.lr} * grad, kRounding * (std::fabs(p[i]) + s.lr * grad_terms)};
      continue;
    }
    const double b = s.first_step ? grad : double{s.momentum} * buf[i] + grad;
    const double b_terms =
        s.first_step ? grad_terms : std::fabs(double{s.momentum} * buf[i]) + grad_terms;
    const double step = s.nesterov ? grad + double{s.momentum} * b : b;
    const double step_terms = s.nesterov ? grad_terms + s.momentum * b_terms : b_terms;
    (*buf_out)[i] = {b, kRounding * b_terms};
    (*p_out)[i] = {p[i] - double{s.lr} * step, kRounding * (std::fabs(p[i]) + s.lr * step_terms)};
  }
}

using SgdIsaTest = IsaTest;

TEST_P(SgdIsaTest, MatchesReferenceOnEveryLengthAndTail) {
  // Plain SGD (no buffer: it may be null), then momentum's first step, a later
  // one, and a Nesterov step, on the same buffers.
  const SgdStep steps[] = {
      {.lr = 0.1f, .weight_decay = 0.01f},
      {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .grad_scale = 0.5f},
      {.lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f, .first_step = false},
      {.lr = 0.02f, .momentum = 0.8f, .nesterov = true, .grad_scale = 2.0f, .first_step = false},
  };
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer p(n, misalignment), g(n, misalignment), buf(n, misalignment);
      p.assign(Uniform(n, -1, 1, 2));
      buf.assign(std::vector<float>(n, 0.0f));
      for (int k = 0; k < 4; ++k) {
        g.assign(WideRange(n, 20 + k));
        std::vector<Expected> p_ref, buf_ref;
        SgdReference(p.values(), g.values(), buf.values(), steps[k], &p_ref, &buf_ref);
        const std::vector<float> buf_before = buf.values();
        float* const buf_arg = steps[k].momentum == 0.0f ? nullptr : buf.data();
        internal::SgdUpdateForIsa(GetParam(), p.data(), g.data(), buf_arg, n, steps[k]);
        const std::string where = Where(n, misalignment) + " step=" + std::to_string(k);
        ASSERT_TRUE(AllClose("p", p.data(), p_ref)) << where;
        if (buf_arg != nullptr) {
          ASSERT_TRUE(AllClose("buf", buf.data(), buf_ref)) << where;
        } else {
          ASSERT_EQ(buf.values(), buf_before) << where;
        }
        ASSERT_TRUE(p.GuardsIntact() && g.GuardsIntact() && buf.GuardsIntact())
            << "stored outside the buffers, " << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, SgdIsaTest, ::testing::ValuesIn(isa_testing::AllCpuIsas()),
                         isa_testing::IsaName);

using SumOfSquaresIsaTest = IsaTest;

TEST_P(SumOfSquaresIsaTest, IsExactWhereTheSumIsRepresentable) {
  // x = k/8 with 1 <= |k| <= 16: every square is a multiple of 1/64 and at most
  // 4, so each 4096-element fp32 partial (< 2^18) is exact in any order and the
  // result must be the exact sum. A dropped, repeated or stray element changes it
  // by at least 1/64.
  for (int64_t n : TailLengths()) {
    for (int64_t misalignment : Misalignments()) {
      GuardedBuffer x(n, misalignment);
      std::vector<float> u = Uniform(n, 1, 17, 3), sign = Uniform(n, -1, 1, 4);
      double exact = 0;
      for (int64_t i = 0; i < n; ++i) {
        u[i] = std::copysign(std::floor(u[i]) / 8, sign[i]);
        exact += double{u[i]} * u[i];
      }
      x.assign(u);
      ASSERT_EQ(internal::SumOfSquaresForIsa(GetParam(), x.data(), n), exact)
          << Where(n, misalignment);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, SumOfSquaresIsaTest,
                         ::testing::ValuesIn(isa_testing::AllCpuIsas()), isa_testing::IsaName);

TEST(OptimizerDispatchTest, PublicEntryPointsRunTheLevelTheyClaim) {
  // The same results to the bit as the forced entry point at the dispatched
  // level, so the per-level tests above cover what training runs. On these data
  // SumOfSquares differs between every two levels (sum order), SGD between
  // AVX-512 (fused multiply-adds) and the rest, and Adam between the intrinsics
  // and the scalar loop: a wrong level shows unless it is AVX2 for AVX-512 in
  // Adam or the baseline for AVX2 in SGD, which compute the same.
  const int64_t n = 100003;
  std::vector<float> x = Uniform(n, -1, 1, 5);
  const double dispatched = SumOfSquares(x.data(), n);
  const double forced = internal::SumOfSquaresForIsa(AutoVectorizedIsa(), x.data(), n);
  EXPECT_EQ(dispatched, forced) << "off by " << dispatched - forced;

  std::vector<float> p1 = Uniform(n, -1, 1, 6), g = WideRange(n, 7), m1(n, 0.0f), v1(n, 0.0f);
  std::vector<float> p2 = p1, m2 = m1, v2 = v1;
  const AdamStep adam{.weight_decay = 0.01f, .grad_scale = 0.7f, .t = 3};
  AdamUpdate(p1.data(), g.data(), m1.data(), v1.data(), n, adam);
  internal::AdamUpdateForIsa(ActiveCpuIsa(), p2.data(), g.data(), m2.data(), v2.data(), n, adam);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
  EXPECT_EQ(v1, v2);
  EXPECT_STREQ(AdamImplementation(), CpuIsaName(ActiveCpuIsa()));

  std::vector<float> q1 = Uniform(n, -1, 1, 8), b1(n, 0.5f), q2 = q1, b2 = b1;
  const SgdStep sgd{.momentum = 0.9f, .nesterov = true, .weight_decay = 0.1f, .first_step = false};
  SgdUpdate(q1.data(), g.data(), b1.data(), n, sgd);
  internal::SgdUpdateForIsa(AutoVectorizedIsa(), q2.data(), g.data(), b2.data(), n, sgd);
  EXPECT_EQ(q1, q2);
  EXPECT_EQ(b1, b2);
}

}  // namespace
}  // namespace tandem::optim
