#include "planner/resident_chain.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/random_chains.h"

namespace tandem::planner {
namespace {

using testing::RandomChain;
using testing::RandomChainOptions;
using testing::RandomResidentChain;
using testing::WithUpdates;

// Every field of the two results, bit for bit (serialised protos compare the
// doubles' bits).
void ExpectIdentical(const SimulationResult& fast, const SimulationResult& graph,
                     const std::string& where) {
  ASSERT_EQ(fast.iterations_simulated, graph.iterations_simulated) << where;
  EXPECT_EQ(fast.prediction.SerializeAsString(), graph.prediction.SerializeAsString())
      << where << "\nrecurrences: " << fast.prediction.ShortDebugString()
      << "\nevent graph: " << graph.prediction.ShortDebugString();
  EXPECT_EQ(fast.timeline.SerializeAsString(), graph.timeline.SerializeAsString()) << where;
  ASSERT_EQ(fast.layers.size(), graph.layers.size()) << where;
  for (size_t l = 0; l < fast.layers.size(); ++l) {
    EXPECT_EQ(fast.layers[l].reuse_distance_seconds, graph.layers[l].reuse_distance_seconds)
        << where << " layer " << l;
    EXPECT_EQ(fast.layers[l].slack_seconds, graph.layers[l].slack_seconds)
        << where << " layer " << l;
  }
  EXPECT_EQ(fast.accelerator_resident_bytes, graph.accelerator_resident_bytes) << where;
  // Each resource's work, summed in another order.
  ASSERT_EQ(fast.resource_work_seconds.size(), graph.resource_work_seconds.size()) << where;
  for (size_t r = 0; r < fast.resource_work_seconds.size(); ++r) {
    EXPECT_NEAR(fast.resource_work_seconds[r], graph.resource_work_seconds[r],
                1e-12 * (1 + graph.resource_work_seconds[r]))
        << where << " resource " << r;
  }
}

// Random schedules of the class, with real-valued times and with times on a
// coarse grid (where spans of different resources often start and end at the
// same instant), with and without a timeline.
// Every third chain clips its gradients (the norm, then every update).
TEST(ResidentChainTest, MatchesTheEventGraphBitForBit) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 900; ++trial) {
    const int layers = 1 + trial % 11;
    RandomChainOptions options;
    options.coarse_times = trial % 2 == 1;
    RandomChain chain = RandomResidentChain(layers, &rng, options);
    chain.cost.set_clips_gradients(trial % 3 == 2);
    std::vector<bool> acc(layers);
    for (int l = 0; l < layers; ++l) acc[l] = (rng() & 1) != 0;
    const Decisions s = WithUpdates(chain.base, acc);
    ASSERT_TRUE(ResidentChain::Covers(s));
    PlanSimulator sim(chain.cost);
    for (bool timeline : {true, false}) {
      SimulationOptions fast_options, graph_options;
      fast_options.record_timeline = graph_options.record_timeline = timeline;
      graph_options.use_event_graph = true;
      absl::StatusOr<SimulationResult> fast = sim.Simulate(s, fast_options);
      absl::StatusOr<SimulationResult> graph = sim.Simulate(s, graph_options);
      ASSERT_TRUE(fast.ok()) << fast.status();
      ASSERT_TRUE(graph.ok()) << graph.status();
      ExpectIdentical(*fast, *graph, "trial " + std::to_string(trial));
      if (::testing::Test::HasFailure()) return;
    }
    // The quick run agrees too.
    ResidentChain quick(chain.cost, chain.base);
    const ResidentChain::Timing t = quick.Run(acc, /*need_peak=*/true);
    absl::StatusOr<SimulationResult> graph = sim.Simulate(s);
    EXPECT_EQ(t.iteration_seconds, graph->prediction.iteration_seconds()) << trial;
    EXPECT_EQ(t.accelerator_peak_bytes, graph->prediction.accelerator_peak_bytes()) << trial;
  }
}

TEST(ResidentChainTest, CoversResidentKeepOrRecomputeSchedulesOnly) {
  Decisions s;
  s.layers.resize(2);
  EXPECT_TRUE(ResidentChain::Covers(s));
  s.layers[1].activation = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
  s.layers[0].update = tandem::v1::PLACEMENT_HOST;
  EXPECT_TRUE(ResidentChain::Covers(s));
  s.layers[1].activation = tandem::v1::ACTIVATION_POLICY_OFFLOAD;
  EXPECT_FALSE(ResidentChain::Covers(s));
  s.layers[1].activation = tandem::v1::ACTIVATION_POLICY_KEEP;
  s.layers[0].parameter_home = tandem::v1::PARAMETER_HOME_HOST_STREAMED;
  EXPECT_FALSE(ResidentChain::Covers(s));
  s.layers[0].parameter_home = tandem::v1::PARAMETER_HOME_ACCELERATOR;
  s.strategy = tandem::v1::STRATEGY_HETERO_DP;
  EXPECT_FALSE(ResidentChain::Covers(s));
  s.strategy = tandem::v1::STRATEGY_GPU_ONLY;
  s.layers[0].compute = tandem::v1::PLACEMENT_HOST;
  EXPECT_FALSE(ResidentChain::Covers(s));
}

}  // namespace
}  // namespace tandem::planner
