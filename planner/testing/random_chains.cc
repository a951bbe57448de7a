#include "planner/testing/random_chains.h"

#include <cmath>
#include <cstdlib>
#include <utility>

#include "planner/simulator.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner::testing {

RandomChain RandomResidentChain(int layers, std::mt19937* rng, const RandomChainOptions& options) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // A duration drawn from [lo, lo + span).
  auto seconds = [&](double lo, double span) {
    const double x = lo + span * u(*rng);
    return options.coarse_times ? std::floor(4 * x) / 4 : x;
  };
  std::vector<SyntheticLayer> chain;
  for (int l = 0; l < layers; ++l) {
    SyntheticLayer x;
    x.name = "l";
    x.accelerator_forward_seconds = seconds(0.1, 1.9);
    x.accelerator_backward_seconds =
        options.coarse_times ? seconds(0.1, 3.9) : x.accelerator_forward_seconds * (1.5 + u(*rng));
    x.accelerator_update_seconds = seconds(0.01, 0.3);
    x.host_forward_seconds = 10 * x.accelerator_forward_seconds;
    x.host_backward_seconds = 10 * x.accelerator_backward_seconds;
    x.host_update_seconds = seconds(0.1, 3);
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
  if (options.coarse_times) {
    // Copies of whole quarter seconds per 100 bytes.
    node.h2d_bytes_per_second = node.d2h_bytes_per_second = 400;
    node.link_latency_seconds = 0;
  }
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(MeasuredChainProfile(chain, /*batch_size=*/2, node));
  if (!cost.ok()) std::abort();
  Decisions s;
  s.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
  s.layers.resize(layers);
  for (LayerDecisions& l : s.layers) {
    l.update = tandem::v1::PLACEMENT_HOST;
    if (u(*rng) < 0.25) l.activation = tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
  }
  s.batch_size = 2;
  s.micro_batch_size = u(*rng) < 0.3 ? 1 : 2;
  s.delayed_parameter_update = u(*rng) < 0.3;
  s.host_update_threads = 1;
  return {*std::move(cost), s};
}

Decisions WithUpdates(Decisions s, const std::vector<bool>& on_accelerator) {
  for (size_t l = 0; l < s.layers.size(); ++l) {
    s.layers[l].update =
        on_accelerator[l] ? tandem::v1::PLACEMENT_ACCELERATOR : tandem::v1::PLACEMENT_HOST;
  }
  return s;
}

std::vector<bool> LayersWithParameters(const CostModel& cost) {
  std::vector<bool> eligible(cost.num_layers());
  for (int l = 0; l < cost.num_layers(); ++l) eligible[l] = cost.ParameterBytes(l) > 0;
  return eligible;
}

PlacementProblem RandomPlacementProblem(int trial, std::mt19937* rng) {
  return RandomPlacementProblemOf(1 + trial % 12, rng);
}

PlacementProblem RandomPlacementProblemOf(int layers, std::mt19937* rng) {
  PlacementProblem p{RandomResidentChain(layers, rng), {}, 0};
  p.eligible = LayersWithParameters(p.chain.cost);
  const PlanSimulator simulator(p.chain.cost);
  SimulationOptions quiet;
  quiet.record_timeline = false;
  auto peak = [&](const std::vector<bool>& acc) {
    absl::StatusOr<SimulationResult> r = simulator.Simulate(WithUpdates(p.chain.base, acc), quiet);
    if (!r.ok()) std::abort();
    return r->prediction.accelerator_peak_bytes();
  };
  const int64_t low = peak(std::vector<bool>(layers, false));
  const int64_t high = peak(p.eligible);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  p.budget_bytes = low + static_cast<int64_t>((high - low) * (1.2 * u(*rng) - 0.1));
  return p;
}

}  // namespace tandem::planner::testing
