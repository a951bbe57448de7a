#include "planner/hetero_replicas.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "planner/simulator.h"
#include "planner/testing/random_chains.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

// Random hetero_dp schedules on the random chains of the planner's tests:
// batch 2-8 split at random, micro-batches dividing the accelerator's share,
// activations kept or recomputed; real-valued times and times on a coarse
// grid (coinciding events). Every field of the result, bit for bit.
// Every third chain clips its gradients.
TEST(HeteroReplicasTest, MatchesTheEventGraphBitForBit) {
  std::mt19937 rng(99);
  int settled_early = 0;
  for (int trial = 0; trial < 450; ++trial) {
    const int layers = 1 + trial % 9;
    testing::RandomChainOptions options;
    options.coarse_times = trial % 2 == 1;
    testing::RandomChain chain = testing::RandomResidentChain(layers, &rng, options);
    chain.cost.set_clips_gradients(trial % 3 == 2);
    Decisions s = chain.base;
    s.strategy = tandem::v1::STRATEGY_HETERO_DP;
    s.delayed_parameter_update = false;
    s.batch_size = 2 + static_cast<int>(rng() % 7);
    s.accelerator_batch_share = 1 + static_cast<int>(rng() % (s.batch_size - 1));
    std::vector<int> divisors;
    for (int d = 1; d <= s.accelerator_batch_share; ++d) {
      if (s.accelerator_batch_share % d == 0) divisors.push_back(d);
    }
    s.micro_batch_size = divisors[rng() % divisors.size()];
    for (LayerDecisions& l : s.layers) l.update = tandem::v1::PLACEMENT_ACCELERATOR;
    PlanSimulator sim(chain.cost);
    ASSERT_TRUE(sim.Validate(s).ok()) << sim.Validate(s);
    for (bool timeline : {true, false}) {
      SimulationOptions fast_options, graph_options;
      fast_options.record_timeline = graph_options.record_timeline = timeline;
      graph_options.use_event_graph = true;
      absl::StatusOr<SimulationResult> fast = sim.Simulate(s, fast_options);
      absl::StatusOr<SimulationResult> graph = sim.Simulate(s, graph_options);
      ASSERT_TRUE(fast.ok()) << fast.status();
      ASSERT_TRUE(graph.ok()) << graph.status();
      const std::string where = "trial " + std::to_string(trial);
      ASSERT_EQ(fast->iterations_simulated, graph->iterations_simulated) << where;
      EXPECT_EQ(fast->prediction.SerializeAsString(), graph->prediction.SerializeAsString())
          << where << "\nrecurrences: " << fast->prediction.ShortDebugString()
          << "\nevent graph: " << graph->prediction.ShortDebugString();
      EXPECT_EQ(fast->timeline.SerializeAsString(), graph->timeline.SerializeAsString()) << where;
      ASSERT_EQ(fast->layers.size(), graph->layers.size());
      for (size_t l = 0; l < fast->layers.size(); ++l) {
        EXPECT_EQ(fast->layers[l].reuse_distance_seconds, graph->layers[l].reuse_distance_seconds)
            << where << " layer " << l;
        EXPECT_EQ(fast->layers[l].slack_seconds, graph->layers[l].slack_seconds) << where;
      }
      if (::testing::Test::HasFailure()) return;
      settled_early += timeline && graph->iterations_simulated < kMaxSimulatedIterations;
    }
  }
  EXPECT_GT(settled_early, 0);
}

// A uniform chain whose period alternates between two values, so that the
// run goes to the 64-iteration cap: the same answer there too.
TEST(HeteroReplicasTest, MatchesTheEventGraphWhenThePeriodNeverSettles) {
  tandem::v1::HardwareSpec spec;
  spec.mutable_host()->set_kind(tandem::v1::DEVICE_KIND_CPU);
  spec.mutable_host()->set_peak_matmul_flops_per_second(14e12);
  spec.mutable_host()->set_peak_vector_flops_per_second(14e12);
  spec.mutable_host()->set_memory_bandwidth_bytes_per_second(600e9);
  spec.mutable_host()->set_threads(112);
  spec.mutable_host()->set_launch_overhead_seconds(1e-6);
  tandem::v1::ProcessorSpec* gpu = spec.add_accelerators();
  gpu->set_kind(tandem::v1::DEVICE_KIND_CUDA);
  gpu->set_peak_matmul_flops_per_second(495e12);
  gpu->set_peak_vector_flops_per_second(67e12);
  gpu->set_memory_bandwidth_bytes_per_second(3.35e12);
  gpu->set_memory_bytes(int64_t{80} << 30);
  gpu->set_launch_overhead_seconds(5e-6);
  for (auto* link : {spec.mutable_host_to_accelerator(), spec.mutable_accelerator_to_host()}) {
    link->set_bandwidth_bytes_per_second(53.6e9);
    link->set_latency_seconds(10e-6);
  }
  absl::StatusOr<CostModel> cost =
      CostModel::FromHardwareSpec(testing::UniformChainProfile(20, 1024, 64), spec);
  ASSERT_TRUE(cost.ok()) << cost.status();
  Decisions s;
  s.strategy = tandem::v1::STRATEGY_HETERO_DP;
  s.layers.resize(cost->num_layers());
  s.batch_size = 64;
  s.accelerator_batch_share = 1;
  s.micro_batch_size = 1;
  s.host_update_threads = 112;
  PlanSimulator sim(*cost);
  SimulationOptions graph_options;
  graph_options.use_event_graph = true;
  absl::StatusOr<SimulationResult> fast = sim.Simulate(s);
  absl::StatusOr<SimulationResult> graph = sim.Simulate(s, graph_options);
  ASSERT_TRUE(fast.ok() && graph.ok());
  EXPECT_EQ(graph->iterations_simulated, kMaxSimulatedIterations);
  EXPECT_EQ(fast->iterations_simulated, graph->iterations_simulated);
  EXPECT_EQ(fast->prediction.SerializeAsString(), graph->prediction.SerializeAsString());
  EXPECT_EQ(fast->timeline.SerializeAsString(), graph->timeline.SerializeAsString());
}

}  // namespace
}  // namespace tandem::planner
