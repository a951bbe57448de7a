#include "planner/cost_model.h"

#include <limits>

#include "gtest/gtest.h"
#include "planner/precision.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

using tandem::v1::PLACEMENT_ACCELERATOR;
using tandem::v1::PLACEMENT_HOST;

// A node with round numbers: host 1 TFLOP/s matrix, 0.1 TFLOP/s vector,
// 100 GB/s, 10 threads; accelerator 100 TFLOP/s matrix, 10 TFLOP/s vector,
// 1 TB/s; 10 GB/s links with 10 us latency; every efficiency 0.5.
tandem::v1::HardwareSpec RoundNode() {
  tandem::v1::HardwareSpec spec;
  spec.set_name("round");
  tandem::v1::ProcessorSpec* host = spec.mutable_host();
  host->set_kind(tandem::v1::DEVICE_KIND_CPU);
  host->set_peak_matmul_flops_per_second(1e12);
  host->set_peak_vector_flops_per_second(1e11);
  host->set_memory_bandwidth_bytes_per_second(100e9);
  host->set_threads(10);
  host->set_launch_overhead_seconds(1e-6);
  tandem::v1::ProcessorSpec* acc = spec.add_accelerators();
  acc->set_kind(tandem::v1::DEVICE_KIND_CUDA);
  acc->set_peak_matmul_flops_per_second(100e12);
  acc->set_peak_vector_flops_per_second(10e12);
  acc->set_memory_bandwidth_bytes_per_second(1e12);
  acc->set_memory_bytes(int64_t{80} << 30);
  acc->set_launch_overhead_seconds(5e-6);
  for (const char* key : {"matmul", "conv", "elementwise", "norm", "attention", "embedding", "pool",
                          "loss", "optimizer"}) {
    (*host->mutable_efficiency())[key] = 0.5;
    (*acc->mutable_efficiency())[key] = 0.5;
  }
  spec.mutable_host_to_accelerator()->set_bandwidth_bytes_per_second(10e9);
  spec.mutable_host_to_accelerator()->set_latency_seconds(1e-5);
  spec.mutable_accelerator_to_host()->set_bandwidth_bytes_per_second(10e9);
  spec.mutable_accelerator_to_host()->set_latency_seconds(1e-5);
  return spec;
}

TEST(CostModelTest, RooflineTakesTheSlowerOfComputeAndMemory) {
  // One linear 1000 -> 1000 at batch 100: 2e8 forward FLOPs, 4e8 backward;
  // forward bytes 4 * (1001000 + 100000 + 100000) = 4.804e6.
  const tandem::v1::Profile profile = testing::MlpProfile({1000, 1000}, 100);
  absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(profile, RoundNode());
  ASSERT_TRUE(cost.ok()) << cost.status();
  // Accelerator: compute 2e8 / 50e12 = 4 us, memory 4.804e6 / 0.5e12 = 9.608 us.
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_ACCELERATOR, 100), 5e-6 + 9.608e-6, 1e-12);
  // Host: compute 2e8 / 0.5e12 = 400 us beats memory 4.804e6 / 50e9 = 96 us.
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_HOST, 100), 1e-6 + 400e-6, 1e-12);
  EXPECT_NEAR(cost->BackwardSeconds(0, PLACEMENT_HOST, 100), 1e-6 + 800e-6, 1e-12);
  // Half the samples: the call overhead stays, the work halves.
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_HOST, 50), 1e-6 + 200e-6, 1e-12);
  // Adam: 28 bytes per parameter, on the host at 50 GB/s with all 10 threads,
  // twice as long on 5.
  const double params = 1000 * 1000 + 1000;
  EXPECT_EQ(cost->UpdateBytes(0), static_cast<int64_t>(28 * params));
  EXPECT_NEAR(cost->UpdateSeconds(0, PLACEMENT_HOST, 10), 1e-6 + 28 * params / 50e9, 1e-12);
  EXPECT_NEAR(cost->UpdateSeconds(0, PLACEMENT_HOST, 5), 1e-6 + 2 * 28 * params / 50e9, 1e-12);
  EXPECT_NEAR(cost->CopySeconds(tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE, 10'000'000'000),
              1.0 + 1e-5, 1e-12);
  EXPECT_EQ(cost->ActivationBytes(0, 50), 4 * 50 * 1000);
  EXPECT_EQ(cost->ModelStateBytes(), static_cast<int64_t>(16 * params));
  EXPECT_TRUE(cost->has_accelerator());
  EXPECT_EQ(cost->source(), "hardware_spec:round");
}

TEST(CostModelTest, Bf16UsesTheBf16RateAndMovesHalfTheBytes) {
  // The profile of the test above in bf16 on a node whose bf16 rates are 4x
  // fp32: on the host the forward is compute-bound and 4x faster; on the
  // accelerator memory-bound and 2x faster (half the bytes).
  absl::StatusOr<tandem::v1::Profile> bf16 =
      ProfileInPrecision(testing::MlpProfile({1000, 1000}, 100), tandem::v1::PRECISION_BF16);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  tandem::v1::HardwareSpec node = RoundNode();
  node.mutable_host()->set_peak_bf16_matmul_flops_per_second(4e12);
  node.mutable_accelerators(0)->set_peak_bf16_matmul_flops_per_second(400e12);
  absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(*bf16, node);
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_EQ(cost->precision(), tandem::v1::PRECISION_BF16);
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_HOST, 100), 1e-6 + 100e-6, 1e-12);
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_ACCELERATOR, 100), 5e-6 + 4.804e-6, 1e-12);
  // 2 bytes per parameter cross the link; the host keeps fp32 master and
  // Adam: the step still touches 28 bytes per parameter, the model state is
  // still 16.
  const double params = 1000 * 1000 + 1000;
  EXPECT_EQ(cost->ParameterBytes(0), static_cast<int64_t>(2 * params));
  EXPECT_EQ(cost->GradientBytes(0), static_cast<int64_t>(2 * params));
  EXPECT_EQ(cost->UpdateBytes(0), static_cast<int64_t>(28 * params));
  EXPECT_NEAR(cost->UpdateSeconds(0, PLACEMENT_HOST, 10), 1e-6 + 28 * params / 50e9, 1e-12);
  EXPECT_EQ(cost->ModelStateBytes(), static_cast<int64_t>(16 * params));
  EXPECT_EQ(cost->ActivationBytes(0, 50), 2 * 50 * 1000);
  // A call's staging (weights widened, the fp32 gradient) is 8 bytes per
  // parameter at any number of samples; the workspace scales.
  const int64_t workspace = bf16->layers(0).analytic_memory().workspace_bytes();
  EXPECT_EQ(cost->WorkspaceBytes(0, 100), workspace + static_cast<int64_t>(8 * params));
  EXPECT_EQ(cost->WorkspaceBytes(0, 50), workspace / 2 + static_cast<int64_t>(8 * params));

  // Compute-bound (a slow vector unit): Adam's mixed step is 2 + 5 * 2 FLOPs
  // per parameter on its two fp32 state elements, plus 1 to write the copy;
  // the master weights are not state elements. SGD without momentum: 2 + 1.
  tandem::v1::HardwareSpec slow = node;
  slow.mutable_host()->set_peak_vector_flops_per_second(1e8);
  absl::StatusOr<CostModel> slow_cost = CostModel::FromHardwareSpec(*bf16, slow);
  ASSERT_TRUE(slow_cost.ok()) << slow_cost.status();
  EXPECT_NEAR(slow_cost->UpdateSeconds(0, PLACEMENT_HOST, 10), 1e-6 + 13 * params / 0.5e8, 1e-9);
  tandem::v1::Profile sgd_fp32 = testing::MlpProfile({1000, 1000}, 100);
  for (auto& l : *sgd_fp32.mutable_layers()) {
    l.mutable_analytic_memory()->set_optimizer_state_bytes(0);
  }
  absl::StatusOr<tandem::v1::Profile> sgd =
      ProfileInPrecision(sgd_fp32, tandem::v1::PRECISION_BF16);
  ASSERT_TRUE(sgd.ok()) << sgd.status();
  absl::StatusOr<CostModel> sgd_cost = CostModel::FromHardwareSpec(*sgd, slow);
  ASSERT_TRUE(sgd_cost.ok()) << sgd_cost.status();
  EXPECT_EQ(sgd_cost->UpdateBytes(0), static_cast<int64_t>(12 * params));
  EXPECT_NEAR(sgd_cost->UpdateSeconds(0, PLACEMENT_HOST, 10), 1e-6 + 3 * params / 0.5e8, 1e-9);

  // A processor without a bf16 rate computes at its fp32 rate.
  absl::StatusOr<CostModel> plain = CostModel::FromHardwareSpec(*bf16, RoundNode());
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NEAR(plain->ForwardSeconds(0, PLACEMENT_HOST, 100), 1e-6 + 400e-6, 1e-12);

  node.mutable_host()->set_peak_bf16_matmul_flops_per_second(-1);
  EXPECT_EQ(CostModel::FromHardwareSpec(*bf16, node).status().message(),
            "hardware.host.peak_bf16_matmul_flops_per_second: must be >= 0 (0 = none)");
}

// An emulated accelerator's share of the job's threads: from one thread's
// GEMM rate and all threads' (speedup taken linear between), else linear.
TEST(CostModelTest, AShareOfTheThreadsRunsAtTheRateTheirSpeedupGives) {
  const tandem::v1::Profile profile = testing::MlpProfile({100, 100}, 10);
  tandem::v1::HardwareSpec node = RoundNode();
  tandem::v1::ProcessorSpec* acc = node.mutable_accelerators(0);
  acc->set_kind(tandem::v1::DEVICE_KIND_EMULATED);
  acc->set_threads(8);
  acc->set_peak_matmul_flops_per_second(640e9);
  absl::StatusOr<CostModel> linear = CostModel::FromHardwareSpec(profile, node);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_DOUBLE_EQ(linear->ThreadShareSlowdown(8, 2), 4.0);
  EXPECT_DOUBLE_EQ(linear->ThreadShareSlowdown(2, 1), 2.0);
  EXPECT_DOUBLE_EQ(linear->ThreadShareSlowdown(2, 2), 1.0);
  // 8 threads reach 6.4 times one's rate: s(k) = 1 + (k - 1) 5.4 / 7.
  acc->set_single_thread_matmul_flops_per_second(100e9);
  absl::StatusOr<CostModel> measured = CostModel::FromHardwareSpec(profile, node);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_NEAR(measured->ThreadShareSlowdown(8, 2), 6.4 / (1 + 5.4 / 7), 1e-12);
  EXPECT_NEAR(measured->ThreadShareSlowdown(8, 1), 6.4, 1e-12);
  EXPECT_NEAR(measured->ThreadShareSlowdown(4, 2), (1 + 3 * 5.4 / 7) / (1 + 5.4 / 7), 1e-12);
}

TEST(CostModelTest, MeasuredProfilesUseTheMedians) {
  testing::SyntheticLayer layer;
  layer.accelerator_forward_seconds = 0.25;
  layer.accelerator_backward_seconds = 0.5;
  layer.accelerator_update_seconds = 0.125;
  layer.host_forward_seconds = 2;
  layer.host_backward_seconds = 4;
  layer.host_update_seconds = 1;
  layer.parameter_bytes = 1000;
  testing::SyntheticNode node;
  node.host_threads = 4;
  absl::StatusOr<CostModel> cost =
      CostModel::FromMeasuredProfile(testing::MeasuredChainProfile({layer}, 8, node));
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_DOUBLE_EQ(cost->ForwardSeconds(0, PLACEMENT_ACCELERATOR, 8), 0.25);
  EXPECT_DOUBLE_EQ(cost->BackwardSeconds(0, PLACEMENT_HOST, 8), 4.0);
  EXPECT_DOUBLE_EQ(cost->UpdateSeconds(0, PLACEMENT_ACCELERATOR, 1), 0.125);
  EXPECT_DOUBLE_EQ(cost->UpdateSeconds(0, PLACEMENT_HOST, 4), 1.0);
  // Measured with 4 threads; on 2 the bandwidth-bound step takes ~twice as long.
  EXPECT_NEAR(cost->UpdateSeconds(0, PLACEMENT_HOST, 2), 2.0, 1e-5);
  // 4 samples of 8: overhead (1 us host) + half the rest.
  EXPECT_NEAR(cost->ForwardSeconds(0, PLACEMENT_HOST, 4), 1e-6 + (2 - 1e-6) / 2, 1e-12);
  EXPECT_EQ(cost->source(), "measured");
}

TEST(CostModelTest, ErrorsNameTheField) {
  tandem::v1::Profile profile = testing::MlpProfile({10, 10}, 4);
  profile.mutable_layers(1)->set_forward_flops(-1);
  absl::StatusOr<CostModel> cost = CostModel::FromHardwareSpec(profile, RoundNode());
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(cost.status().message().find("profile.layers[1].forward_flops"), std::string::npos)
      << cost.status();

  profile = testing::MlpProfile({10, 10}, 4);
  profile.mutable_layers(0)->set_kind("warp_drive");
  cost = CostModel::FromHardwareSpec(profile, RoundNode());
  ASSERT_FALSE(cost.ok());
  EXPECT_NE(cost.status().message().find("profile.layers[0].kind"), std::string::npos);

  tandem::v1::HardwareSpec spec = RoundNode();
  (*spec.mutable_accelerators(0)->mutable_efficiency())["matmul"] = 1.5;
  cost = CostModel::FromHardwareSpec(testing::MlpProfile({10, 10}, 4), spec);
  ASSERT_FALSE(cost.ok());
  EXPECT_NE(cost.status().message().find("hardware.accelerators[0].efficiency"), std::string::npos);

  // A measured profile without its timings cannot be planned from.
  cost = CostModel::FromMeasuredProfile(testing::MlpProfile({10, 10}, 4));
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kFailedPrecondition);
}

// What a remote client may send: non-finite figures, byte counts that would
// overflow the planner's sums. Each is refused
// naming its field, never planned into NaN or a negative peak.
TEST(CostModelTest, NonFiniteOrOverflowingFiguresAreRefusedNamingTheField) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto refused = [](const absl::StatusOr<CostModel>& cost, const std::string& field) {
    EXPECT_EQ(cost.status().code(), absl::StatusCode::kInvalidArgument) << cost.status();
    EXPECT_NE(cost.status().message().find(field), std::string::npos) << cost.status();
  };
  const tandem::v1::Profile mlp = testing::MlpProfile({10, 10}, 4);
  tandem::v1::HardwareSpec spec = RoundNode();
  spec.mutable_host()->set_launch_overhead_seconds(inf);
  refused(CostModel::FromHardwareSpec(mlp, spec), "hardware.host.launch_overhead_seconds");
  spec = RoundNode();
  spec.mutable_host_to_accelerator()->set_latency_seconds(nan);
  refused(CostModel::FromHardwareSpec(mlp, spec), "latency_seconds");
  spec = RoundNode();
  spec.mutable_accelerator_to_host()->set_bandwidth_bytes_per_second(inf);
  refused(CostModel::FromHardwareSpec(mlp, spec), "bandwidth_bytes_per_second");

  tandem::v1::Profile big = mlp;
  big.mutable_layers(0)->mutable_analytic_memory()->set_activation_bytes(int64_t{1} << 60);
  refused(CostModel::FromHardwareSpec(big, RoundNode()),
          "profile.layers[0].analytic_memory.activation_bytes");

  // A measured timing of infinity.
  testing::SyntheticLayer layer;
  layer.accelerator_forward_seconds = inf;
  refused(CostModel::FromMeasuredProfile(testing::MeasuredChainProfile({layer}, 8, {})),
          "profile.layers[0]");
}

TEST(CostModelTest, EveryRuntimeLayerKindHasAnOpClass) {
  for (const char* kind :
       {"linear", "conv2d", "max_pool2d", "avg_pool2d", "batch_norm2d", "relu", "gelu", "dropout",
        "flatten", "layer_norm", "embedding", "attention", "transformer_block", "residual_block",
        "global_avg_pool", "cross_entropy"}) {
    EXPECT_TRUE(OpClassOfKind(kind).ok()) << kind;
  }
  EXPECT_EQ(OpClassKey(*OpClassOfKind("transformer_block")), "matmul");
  EXPECT_FALSE(OpClassOfKind("lstm").ok());
}

}  // namespace
}  // namespace tandem::planner
