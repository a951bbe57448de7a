#include "planner/pipeline_partitioner.h"

#include <functional>
#include <iostream>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

// Layer times and sizes from `rng`; a peer link at 100 bytes per second.
CostModel RandomChain(int layers, std::mt19937* rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<testing::SyntheticLayer> chain;
  for (int l = 0; l < layers; ++l) {
    testing::SyntheticLayer x;
    x.name = "l";
    x.accelerator_forward_seconds = 0.1 + u(*rng);
    x.accelerator_backward_seconds = 2 * x.accelerator_forward_seconds;
    x.host_forward_seconds = x.host_backward_seconds = 1;
    x.parameter_bytes = 100 + static_cast<int64_t>(900 * u(*rng));
    // Activations as large as the state, so that holding one micro-batch's
    // at a time (recomputing or offloading them) is what fits some splits.
    x.activation_bytes = static_cast<int64_t>(2000 * u(*rng));
    x.output_bytes = static_cast<int64_t>(200 * u(*rng));
    chain.push_back(x);
  }
  tandem::v1::Profile profile = testing::MeasuredChainProfile(chain, 4);
  tandem::v1::LinkProfile* peer = profile.add_links();
  peer->set_direction(tandem::v1::LINK_DIRECTION_DEVICE_TO_DEVICE);
  peer->set_pinned(true);
  peer->set_bandwidth_bytes_per_second(100);
  absl::StatusOr<CostModel> cost = CostModel::FromMeasuredProfile(profile);
  EXPECT_TRUE(cost.ok()) << cost.status();
  return *std::move(cost);
}

// Stage k of S holding layers [i, j), by brute force: its time per
// micro-batch as it holds its layers, or (where it does not fit) the mix
// that fits and adds least, of recomputing (one micro-batch's activations,
// every one's input, one more forward) or offloading the activations (two
// micro-batches' activations at most, and what of their copies down and back
// the compute does not hide; or one, waiting for every copy), and offloading
// the optimizer state of the fewest last layers that fit; HUGE_VAL when
// nothing fits.
double StageByBruteForce(const CostModel& cost, const PipelineRequest& r, int k, int S, int i,
                         int j) {
  const int m = r.micro_batch_size;
  double t = 0, forward = 0, copies = 0;
  int64_t state = 0, act = 0;
  // Per layer of the stage: its optimizer state, and what updating it on the
  // host adds.
  std::vector<int64_t> optimizer;
  std::vector<double> extra;
  for (int l = i; l < j; ++l) {
    forward += cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m);
    t += cost.ForwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m) +
         cost.BackwardSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, m);
    state += cost.ParameterBytes(l) + cost.GradientBytes(l) + cost.OptimizerStateBytes(l);
    optimizer.push_back(cost.OptimizerStateBytes(l));
    act += cost.ActivationBytes(l, m);
    copies +=
        cost.CopySeconds(tandem::v1::LINK_DIRECTION_DEVICE_TO_HOST, cost.ActivationBytes(l, m)) +
        cost.CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, cost.ActivationBytes(l, m));
    extra.push_back(OffloadedUpdateSeconds(cost, l, r.host_threads) -
                    cost.UpdateSeconds(l, tandem::v1::PLACEMENT_ACCELERATOR, 1));
  }
  const int64_t input = i > 0 ? cost.OutputBytes(i - 1, m) : 0;  // the stage's input
  const int64_t in_flight = r.gpipe ? r.micro_batches : std::min(S - k, r.micro_batches);
  // Over a peer link, the input's gradient waiting for its pull.
  state += cost.has_peer_link() ? input : 0;
  if (r.device_memory_bytes <= 0 || state + in_flight * (act + input) <= r.device_memory_bytes) {
    return t;
  }
  double best_added = HUGE_VAL, best_t = HUGE_VAL;
  // keep, recompute, offload activations beside the compute, and waiting
  // for each copy
  for (int hold = 0; hold < 4; ++hold) {
    if ((hold == 1 && !r.allow_recompute) || (hold >= 2 && !r.allow_offload_activations)) {
      continue;
    }
    const int64_t held = hold == 0 ? in_flight : hold == 2 ? std::min<int64_t>(in_flight, 2) : 1;
    const double per_micro_batch = hold == 1   ? forward
                                   : hold == 2 ? std::max(0.0, copies - t)
                                   : hold == 3 ? copies
                                               : 0.0;
    // Without offloading (not for keeping: that did not fit), and with the
    // last n layers' optimizer state on the host, the fewest n that fit.
    int64_t offloaded = 0;
    double offloaded_extra = 0;
    for (int n = hold == 0 ? 1 : 0; n <= j - i; ++n) {
      if (n > 0 && !r.allow_offload) break;
      if (n > 0) {
        offloaded += optimizer[j - i - n];
        offloaded_extra += extra[j - i - n];
      }
      if (state - offloaded + in_flight * input + held * act > r.device_memory_bytes) continue;
      const double added = (r.micro_batches + S - 1) * per_micro_batch +
                           (n > 0 ? std::max(0.0, offloaded_extra) : 0.0);
      if (added < best_added) {
        best_added = added;
        best_t = t + per_micro_batch;
      }
      if (n > 0) break;  // the fewest that fit
    }
  }
  return best_t;
}

// Every split of `layers` into `stages` contiguous non-empty ranges.
double BruteForce(const CostModel& cost, const PipelineRequest& r) {
  const int L = cost.num_layers();
  const int S = std::min(r.devices, L);
  double best = HUGE_VAL;
  std::vector<int> starts = {0};
  std::function<void(int)> split = [&](int from) {
    if (static_cast<int>(starts.size()) == S) {
      double slowest = 0;
      for (int k = 0; k < S; ++k) {
        const int i = starts[k], j = k + 1 < S ? starts[k + 1] : L;
        slowest = std::max(slowest, StageByBruteForce(cost, r, k, S, i, j));
        if (j < L) {
          slowest = std::max(slowest,
                             2 * cost.PeerCopySeconds(cost.OutputBytes(j - 1, r.micro_batch_size)));
        }
      }
      best = std::min(best, slowest);
      return;
    }
    for (int next = from + 1; next < L; ++next) {
      starts.push_back(next);
      split(next);
      starts.pop_back();
    }
  };
  split(0);
  return best;
}

TEST(PipelinePartitionerTest, MatchesBruteForce) {
  std::mt19937 rng(5);
  int recomputing = 0, sending = 0, waiting = 0, offloading = 0, partly = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int layers = 2 + trial % 9;
    const CostModel cost = RandomChain(layers, &rng);
    PipelineRequest r;
    r.devices = 2 + trial % 3;
    r.micro_batch_size = 4;
    r.micro_batches = 1 + trial % 4;
    // Half the trials have a memory limit that rules some splits out; some of
    // those may recompute a stage's activations to fit, under GPipe's
    // holding of every micro-batch.
    r.device_memory_bytes = trial % 2 ? 0 : 2500 + static_cast<int64_t>(rng() % 12000);
    r.allow_recompute = trial % 3 == 0;
    r.allow_offload = trial % 6 == 0;
    r.allow_offload_activations = trial % 5 == 0;
    r.gpipe = trial % 8 == 0;
    const double truth = BruteForce(cost, r);
    absl::StatusOr<std::vector<tandem::v1::PipelineStage>> stages = PartitionPipeline(cost, r);
    if (truth == HUGE_VAL) {
      ASSERT_FALSE(stages.ok()) << "trial " << trial;
      EXPECT_EQ(stages.status().code(), absl::StatusCode::kResourceExhausted);
      continue;
    }
    ASSERT_TRUE(stages.ok()) << "trial " << trial << ": " << stages.status();
    EXPECT_NEAR(BottleneckSeconds(*stages), truth, 1e-12) << "trial " << trial;
    ASSERT_EQ(static_cast<int>(stages->size()), std::min(r.devices, layers));
    EXPECT_EQ(stages->front().first_layer(), 0);
    EXPECT_EQ(stages->back().last_layer(), layers - 1);
    for (const tandem::v1::PipelineStage& s : *stages) {
      if (r.device_memory_bytes > 0) {
        EXPECT_LE(s.memory_bytes(), r.device_memory_bytes);
      }
      EXPECT_FALSE(s.recompute() && s.offload_activations()) << "trial " << trial;
      EXPECT_TRUE(!s.wait_for_activation_copies() || s.offload_activations()) << "trial " << trial;
      recomputing += s.recompute();
      sending += s.offload_activations();
      waiting += s.wait_for_activation_copies();
      partly += s.offload_optimizer() && s.host_updated_layers() > 0;
      offloading += s.offload_optimizer();
    }
  }
  // Both ways of holding fewer micro-batches' activations were chosen
  // somewhere.
  EXPECT_GT(recomputing, 0);
  EXPECT_GT(sending, 0);
  std::cout << recomputing << " stages recompute, " << sending << " offload their activations, "
            << waiting << " of them waiting for the copies; " << offloading
            << " keep optimizer state on the host, " << partly
            << " of them only their last layers'\n";
  EXPECT_GT(partly, 0);
}

// Four layers of 1 s each way, 1000 bytes of weights, 10 of activations and
// output.
std::vector<testing::SyntheticLayer> FourEqualLayers() {
  std::vector<testing::SyntheticLayer> chain(4);
  for (testing::SyntheticLayer& x : chain) {
    x.name = "l";
    x.accelerator_forward_seconds = x.accelerator_backward_seconds = 1;
    x.host_forward_seconds = x.host_backward_seconds = 1;
    x.parameter_bytes = 1000;
    x.activation_bytes = 10;
    x.output_bytes = 10;
  }
  return chain;
}

// Two stages, `micro_batches` micro-batches of one sample.
PipelineRequest TwoStages(int micro_batches) {
  PipelineRequest r;
  r.devices = 2;
  r.micro_batch_size = 1;
  r.micro_batches = micro_batches;
  return r;
}

// A caller that has gone ends the partition (its work grows with stages x
// layers^2) with CANCELLED.
TEST(PartitionPipelineTest, ACallerThatHasGoneStopsThePartition) {
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(FourEqualLayers(), 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(2);
  int asked = 0;
  r.stop = [&asked] { return ++asked >= 2; };
  EXPECT_EQ(PartitionPipeline(*cost, r).status().code(), absl::StatusCode::kCancelled);
  r.stop = [] { return false; };
  EXPECT_TRUE(PartitionPipeline(*cost, r).ok());
}

// A stage holds its input (the stage before's output) for every micro-batch
// in flight, as the pipeline runner does: all M under GPipe, K - k under 1F1B.
TEST(PartitionPipelineTest, StageMemoryCountsItsInputPerMicroBatchInFlight) {
  std::vector<testing::SyntheticLayer> chain = FourEqualLayers();
  chain[1].output_bytes = 5000;  // what stage 1 of a 2-2 split receives
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(chain, 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(6);
  for (bool gpipe : {false, true}) {
    r.gpipe = gpipe;
    absl::StatusOr<std::vector<tandem::v1::PipelineStage>> stages = PartitionPipeline(*cost, r);
    ASSERT_TRUE(stages.ok()) << stages.status();
    ASSERT_EQ((*stages)[1].first_layer(), 2);
    const int64_t state =
        2 * (cost->ParameterBytes(2) + cost->GradientBytes(2) + cost->OptimizerStateBytes(2));
    const int64_t in_flight = gpipe ? 6 : 1;
    EXPECT_EQ((*stages)[1].memory_bytes(),
              state + in_flight * (cost->ActivationBytes(2, 1) + cost->ActivationBytes(3, 1) +
                                   cost->OutputBytes(1, 1)))
        << (gpipe ? "gpipe" : "1f1b");
  }
}

// GPipe's re-materialisation: with 8 micro-batches of 100 bytes of
// activations per layer, a 2-2 split needs 8 x 200 + state per stage; at less,
// a stage recomputes (one micro-batch's activations, one more forward each) and
// only where it must; without allow_recompute (or with PipeDream's stashed
// weights) nothing fits.
TEST(PartitionPipelineTest, AStageRecomputesOnlyWhenItFitsNoOtherWay) {
  std::vector<testing::SyntheticLayer> chain = FourEqualLayers();
  for (testing::SyntheticLayer& x : chain) x.activation_bytes = 100;
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(chain, 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(8);
  r.gpipe = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> roomy = PartitionPipeline(*cost, r);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  const tandem::v1::PipelineStage whole = (*roomy)[0];
  ASSERT_EQ(whole.last_layer(), 1);
  EXPECT_FALSE(whole.recompute());
  const int64_t state =
      whole.memory_bytes() - 8 * (cost->ActivationBytes(0, 1) + cost->ActivationBytes(1, 1));
  // Room for stage 0's state and a third of its activations.
  r.device_memory_bytes = state + 8 * 200 / 3;
  EXPECT_FALSE(PartitionPipeline(*cost, r).ok());
  r.allow_recompute = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> tight = PartitionPipeline(*cost, r);
  ASSERT_TRUE(tight.ok()) << tight.status();
  for (const tandem::v1::PipelineStage& st : *tight) {
    EXPECT_TRUE(st.recompute()) << "stage " << st.device_index();
    EXPECT_LE(st.memory_bytes(), r.device_memory_bytes);
    // Two layers: 2 s forward and back each, and the forward again.
    EXPECT_DOUBLE_EQ(st.compute_seconds(), 4 + 2) << "stage " << st.device_index();
  }
  EXPECT_EQ((*tight)[0].memory_bytes(), state + 200);
  r.stash_weights = true;
  r.gpipe = false;
  EXPECT_FALSE(PartitionPipeline(*cost, r).ok()) << "PipeDream does not recompute";
}

// ZeRO-Offload within a stage: where a stage's state does not fit but its
// weights and gradients do, it keeps the optimizer state of its fewest last
// layers that make it fit on the host (and updates them there): one of its
// two layers' at room for half of it, both at room for none; recomputing
// would not help (its activations are small).
TEST(PartitionPipelineTest, AStageOffloadsItsOptimizerStateWhenOnlyThatFits) {
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(FourEqualLayers(), 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(2);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> roomy = PartitionPipeline(*cost, r);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  const int64_t whole = (*roomy)[0].memory_bytes();
  const int64_t optimizer = cost->OptimizerStateBytes(0) + cost->OptimizerStateBytes(1);
  ASSERT_GT(optimizer, 0);
  r.device_memory_bytes = whole - optimizer / 2;
  r.allow_recompute = true;
  EXPECT_FALSE(PartitionPipeline(*cost, r).ok()) << "recomputing does not make it fit";
  r.allow_offload = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> tight = PartitionPipeline(*cost, r);
  ASSERT_TRUE(tight.ok()) << tight.status();
  for (const tandem::v1::PipelineStage& st : *tight) {
    EXPECT_TRUE(st.offload_optimizer()) << "stage " << st.device_index();
    EXPECT_EQ(st.host_updated_layers(), 1) << "stage " << st.device_index();
    EXPECT_EQ(HostUpdatedFrom(st), st.last_layer()) << "stage " << st.device_index();
    EXPECT_FALSE(st.recompute()) << "stage " << st.device_index();
    EXPECT_LE(st.memory_bytes(), r.device_memory_bytes);
  }
  EXPECT_EQ((*tight)[0].memory_bytes(), whole - optimizer / 2);
  EXPECT_DOUBLE_EQ((*tight)[0].compute_seconds(), (*roomy)[0].compute_seconds());
  // No room for any of it: every layer's state on the host.
  r.device_memory_bytes = whole - optimizer;
  tight = PartitionPipeline(*cost, r);
  ASSERT_TRUE(tight.ok()) << tight.status();
  for (const tandem::v1::PipelineStage& st : *tight) {
    EXPECT_TRUE(st.offload_optimizer()) << "stage " << st.device_index();
    EXPECT_EQ(st.host_updated_layers(), 0) << "stage " << st.device_index();
    EXPECT_EQ(HostUpdatedFrom(st), st.first_layer()) << "stage " << st.device_index();
  }
  EXPECT_EQ((*tight)[0].memory_bytes(), whole - optimizer);
}

// Streamed weights within a stage: where even every layer's optimizer state
// on the host leaves a stage of four equal layers one layer's weights over
// its device, it also keeps their weights on the host, holding two layers'
// at a time (two fewer than its four), and copies them up for each forward
// and backward; not where offloading the optimizer state fits, nor unless
// allowed.
TEST(PartitionPipelineTest, AStageStreamsItsWeightsWhenNothingElseFits) {
  std::vector<testing::SyntheticLayer> chain = FourEqualLayers();
  const std::vector<testing::SyntheticLayer> four = chain;
  chain.insert(chain.end(), four.begin(), four.end());
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(chain, 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(2);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> roomy = PartitionPipeline(*cost, r);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ASSERT_EQ((*roomy)[1].first_layer(), 4);
  const int64_t whole = (*roomy)[0].memory_bytes();
  const int64_t weights = cost->ParameterBytes(0);
  int64_t optimizer = 0;
  for (int l = 0; l < 4; ++l) optimizer += cost->OptimizerStateBytes(l);
  r.allow_offload = true;
  r.allow_stream_weights = true;
  // Offloading the optimizer state fits: nothing streams.
  r.device_memory_bytes = whole - optimizer;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> offloading = PartitionPipeline(*cost, r);
  ASSERT_TRUE(offloading.ok()) << offloading.status();
  for (const tandem::v1::PipelineStage& st : *offloading) {
    EXPECT_TRUE(st.offload_optimizer()) << "stage " << st.device_index();
    EXPECT_FALSE(st.stream_weights()) << "stage " << st.device_index();
  }
  r.device_memory_bytes = whole - optimizer - weights;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> streaming = PartitionPipeline(*cost, r);
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  for (const tandem::v1::PipelineStage& st : *streaming) {
    EXPECT_TRUE(st.offload_optimizer()) << "stage " << st.device_index();
    EXPECT_TRUE(st.stream_weights()) << "stage " << st.device_index();
    EXPECT_EQ(st.host_updated_layers(), 0) << "stage " << st.device_index();
    EXPECT_LE(st.memory_bytes(), r.device_memory_bytes);
    EXPECT_GE(st.compute_seconds(), (*roomy)[st.device_index()].compute_seconds());
  }
  EXPECT_EQ((*streaming)[0].memory_bytes(), whole - optimizer - 2 * weights);
  // Timed as given, a forced stage that streams holds the same.
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> timed =
      TimePipelineStages(*cost, r, *streaming);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ((*timed)[0].memory_bytes(), (*streaming)[0].memory_bytes());
  EXPECT_TRUE((*timed)[0].stream_weights());
  r.allow_stream_weights = false;
  EXPECT_EQ(PartitionPipeline(*cost, r).status().code(), absl::StatusCode::kResourceExhausted);
}

// A streamed layer's copy up runs during the compute since the streamed
// layer before it in the op began (the op's first during the op before):
// with four equal layers a stage (forward 1 s, backward 2 s, a 3 s copy
// each), the forward exposes 3 - 1 = 2 s for each of its last three layers
// and the backward 3 - 2 = 1 s for each of its first three: 9 s more per
// micro-batch.
TEST(PartitionPipelineTest, StreamedWeightsAddWhatTheComputeBeforeThemDoesNotHide) {
  std::vector<testing::SyntheticLayer> chain = FourEqualLayers();
  for (testing::SyntheticLayer& x : chain) x.accelerator_backward_seconds = 2;
  const std::vector<testing::SyntheticLayer> four = chain;
  chain.insert(chain.end(), four.begin(), four.end());
  testing::SyntheticNode node;
  node.h2d_bytes_per_second = 1000.0 / 3;  // a layer's 1000 bytes in 3 s
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(chain, 1, node));
  ASSERT_TRUE(cost.ok()) << cost.status();
  ASSERT_DOUBLE_EQ(
      cost->CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, cost->ParameterBytes(0)), 3.0);
  PipelineRequest r = TwoStages(2);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> roomy = PartitionPipeline(*cost, r);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ASSERT_EQ((*roomy)[1].first_layer(), 4);
  int64_t optimizer = 0;
  for (int l = 0; l < 4; ++l) optimizer += cost->OptimizerStateBytes(l);
  r.allow_offload = r.allow_stream_weights = true;
  r.device_memory_bytes = (*roomy)[0].memory_bytes() - optimizer - cost->ParameterBytes(0);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> streaming = PartitionPipeline(*cost, r);
  ASSERT_TRUE(streaming.ok()) << streaming.status();
  for (const tandem::v1::PipelineStage& st : *streaming) {
    ASSERT_TRUE(st.stream_weights()) << "stage " << st.device_index();
    EXPECT_DOUBLE_EQ(st.compute_seconds(), (*roomy)[st.device_index()].compute_seconds() + 9.0)
        << "stage " << st.device_index();
  }
}

// PipeDream's weight versions: stage 0 of 2 stashes min(1, M) + 1 = 2 copies
// of its weights and stage 1 none; with vertical sync stage 1 stashes one
// and keeps 1 + 1 for its history.
TEST(PartitionPipelineTest, StageMemoryCountsPipeDreamsWeightVersions) {
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(FourEqualLayers(), 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(4);
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> plain = PartitionPipeline(*cost, r);
  r.stash_weights = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> stashed = PartitionPipeline(*cost, r);
  r.vertical_sync = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> synced = PartitionPipeline(*cost, r);
  ASSERT_TRUE(plain.ok() && stashed.ok() && synced.ok());
  ASSERT_EQ((*plain)[1].first_layer(), 2);
  ASSERT_EQ((*synced)[1].first_layer(), 2);
  const int64_t weights = cost->ParameterBytes(0) + cost->ParameterBytes(1);
  EXPECT_EQ((*stashed)[0].memory_bytes() - (*plain)[0].memory_bytes(), 2 * weights);
  EXPECT_EQ((*stashed)[1].memory_bytes(), (*plain)[1].memory_bytes());
  EXPECT_EQ((*synced)[0].memory_bytes(), (*stashed)[0].memory_bytes());
  EXPECT_EQ((*synced)[1].memory_bytes() - (*plain)[1].memory_bytes(), 3 * weights);
}

// A continuous PipeDream does not drain between steps: stage k keeps S - k
// micro-batches in flight across them whatever M. With M = 1 on 2 stages,
// stage 0 holds one more micro-batch's activations than a drained step of
// one micro-batch (both stash two versions of its weights).
TEST(PartitionPipelineTest, AContinuousPipelineHoldsItsStagesInFlightWhateverM) {
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile(FourEqualLayers(), 1));
  ASSERT_TRUE(cost.ok()) << cost.status();
  PipelineRequest r = TwoStages(1);
  r.stash_weights = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> drained = PartitionPipeline(*cost, r);
  r.continuous = true;
  absl::StatusOr<std::vector<tandem::v1::PipelineStage>> continuous = PartitionPipeline(*cost, r);
  ASSERT_TRUE(drained.ok() && continuous.ok());
  ASSERT_EQ((*drained)[1].first_layer(), 2);
  ASSERT_EQ((*continuous)[1].first_layer(), 2);
  const int64_t activations = cost->ActivationBytes(0, 1) + cost->ActivationBytes(1, 1);
  EXPECT_EQ((*continuous)[0].memory_bytes() - (*drained)[0].memory_bytes(), activations);
  EXPECT_EQ((*continuous)[1].memory_bytes(), (*drained)[1].memory_bytes());
}

}  // namespace
}  // namespace tandem::planner
