// Threads that meet a matrix shape for the first time at once: each creates
// the oneDNN primitive, and oneDNN's own process-wide primitive cache sees the
// same key from all of them. Under ThreadSanitizer (make test runs this file
// with --config=tsan) this is where concurrent creation showed a race in
// oneDNN's cache; the products must also be right.
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "gtest/gtest.h"
#include "runtime/cpu/matmul.h"

namespace tandem::cpu {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// C = A B, row-major, in double.
std::vector<double> Reference(const MatmulShape& s, const std::vector<float>& a,
                              const std::vector<float>& b) {
  std::vector<double> c(s.m * s.n, 0.0);
  for (int64_t i = 0; i < s.m; ++i)
    for (int64_t p = 0; p < s.k; ++p)
      for (int64_t j = 0; j < s.n; ++j) c[i * s.n + j] += double(a[i * s.k + p]) * b[p * s.n + j];
  return c;
}

TEST(PrimitiveCreationStressTest, ThreadsMeetingNewShapesAtOnceGetRightProducts) {
  constexpr int kThreads = 6;
  constexpr int kRounds = 12;
  // Shapes no other test uses, so each round is a first use for every thread.
  std::vector<MatmulShape> shapes;
  for (int r = 0; r < kRounds; ++r) {
    MatmulShape s;
    s.m = 5 + r;
    s.n = 37 + 3 * r;
    s.k = 29 + 2 * r;
    s.accumulate = r % 3 == 1;
    shapes.push_back(s);
  }
  std::vector<std::unique_ptr<absl::Barrier>> start;
  for (int r = 0; r < kRounds; ++r) start.push_back(std::make_unique<absl::Barrier>(kThreads));
  std::vector<double> worst(kThreads, 0.0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        const MatmulShape& s = shapes[r];
        const auto a = Random(s.m * s.k, 100 * r + t);
        const auto b = Random(s.k * s.n, 100 * r + t + 50);
        std::vector<float> c(s.m * s.n, s.accumulate ? 1.0f : 0.0f);
        start[r]->Block();  // All threads create this round's primitive together.
        Matmul(s, a.data(), b.data(), c.data());
        const auto want = Reference(s, a, b);
        for (int64_t i = 0; i < s.m * s.n; ++i) {
          const double expect = want[i] + (s.accumulate ? 1.0 : 0.0);
          worst[t] = std::max(worst[t], std::abs(c[i] - expect));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_LT(worst[t], 1e-4) << "thread " << t;
}

}  // namespace
}  // namespace tandem::cpu
