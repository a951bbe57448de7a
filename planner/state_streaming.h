// The third update place (docs/planning.md, "Streamed optimizer state"): a
// layer updates on the host (ZeRO-Offload's way: its gradient down, its
// weights back, 2-4 bytes per parameter each way), on the accelerator with
// its optimizer state resident for the whole run, or on the accelerator with
// its state (and, in mixed precision, its fp32 master weights) streamed in
// once its gradient is ready and back after the update (12-16 bytes per
// parameter each way, but an update many times faster than the host's, in
// memory that backward has freed).
//
// SearchStreamedState starts from a two-place answer (update_placement.h)
// and searches the three places with the simulator as the judge:
//
//   1. among the layers the answer updates on the host, which stream their
//      state instead: update_placement.h's local search over that subset
//      (runs by reuse distance from either end, greedy fill, descent);
//   2. steepest descent over single-layer moves to either other place (a
//      resident layer may stream, freeing its state for another layer's),
//      taking the fastest move that fits, until none improves or the
//      evaluations run out;
//   3. on chains of at most 12 movable layers (StreamSearchOptions), a
//      branch and bound over all 3^n placements seeded with that answer. It
//      prunes a partial placement whose lower bound on the iteration is not
//      below the best so far, or whose lower bound on the accelerator peak
//      is over the budget (state_streaming.cc, PlacementBound: each
//      resource's work, which is a sum over the layers' places; the compute
//      stream's wait for host-updated weights; the bytes kept throughout and
//      what a forward or a streamed update adds), built from 1 + 2n
//      simulations (every movable layer on the host, then each moved alone
//      to either other place). Every placement that survives is simulated
//      under every reachable prefetch distance and lag that lowers to a
//      step of its own (two that put each streamed layer's state copy and
//      update at the same places in the program lower to the same step, and
//      only the first is simulated), and checks the bounds: were a simulated
//      figure below its bound, the bound would be wrong and the answer is
//      not called exact.
//
// Where enumerating every placement (ExhaustivePlaces: all 3^n, each that
// streams under every reachable prefetch distance and lag) costs no more
// simulations than the local search may spend (n <= 4 movable layers at the
// default 2,000), it enumerates them instead (each distinct step once, as
// above). Either way the answer is exact
// (StreamSearchResult.exact says so); past 12 movable layers, or when the
// branch and bound runs out of simulations, it is the local search's
// (state_streaming_test and bench/planner/stream_stress check both against
// ExhaustivePlaces).
//
// Free functions; thread-compatible.
#ifndef TANDEM_PLANNER_STATE_STREAMING_H_
#define TANDEM_PLANNER_STATE_STREAMING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/decisions.h"
#include "planner/simulator.h"

namespace tandem::planner {

enum class UpdatePlace : int8_t { kHost, kResident, kStreamed };

// Per layer: where `decisions` update it.
std::vector<UpdatePlace> UpdatePlacesOf(const Decisions& decisions);
// `base` with layer l's update at places[l] where eligible[l].
Decisions WithUpdatePlaces(Decisions base, const std::vector<bool>& eligible,
                           const std::vector<UpdatePlace>& places);

struct StreamSearchOptions {
  // Simulations of the local search (steps 1 and 2).
  int64_t max_evaluations = 2000;
  // Chains of at most this many movable layers then get the branch and
  // bound (step 3) ...
  int exact_layers = 12;
  // ... within this many more simulations, where that lets it end
  // (bench/planner/stream_stress: on 2,000 chains of up to 8 layers 20,000
  // found every optimum, 2,000 missed 9; on 30 chains of 9 to 12 layers,
  // seed 7, once each leaf simulates only its distinct timings, 2,000 proved
  // 21 of the 28 feasible answers exact in 143 ms per chain, 20,000 proved 23
  // in 335 ms, 100,000 27 in 732 ms). Since the cheaper simulation
  // (docs/planning.md), 30,000 finds all 28 optima and proves 24 in 308 ms
  // a chain, where 20,000 missed one by 0.26% in 262 ms.
  int64_t max_exact_evaluations = 30000;
};

struct StreamSearchResult {
  // A placement faster than the start was found within the budget.
  bool improved = false;
  // The answer (`decisions` when improved, else the start) is the fastest of
  // every placement of the three places under every reachable prefetch
  // distance and lag that fits: it enumerated them all, or the branch and
  // bound ended within its simulations with its bound never contradicted.
  bool exact = false;
  // Simulations the branch and bound spent (0: it did not run).
  int64_t exact_evaluations = 0;
  Decisions decisions;
  SimulationResult simulation;
  int64_t evaluations = 0;
};

// From `start` (feasible under `budget_bytes`, iteration `start_seconds`).
StreamSearchResult SearchStreamedState(const PlanSimulator& simulator, const Decisions& start,
                                       double start_seconds, int64_t budget_bytes,
                                       const StreamSearchOptions& options = {});

// A lower bound on the accelerator peak of `d`'s layers under every update
// place, prefetch distance and lag: the weights it keeps there, and what the
// compute stream's own forwards and backwards hold whatever the updates do
// (activations kept until their backwards, workspaces, the gradients no
// update can have freed yet). SearchStreamedState spends no simulation
// where it is over the budget.
int64_t LeastAcceleratorPeakBytes(const CostModel& cost, const Decisions& d);

struct ExhaustiveResult {
  bool feasible = false;
  double iteration_seconds = 0;
  std::vector<UpdatePlace> places;
  int prefetch_layers = 1, update_lag = 0;
  int64_t evaluations = 0;
};

// Every combination of the three places over `base`'s UpdateEligibleLayers, each
// (where a layer streams) under every prefetch distance and update lag the
// search reaches (powers of two below the layer count, and lag 0): ~3^n
// log^2 n simulations, for small chains only. The fastest within the budget.
ExhaustiveResult ExhaustivePlaces(const PlanSimulator& simulator, const Decisions& base,
                                  int64_t budget_bytes);

// The branch and bound's lower bounds (step 3) on the iteration and the
// accelerator peak of `base` with its movable layers at `places` (by layer;
// the others keep theirs), under any prefetch distance and lag: built afresh
// from 1 + 2n simulations, for tests. FAILED_PRECONDITION when they cannot be
// built.
struct PlacementLowerBounds {
  double iteration_seconds = 0;
  int64_t accelerator_peak_bytes = 0;
};
absl::StatusOr<PlacementLowerBounds> StreamedPlacementLowerBounds(
    const PlanSimulator& simulator, const Decisions& base, const std::vector<UpdatePlace>& places);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_STATE_STREAMING_H_
