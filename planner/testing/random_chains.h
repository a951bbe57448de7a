// Random chains for the planner's property tests and stress benchmarks: layer
// times, sizes, link and host speeds, micro-batching, recompute and delayed
// updates drawn from a seeded generator, so that a failing instance is
// reproducible from its seed. Not for production code. Thread-compatible.
#ifndef TANDEM_PLANNER_TESTING_RANDOM_CHAINS_H_
#define TANDEM_PLANNER_TESTING_RANDOM_CHAINS_H_

#include <cstdint>
#include <random>
#include <vector>

#include "planner/cost_model.h"
#include "planner/decisions.h"

namespace tandem::planner::testing {

struct RandomChain {
  CostModel cost;
  // Every layer computes on the accelerator with resident weights, keeps or
  // recomputes its activations and updates on the host.
  Decisions base;
};

struct RandomChainOptions {
  // Durations on a grid of 1/4 s, zero included, so that events of different
  // resources often coincide (the simulator's tie rules get exercised).
  bool coarse_times = false;
};

// A chain of `layers` layers (one in five without parameters) drawn from `rng`.
RandomChain RandomResidentChain(int layers, std::mt19937* rng,
                                const RandomChainOptions& options = {});

// `s` with layers[l].update = ACCELERATOR where on_accelerator[l], else HOST.
Decisions WithUpdates(Decisions s, const std::vector<bool>& on_accelerator);

// Layers that may update on the accelerator: those with parameters.
std::vector<bool> LayersWithParameters(const CostModel& cost);

// An update-placement problem: a chain and a budget.
struct PlacementProblem {
  RandomChain chain;
  std::vector<bool> eligible;
  int64_t budget_bytes = 0;
};

// Problem number `trial` of a stream (placement_stress's): 1 + trial % 12
// layers, and a budget drawn from [low - 10%, high + 10%] of the way between
// the peak with every update on the host (low) and every eligible update on
// the accelerator (high).
PlacementProblem RandomPlacementProblem(int trial, std::mt19937* rng);
// The same with `layers` layers.
PlacementProblem RandomPlacementProblemOf(int layers, std::mt19937* rng);

}  // namespace tandem::planner::testing

#endif  // TANDEM_PLANNER_TESTING_RANDOM_CHAINS_H_
