// Hand-computed timelines. Every layer time is seconds-scale so the measured
// per-call overhead (<= 5 us) only matters where micro-batches rescale times;
// those checks allow 1e-4 s.
#include "planner/simulator.h"

#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/cost_model.h"
#include "planner/state_streaming.h"
#include "planner/steady_state.h"
#include "planner/testing/random_chains.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

using tandem::v1::ACTIVATION_POLICY_KEEP;
using tandem::v1::ACTIVATION_POLICY_OFFLOAD;
using tandem::v1::ACTIVATION_POLICY_RECOMPUTE;
using tandem::v1::PARAMETER_HOME_ACCELERATOR;
using tandem::v1::PARAMETER_HOME_HOST;
using tandem::v1::PARAMETER_HOME_HOST_STREAMED;
using tandem::v1::PLACEMENT_ACCELERATOR;
using tandem::v1::PLACEMENT_HOST;
using testing::MeasuredChainProfile;
using testing::SyntheticLayer;
using testing::SyntheticNode;

constexpr double kTol = 1e-9;

SyntheticLayer Layer(double fwd, double bwd, int64_t param_bytes) {
  SyntheticLayer l;
  l.name = "l";
  l.accelerator_forward_seconds = fwd;
  l.accelerator_backward_seconds = bwd;
  l.accelerator_update_seconds = 0.5;
  l.host_forward_seconds = fwd;
  l.host_backward_seconds = bwd;
  l.host_update_seconds = 1.0;
  l.parameter_bytes = param_bytes;
  return l;
}

// 100 bytes per second both ways: a 100-byte gradient or weight copy is 1 s.
SyntheticNode SlowLink() {
  SyntheticNode node;
  node.h2d_bytes_per_second = 100;
  node.d2h_bytes_per_second = 100;
  return node;
}

CostModel Model(const std::vector<SyntheticLayer>& layers, int batch = 1,
                const SyntheticNode& node = SlowLink()) {
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(MeasuredChainProfile(layers, batch, node));
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *std::move(cost);
}

Decisions Uniform(int layers, tandem::v1::Placement update, int batch = 1) {
  Decisions s;
  s.strategy = tandem::v1::STRATEGY_REUSE_DISTANCE;
  s.layers.resize(layers);
  for (LayerDecisions& l : s.layers) l.update = update;
  s.batch_size = batch;
  s.micro_batch_size = batch;
  s.host_update_threads = 1;
  return s;
}

SimulationResult Simulated(const CostModel& cost, const Decisions& s) {
  PlanSimulator sim(cost);
  absl::StatusOr<SimulationResult> r = sim.Simulate(s);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : SimulationResult{};
}

// Spans of the reported iteration on `resource` with `phase`, by start time.
std::vector<tandem::v1::TimelineSpan> SpansOf(const SimulationResult& r,
                                              tandem::v1::TimelineResource resource,
                                              tandem::v1::TimelinePhase phase) {
  std::vector<tandem::v1::TimelineSpan> out;
  for (const tandem::v1::TimelineSpan& s : r.timeline.spans()) {
    if (s.resource() == resource && s.phase() == phase) out.push_back(s);
  }
  return out;
}

TEST(PlanSimulatorTest, GpuOnlyTwoLayersRunsBackToBack) {
  // fwd [1, 2], bwd [2, 4], accelerator update 0.5 each:
  //   F0 [0,1] F1 [1,3] B1 [3,7] U1 [7,7.5] B0 [7.5,9.5] U0 [9.5,10]
  std::vector<SyntheticLayer> layers = {Layer(1, 2, 100), Layer(2, 4, 200)};
  layers[0].activation_bytes = 1000;
  layers[0].workspace_bytes = 10;
  layers[1].activation_bytes = 2000;
  layers[1].workspace_bytes = 20;
  const CostModel cost = Model(layers);
  const SimulationResult r = Simulated(cost, Uniform(2, PLACEMENT_ACCELERATOR));
  EXPECT_NEAR(r.prediction.iteration_seconds(), 10.0, kTol);
  EXPECT_NEAR(r.prediction.accelerator_idle_seconds(), 0.0, kTol);
  EXPECT_NEAR(r.prediction.samples_per_second(), 0.1, kTol);
  EXPECT_EQ(r.prediction.h2d_bytes(), 0);
  EXPECT_EQ(r.prediction.d2h_bytes(), 0);
  const auto updates = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                               tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0].layer(), 1);
  EXPECT_NEAR(updates[0].start_seconds(), 7.0, kTol);
  EXPECT_NEAR(updates[1].start_seconds(), 9.5, kTol);
  // Static 300 (params) + 600 (Adam state); at B1's start: both activations
  // (3000), B1's workspace (20) and its gradient (200).
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 900 + 3000 + 20 + 200);
  EXPECT_EQ(r.prediction.host_peak_bytes(), 0);
  // Reuse distance of layer 1 (after its own update): B0 + U0 + next F0.
  EXPECT_NEAR(r.layers[1].reuse_distance_seconds, 2 + 0.5 + 1, kTol);
  EXPECT_NEAR(r.layers[0].reuse_distance_seconds, 0.0, kTol);
  EXPECT_EQ(r.layers[1].slack_seconds, 0.0);
}

// With gradient clipping every update waits for the norm of all gradients
// (read after the last backward, timed as nothing): the step above runs
//   F0 [0,1] F1 [1,3] B1 [3,7] B0 [7,9] U1 [9,9.5] U0 [9.5,10],
// and layer 1's gradient (200) stays until U1, past B0's start, where layer
// 0's (100) joins it: without activations or workspace, the peak is the
// static 900 and both gradients, against one at a time unclipped.
TEST(PlanSimulatorTest, ClippedUpdatesWaitForEveryGradientAndHoldThemAll) {
  const std::vector<SyntheticLayer> layers = {Layer(1, 2, 100), Layer(2, 4, 200)};
  CostModel cost = Model(layers);
  const Decisions d = Uniform(2, PLACEMENT_ACCELERATOR);
  EXPECT_EQ(Simulated(cost, d).prediction.accelerator_peak_bytes(), 900 + 200);
  cost.set_clips_gradients(true);
  const SimulationResult r = Simulated(cost, d);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 10.0, kTol);
  // The norm is an update-phase span of no layer, first.
  const auto updates = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                               tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(updates.size(), 3u);
  EXPECT_EQ(updates[0].layer(), -1);
  EXPECT_NEAR(updates[0].start_seconds(), 9.0, kTol);
  EXPECT_EQ(updates[1].layer(), 1);
  EXPECT_NEAR(updates[1].start_seconds(), 9.0, kTol);
  EXPECT_NEAR(updates[2].start_seconds(), 9.5, kTol);
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 900 + 200 + 100);
}

// zero_offload with clipping: the host updates no longer overlap backward.
//   F0 [0,1] F1 [1,2] B1 [2,4] B0 [4,6]; D2H1 [4,5] D2H0 [6,7]; the norm
//   once both are down (7); U1 [7,8] U0 [8,9]; H2D1 [8,9] H2D0 [9,10]:
// the next F0 at 10, against 9 unclipped (the next test's step).
TEST(PlanSimulatorTest, ClippedHostUpdatesStartOnceEveryGradientIsDown) {
  CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  cost.set_clips_gradients(true);
  const SimulationResult r = Simulated(cost, Uniform(2, PLACEMENT_HOST));
  EXPECT_NEAR(r.prediction.iteration_seconds(), 10.0, kTol);
  const auto updates =
      SpansOf(r, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_NEAR(updates[0].start_seconds(), 7.0, kTol);
  EXPECT_NEAR(updates[1].start_seconds(), 8.0, kTol);
}

// The same zero_offload step as one of 2 data-parallel ranks, each layer its
// own bucket and every collective 1 s (the executor's rank program):
//   layer 1: D2H [4,5] ALL_REDUCE [5,6] update [6,7] H2D [7,8]
//   layer 0: D2H [6,7] ALL_REDUCE [7,8] update [8,9] H2D [9,10]
// so the next F0 starts at 10. Partitioned, the host steps half of each
// layer (0.5 s) after a REDUCE_SCATTER, and the weights wait for the
// ALL_GATHERs, which follow every bucket's sum in bucket order:
//   RS1 [5,6] U1 [6,6.5]; RS0 [7,8] U0 [8,8.5]; AG1 [8,9] H2D1 [9,10];
//   AG0 [9,10] H2D0 [10,11]: the next F0 at 11.
TEST(PlanSimulatorTest, ARanksCollectivesAreTimedOnTheNetworkStream) {
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  const Decisions d = Uniform(2, PLACEMENT_HOST);
  PlanSimulator sim(cost);
  SimulationOptions ranks;
  ranks.ranks = 2;
  ranks.bucket_bytes = 1;
  EXPECT_EQ(sim.Simulate(d, ranks).status().code(), absl::StatusCode::kInvalidArgument);
  ranks.collective_seconds = [](schedule::OpKind, int64_t) { return 1.0; };
  absl::StatusOr<SimulationResult> r = sim.Simulate(d, ranks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->prediction.iteration_seconds(), 10.0, kTol);
  const auto reduces =
      SpansOf(*r, tandem::v1::TIMELINE_RESOURCE_NETWORK, tandem::v1::TIMELINE_PHASE_ALL_REDUCE);
  ASSERT_EQ(reduces.size(), 2u);
  EXPECT_NEAR(reduces[0].start_seconds(), 5.0, kTol);
  EXPECT_NEAR(reduces[1].start_seconds(), 7.0, kTol);

  ranks.partition_host_state = true;
  r = sim.Simulate(d, ranks);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->prediction.iteration_seconds(), 11.0, kTol);
  const auto updates =
      SpansOf(*r, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE, tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(updates.size(), 2u);
  for (const auto& u : updates) EXPECT_NEAR(u.end_seconds() - u.start_seconds(), 0.5, kTol);
  EXPECT_EQ(
      SpansOf(*r, tandem::v1::TIMELINE_RESOURCE_NETWORK, tandem::v1::TIMELINE_PHASE_ALL_GATHER)
          .size(),
      2u);
}

TEST(PlanSimulatorTest, HostUpdatesThatMissTheirReuseDistanceStallTheAccelerator) {
  // fwd 1, bwd 2, 1 s copies, 1 s host updates (zero_offload):
  //   F0 [0,1] F1 [1,2] B1 [2,4] B0 [4,6]
  //   layer 1: D2H [4,5] update [5,6] H2D [6,7]
  //   layer 0: D2H [6,7] update [7,8] H2D [8,9]
  // The next F0 waits until 9 (stall 3); F1 needs its weights at 10, has them
  // at 7.
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  const SimulationResult r = Simulated(cost, Uniform(2, PLACEMENT_HOST));
  EXPECT_NEAR(r.prediction.iteration_seconds(), 9.0, kTol);
  EXPECT_NEAR(r.prediction.accelerator_stall_seconds(), 3.0, kTol);
  EXPECT_NEAR(r.prediction.accelerator_idle_seconds(), 3.0, kTol);
  EXPECT_EQ(r.prediction.d2h_bytes(), 200);
  EXPECT_EQ(r.prediction.h2d_bytes(), 200);
  EXPECT_NEAR(r.prediction.host_update_idle_seconds(), 7.0, kTol);
  EXPECT_NEAR(r.layers[0].reuse_distance_seconds, 0.0, kTol);
  EXPECT_NEAR(r.layers[0].slack_seconds, -3.0, kTol);
  EXPECT_NEAR(r.layers[1].reuse_distance_seconds, 3.0, kTol);
  EXPECT_NEAR(r.layers[1].slack_seconds, 0.0, kTol);
  const auto returns =
      SpansOf(r, tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D);
  ASSERT_EQ(returns.size(), 2u);
  EXPECT_NEAR(returns[1].start_seconds(), 8.0, kTol);
  EXPECT_EQ(returns[1].layer(), 0);
  // Host: master weights, gradient and Adam state of both layers.
  EXPECT_EQ(r.prediction.host_peak_bytes(), 2 * (100 + 100 + 200));
}

TEST(PlanSimulatorTest, UpdatingTheShortestReuseDistanceOnTheAcceleratorRemovesTheStall) {
  // As above with layer 0 updated on the accelerator (0.5 s after B0):
  //   F0 [0,1] F1 [1,2] B1 [2,4] B0 [4,6] U0 [6,6.5]; layer 1's chain ends at
  //   7, next F1 starts at 7.5. Period 6.5, slack of layer 1 = 3.5 - 3.
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  Decisions s = Uniform(2, PLACEMENT_HOST);
  s.layers[0].update = PLACEMENT_ACCELERATOR;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 6.5, kTol);
  EXPECT_NEAR(r.prediction.accelerator_stall_seconds(), 0.0, kTol);
  EXPECT_NEAR(r.layers[1].slack_seconds, 0.5, kTol);
  EXPECT_EQ(r.layers[0].slack_seconds, 0.0);
}

TEST(PlanSimulatorTest, DelayedParameterUpdateHidesTheHostChain) {
  // The zero_offload case above with DPU: the next forward of iteration k+1
  // waits for iteration k-1's update, which ended long before. Period = the
  // compute program, 6.
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  Decisions s = Uniform(2, PLACEMENT_HOST);
  s.delayed_parameter_update = true;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 6.0, kTol);
  EXPECT_NEAR(r.prediction.accelerator_stall_seconds(), 0.0, kTol);
  // Slack counts one more iteration: layer 0 has 0 + 6 - 3.
  EXPECT_NEAR(r.layers[0].slack_seconds, 3.0, kTol);
}

TEST(PlanSimulatorTest, DelayedUpdatesCannotOutrunAnOverloadedHostPool) {
  // Host updates of 5 s per layer: 10 s of host work per 6 s of accelerator
  // work. With DPU the backlog settles where the pool is always busy: the
  // period is the pool's 10 s.
  std::vector<SyntheticLayer> layers = {Layer(1, 2, 100), Layer(1, 2, 100)};
  for (SyntheticLayer& l : layers) l.host_update_seconds = 5.0;
  const CostModel cost = Model(layers);
  Decisions s = Uniform(2, PLACEMENT_HOST);
  s.delayed_parameter_update = true;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 10.0, 1e-6);
  EXPECT_NEAR(r.prediction.host_update_idle_seconds(), 0.0, 1e-6);
}

TEST(PlanSimulatorTest, StreamedParametersArePrefetchedAndFreed) {
  // One layer, weights streamed (100 B, 1 s copies), fwd 1, bwd 2, host
  // update 1. Iteration at s: F [s,s+1]; backward copy issued at F's start
  // [s,s+1]; B [s+1,s+3]; D2H [s+3,s+4]; update [s+4,s+5]; the next forward's
  // copy (issued when B started) waits for the update: [s+5,s+6]. Period 6.
  std::vector<SyntheticLayer> layers = {Layer(1, 2, 100)};
  layers[0].activation_bytes = 1000;
  const CostModel cost = Model(layers);
  Decisions s = Uniform(1, PLACEMENT_HOST);
  s.layers[0].parameter_home = PARAMETER_HOME_HOST_STREAMED;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 6.0, kTol);
  EXPECT_EQ(r.prediction.h2d_bytes(), 200);
  EXPECT_EQ(r.prediction.d2h_bytes(), 100);
  // At s: the forward's weights (copied in [s-1,s]), the backward's copy
  // starting, and the activation: 100 + 100 + 1000. Nothing resident.
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 1200);
  const auto copies =
      SpansOf(r, tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_PARAMETER_H2D);
  ASSERT_EQ(copies.size(), 2u);
  // Memory falls to zero once the gradient has left and before the next copy.
  int64_t lowest = INT64_MAX;
  for (const auto& m : r.timeline.accelerator_memory()) lowest = std::min(lowest, m.bytes());
  EXPECT_EQ(lowest, 0);
}

std::vector<SyntheticLayer> ActivationChain(const std::vector<int64_t>& activation_bytes) {
  std::vector<SyntheticLayer> layers;
  for (int64_t a : activation_bytes) {
    SyntheticLayer l = Layer(1, 2, 0);
    l.activation_bytes = a;
    l.output_bytes = 20;
    layers.push_back(l);
  }
  return layers;
}

TEST(PlanSimulatorTest, OffloadedActivationsLeaveTheDeviceBetweenForwardAndBackward) {
  // Activations [100, 50, 50], no parameters; layer 0 offloaded (1 s copies).
  //   F0 [0,1] F1 [1,2] F2 [2,3] B2 [3,5] B1 [5,7] B0 [7,9]
  //   D2H act0 [1,2]; its H2D is issued when B1 starts: [5,6].
  // Device: 100, 150, (t=2: -100 +50) 100, (t=5: -50 +100) 150, ... peak 150
  // instead of 200 kept; time unchanged.
  const CostModel cost = Model(ActivationChain({100, 50, 50}));
  Decisions s = Uniform(3, PLACEMENT_ACCELERATOR);
  const SimulationResult keep = Simulated(cost, s);
  EXPECT_EQ(keep.prediction.accelerator_peak_bytes(), 200);
  s.layers[0].activation = ACTIVATION_POLICY_OFFLOAD;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 9.0, kTol);
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 150);
  EXPECT_EQ(r.prediction.host_peak_bytes(), 100);
  const auto fetch =
      SpansOf(r, tandem::v1::TIMELINE_RESOURCE_COPY_H2D, tandem::v1::TIMELINE_PHASE_ACTIVATION_H2D);
  ASSERT_EQ(fetch.size(), 1u);
  EXPECT_NEAR(fetch[0].start_seconds(), 5.0, kTol);
  EXPECT_NEAR(fetch[0].end_seconds(), 6.0, kTol);
}

TEST(PlanSimulatorTest, RecomputeKeepsOnlyTheCheckpointAndRerunsTheForward) {
  // Activations [100, 50, 50, 50], layer 1 recomputed; layer 0's output (20 B)
  // is its checkpoint. F0..F3 [0,4], B3 [4,6], B2 [6,8], R1 [8,9], B1 [9,11],
  // B0 [11,13]. 30 B leave when F2 ends (t=3): peak 220 at t=3 instead of 250.
  const CostModel cost = Model(ActivationChain({100, 50, 50, 50}));
  Decisions s = Uniform(4, PLACEMENT_ACCELERATOR);
  EXPECT_EQ(Simulated(cost, s).prediction.accelerator_peak_bytes(), 250);
  s.layers[1].activation = ACTIVATION_POLICY_RECOMPUTE;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 13.0, kTol);
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 220);
  const auto recompute = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                                 tandem::v1::TIMELINE_PHASE_RECOMPUTE);
  ASSERT_EQ(recompute.size(), 1u);
  EXPECT_EQ(recompute[0].layer(), 1);
  EXPECT_NEAR(recompute[0].start_seconds(), 8.0, kTol);
}

TEST(PlanSimulatorTest, MicroBatchesAccumulateGradientsThenUpdateOnce) {
  // Batch 2 profiled as fwd 2, bwd 4; micro-batches of 1 take ~half each:
  //   F [0,1] B [1,3] F [3,4] B [4,6] U [6,6.5]. Activations halve; the
  // gradient is held from the first backward to the update.
  std::vector<SyntheticLayer> layers = {Layer(2, 4, 100)};
  layers[0].activation_bytes = 1000;
  const CostModel cost = Model(layers, /*batch=*/2);
  Decisions s = Uniform(1, PLACEMENT_ACCELERATOR, /*batch=*/2);
  s.micro_batch_size = 1;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 6.5, 1e-4);
  const auto updates = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                               tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_NEAR(updates[0].start_seconds(), 6.0, 1e-4);
  const auto backward = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                                tandem::v1::TIMELINE_PHASE_BACKWARD);
  ASSERT_EQ(backward.size(), 2u);
  EXPECT_EQ(backward[1].micro_batch(), 1);
  // Static 100 + 200; activation 500 per micro-batch; gradient 100.
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 300 + 500 + 100);
}

TEST(PlanSimulatorTest, HeteroDpRunsBothReplicasThenSynchronisesGradients) {
  // Batch 2, one sample each. Accelerator: F [0,1] B [1,3]; host (twice as
  // slow): F [0,2] B [2,6]. Sync: D2H [3,4], average [6,7] (after the host's
  // backward), H2D [7,8]; host update [7,8]; accelerator update [8,8.5]. The
  // host replica's next forward starts at 8, which starts the next iteration.
  std::vector<SyntheticLayer> layers = {Layer(2, 4, 100)};
  layers[0].host_forward_seconds = 4;
  layers[0].host_backward_seconds = 8;
  SyntheticNode node = SlowLink();
  // Average = 3 * 100 B / (500 B/s * 0.6 elementwise efficiency) = 1 s.
  node.host_memory_bytes_per_second = 500;
  const CostModel cost = Model(layers, /*batch=*/2, node);
  Decisions s = Uniform(1, PLACEMENT_ACCELERATOR, /*batch=*/2);
  s.strategy = tandem::v1::STRATEGY_HETERO_DP;
  s.accelerator_batch_share = 1;
  s.micro_batch_size = 1;
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 8.0, 1e-4);
  const auto sync_avg = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_HOST_UPDATE,
                                tandem::v1::TIMELINE_PHASE_GRADIENT_SYNC);
  ASSERT_EQ(sync_avg.size(), 1u);
  EXPECT_NEAR(sync_avg[0].start_seconds(), 6.0, 1e-4);
  const auto acc_update = SpansOf(r, tandem::v1::TIMELINE_RESOURCE_ACCELERATOR_COMPUTE,
                                  tandem::v1::TIMELINE_PHASE_UPDATE);
  ASSERT_EQ(acc_update.size(), 1u);
  EXPECT_NEAR(acc_update[0].start_seconds(), 8.0, 1e-4);
  EXPECT_EQ(r.prediction.d2h_bytes(), 100);
  EXPECT_EQ(r.prediction.h2d_bytes(), 100);
}

TEST(PlanSimulatorTest, CpuOnlyComputesAndUpdatesOnTheHost) {
  // Host: F0 [0,1] F1 [1,2] B1 [2,4] B0 [4,6]; updates U1 [4,5], U0 [6,7];
  // the next F0 waits for U0: period 7.
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  Decisions s = Uniform(2, PLACEMENT_HOST);
  s.strategy = tandem::v1::STRATEGY_CPU_ONLY;
  for (LayerDecisions& l : s.layers) {
    l.compute = PLACEMENT_HOST;
    l.parameter_home = PARAMETER_HOME_HOST;
  }
  const SimulationResult r = Simulated(cost, s);
  EXPECT_NEAR(r.prediction.iteration_seconds(), 7.0, kTol);
  EXPECT_EQ(r.prediction.accelerator_peak_bytes(), 0);
  EXPECT_NEAR(r.prediction.host_compute_idle_seconds(), 1.0, kTol);
  EXPECT_EQ(r.prediction.host_peak_bytes(), 2 * 400);
}

TEST(PlanSimulatorTest, RejectsPlansTheExecutorCannotRun) {
  const CostModel cost = Model({Layer(1, 2, 100), Layer(1, 2, 100)});
  PlanSimulator sim(cost);
  Decisions s = Uniform(2, PLACEMENT_ACCELERATOR);
  s.layers[1].parameter_home = PARAMETER_HOME_HOST_STREAMED;
  absl::StatusOr<SimulationResult> r = sim.Simulate(s);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("plan.layers[1].update"), std::string::npos) << r.status();
  s = Uniform(2, PLACEMENT_ACCELERATOR, 4);
  s.micro_batch_size = 3;
  r = sim.Simulate(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("plan.micro_batch_size"), std::string::npos);
  s = Uniform(3, PLACEMENT_ACCELERATOR);
  EXPECT_FALSE(sim.Simulate(s).ok());
}

// A steady period is at least the work of each resource. Random chains of 1
// to 8 layers, each eligible layer at a random place of the three and a
// random prefetch distance and lag, delayed updates as the chain draws
// them: a resource whose backlog grows slowly (streamed state going back, a
// pool behind delayed updates) can show two equal periods shorter than its
// work before anything waits on it, which the simulator must not report
// (it did, on instances of bench/planner/stream_stress). The fast path and
// the event graph agree on it.
TEST(PlanSimulatorTest, NoPeriodIsShorterThanAResourcesWork) {
  std::mt19937 rng(5);
  int long_runs = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    testing::PlacementProblem p = testing::RandomPlacementProblemOf(1 + trial % 8, &rng);
    std::vector<UpdatePlace> places(p.eligible.size(), UpdatePlace::kHost);
    for (UpdatePlace& x : places) x = static_cast<UpdatePlace>(rng() % 3);
    Decisions d = WithUpdatePlaces(p.chain.base, p.eligible, places);
    d.state_prefetch_layers = 1 << (rng() % 3);
    d.state_update_lag = static_cast<int>(rng() % 4);
    const PlanSimulator simulator(p.chain.cost);
    if (!simulator.Validate(d).ok()) continue;
    double seconds[2];
    for (bool graph : {false, true}) {
      SimulationOptions options;
      options.record_timeline = false;
      options.use_event_graph = graph;
      absl::StatusOr<SimulationResult> r = simulator.Simulate(d, options);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->resource_work_seconds.size(), tandem::v1::TimelineResource_ARRAYSIZE);
      seconds[graph] = r->prediction.iteration_seconds();
      for (double work : r->resource_work_seconds) {
        EXPECT_GE(seconds[graph], work * (1 - 1e-9)) << "trial " << trial << " graph " << graph;
      }
      long_runs += graph && r->iterations_simulated >= kMaxSimulatedIterations;
    }
    EXPECT_EQ(seconds[0], seconds[1]) << "trial " << trial;
  }
  std::cout << long_runs << " of 4000 ran " << kMaxSimulatedIterations << " iterations or more\n";
}

}  // namespace
}  // namespace tandem::planner
