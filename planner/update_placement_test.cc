#include "planner/update_placement.h"

#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

using testing::MeasuredChainProfile;
using testing::SyntheticLayer;
using testing::SyntheticNode;

struct Instance {
  CostModel cost;
  Schedule base;
};

// A random chain: layer times, sizes, link and host speeds, micro-batches,
// recompute and DPU all drawn from `rng`; every layer resident on the
// accelerator and updated on the host (the caller flips updates).
Instance RandomInstance(int layers, std::mt19937* rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<SyntheticLayer> chain;
  for (int l = 0; l < layers; ++l) {
    SyntheticLayer x;
    x.name = "l";
    x.accelerator_forward_seconds = 0.1 + 1.9 * u(*rng);
    x.accelerator_backward_seconds = x.accelerator_forward_seconds * (1.5 + u(*rng));
    x.accelerator_update_seconds = 0.01 + 0.3 * u(*rng);
    x.host_forward_seconds = 10 * x.accelerator_forward_seconds;
    x.host_backward_seconds = 10 * x.accelerator_backward_seconds;
    x.host_update_seconds = 0.1 + 3 * u(*rng);
    // One layer in five has no parameters (an activation function).
    x.parameter_bytes = u(*rng) < 0.2 ? 0 : 10 + static_cast<int64_t>(990 * u(*rng));
    x.activation_bytes = static_cast<int64_t>(500 * u(*rng));
    x.workspace_bytes = static_cast<int64_t>(50 * u(*rng));
    x.output_bytes = static_cast<int64_t>(100 * u(*rng));
    chain.push_back(x);
  }
  SyntheticNode node;
  node.h2d_bytes_per_second = 100 + 400 * u(*rng);
  node.d2h_bytes_per_second = 100 + 400 * u(*rng);
  node.link_latency_seconds = 0.01 * u(*rng);
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(MeasuredChainProfile(chain, /*batch_size=*/2, node));
  EXPECT_TRUE(cost.ok()) << cost.status();
  Schedule s;
  s.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
  s.layers.resize(layers);
  for (LayerSchedule& l : s.layers) {
    l.update = tandem::v1::PLACEMENT_HOST;
    if (u(*rng) < 0.25) l.activation = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
  }
  s.batch_size = 2;
  s.micro_batch_size = u(*rng) < 0.3 ? 1 : 2;
  s.delayed_parameter_update = u(*rng) < 0.3;
  s.host_update_threads = 1;
  return {*std::move(cost), s};
}

Schedule WithUpdates(Schedule s, const std::vector<bool>& acc) {
  for (size_t l = 0; l < s.layers.size(); ++l) {
    s.layers[l].update = acc[l] ? tandem::v1::PLACEMENT_ACCELERATOR : tandem::v1::PLACEMENT_HOST;
  }
  return s;
}

std::vector<bool> Eligible(const CostModel& cost) {
  std::vector<bool> eligible(cost.num_layers());
  for (int l = 0; l < cost.num_layers(); ++l) eligible[l] = cost.ParameterBytes(l) > 0;
  return eligible;
}

TEST(ChainEvaluatorTest, AgreesWithTheSimulatorExactly) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int layers = 1 + trial % 9;
    Instance inst = RandomInstance(layers, &rng);
    std::vector<bool> acc(layers);
    for (int l = 0; l < layers; ++l) acc[l] = (rng() & 1) != 0;
    ASSERT_TRUE(ChainEvaluator::Supports(inst.base));
    ChainEvaluator evaluator(inst.cost, inst.base);
    const PlacementScore fast = evaluator.Score(acc, /*need_peak=*/true);
    PlanSimulator sim(inst.cost);
    absl::StatusOr<SimulationResult> exact = sim.Simulate(WithUpdates(inst.base, acc));
    ASSERT_TRUE(exact.ok()) << exact.status();
    ASSERT_EQ(fast.iteration_seconds, exact->prediction.iteration_seconds()) << "trial " << trial;
    ASSERT_EQ(fast.accelerator_peak_bytes, exact->prediction.accelerator_peak_bytes())
        << "trial " << trial;
    // Without the peak, the closed form (or the same run with DPU).
    const double quick = evaluator.Score(acc, /*need_peak=*/false).iteration_seconds;
    ASSERT_NEAR(quick, exact->prediction.iteration_seconds(),
                1e-12 * exact->prediction.iteration_seconds())
        << "trial " << trial;
  }
}

TEST(ChainEvaluatorTest, DoesNotClaimOffloadOrStreaming) {
  Schedule s;
  s.layers.resize(2);
  EXPECT_TRUE(ChainEvaluator::Supports(s));
  s.layers[1].activation = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
  EXPECT_FALSE(ChainEvaluator::Supports(s));
  s.layers[1].activation = tandem::v1::ACTIVATION_POLICY_KEEP;
  s.layers[0].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  EXPECT_FALSE(ChainEvaluator::Supports(s));
}

// The best choice over all 2^E subsets of eligible layers, by the simulator.
struct Exhaustive {
  bool feasible = false;
  double iteration_seconds = 0;
};
Exhaustive Enumerate(const Instance& inst, int64_t budget) {
  const std::vector<bool> eligible = Eligible(inst.cost);
  std::vector<int> e;
  for (int l = 0; l < static_cast<int>(eligible.size()); ++l) {
    if (eligible[l]) e.push_back(l);
  }
  PlanSimulator sim(inst.cost);
  SimulationOptions options;
  options.record_timeline = false;
  Exhaustive best;
  uint32_t best_mask = 0;
  for (uint32_t mask = 0; mask < (1u << e.size()); ++mask) {
    std::vector<bool> acc(eligible.size(), false);
    for (size_t i = 0; i < e.size(); ++i) acc[e[i]] = (mask >> i) & 1;
    absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, acc), options);
    EXPECT_TRUE(r.ok());
    if (r->prediction.accelerator_peak_bytes() > budget) continue;
    if (!best.feasible || r->prediction.iteration_seconds() < best.iteration_seconds) {
      best.feasible = true;
      best.iteration_seconds = r->prediction.iteration_seconds();
      best_mask = mask;
    }
  }
  if (getenv("DEBUG_EX")) {
    fprintf(stderr, "best mask over eligible:");
    for (size_t i = 0; i < e.size(); ++i) fprintf(stderr, " %d:%d", e[i], (best_mask >> i) & 1);
    fprintf(stderr, "\n");
  }
  return best;
}

int64_t total_evaluations = 0;

void ExpectOptimal(int layers, int instances, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < instances; ++trial) {
    Instance inst = RandomInstance(layers, &rng);
    const std::vector<bool> eligible = Eligible(inst.cost);
    ChainEvaluator evaluator(inst.cost, inst.base);
    const int64_t low =
        evaluator.Score(std::vector<bool>(layers, false), true).accelerator_peak_bytes;
    const int64_t high = evaluator.Score(eligible, true).accelerator_peak_bytes;
    // From "only all-host fits" to "everything fits", and a bit outside.
    const int64_t budget = low + static_cast<int64_t>((high - low) * (1.2 * u(rng) - 0.1));
    const Exhaustive truth = Enumerate(inst, budget);
    const PlacementSearchResult found =
        SearchUpdatePlacement(eligible, budget, [&](const std::vector<bool>& acc, bool need_peak) {
          return evaluator.Score(acc, need_peak);
        });
    ASSERT_EQ(found.feasible, truth.feasible) << "trial " << trial;
    total_evaluations += found.evaluations;
    if (!truth.feasible) continue;
    // Never above the budget, by the simulator.
    PlanSimulator sim(inst.cost);
    absl::StatusOr<SimulationResult> r = sim.Simulate(WithUpdates(inst.base, found.on_accelerator));
    ASSERT_TRUE(r.ok());
    EXPECT_LE(r->prediction.accelerator_peak_bytes(), budget) << "trial " << trial;
    EXPECT_LE(found.iteration_seconds, truth.iteration_seconds * (1 + 1e-9))
        << "trial " << trial << ": search " << found.iteration_seconds << " s, exhaustive "
        << truth.iteration_seconds << " s";
    if (getenv("DEBUG_EX") && found.iteration_seconds > truth.iteration_seconds * (1 + 1e-9)) {
      fprintf(stderr, "found:");
      for (int l = 0; l < layers; ++l) fprintf(stderr, " %d", (int)found.on_accelerator[l]);
      fprintf(stderr, " budget %ld peak %ld dpu %d mb %d\n", (long)budget,
              (long)found.accelerator_peak_bytes, inst.base.delayed_parameter_update,
              inst.base.micro_batch_size);
      Enumerate(inst, budget);
    }
  }
}

TEST(SearchUpdatePlacementTest, MatchesExhaustiveSearchOnSmallChains) {
  for (int layers = 2; layers <= 8; ++layers) ExpectOptimal(layers, 60, 100 + layers);
  // Far fewer candidates than exhaustive search (2^L each).
  std::cout << "search evaluations: " << total_evaluations << "\n";
}

TEST(SearchUpdatePlacementTest, MatchesExhaustiveSearchAtTwelveLayers) {
  ExpectOptimal(12, 12, 4242);
}

TEST(SearchUpdatePlacementTest, InfeasibleWhenNothingFits) {
  std::mt19937 rng(3);
  Instance inst = RandomInstance(4, &rng);
  ChainEvaluator evaluator(inst.cost, inst.base);
  const int64_t low = evaluator.Score(std::vector<bool>(4, false), true).accelerator_peak_bytes;
  const PlacementSearchResult r = SearchUpdatePlacement(
      Eligible(inst.cost), low - 1, [&](const std::vector<bool>& acc, bool need_peak) {
        return evaluator.Score(acc, need_peak);
      });
  EXPECT_FALSE(r.feasible);
}

}  // namespace
}  // namespace tandem::planner
