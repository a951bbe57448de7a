// Update rules whose replicas run the job's hybrid plan: EASGD with replica 0
// on the CPU engine and replica 1 on the emulated accelerator under the
// planner's placement (the CPU+accelerator co-training of the update-rules
// page), and SWA averaging an accelerator run's weights on the host.
#include <cmath>

#include "gtest/gtest.h"
#include "node/placement.h"
#include "node/placement_test_util.h"

namespace tandem::node {
namespace {

using placement_testing::Mlp;
using placement_testing::ModelStateBytes;
using placement_testing::TestNode;
using placement_testing::Train;
using placement_testing::TrainRun;

TEST(HybridUpdatesTest, EasgdRunsAReplicaOnTheAcceleratorNextToTheCpuOne) {
  tandem::v1::JobSpec spec =
      Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE,
          4 * ModelStateBytes(Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{1} << 30)),
          /*steps=*/24);
  auto* easgd = spec.mutable_updates()->mutable_easgd();
  easgd->set_replicas(2);
  easgd->set_period(2);
  const TrainRun run = Train(spec, MakeRunnerFactory(TestNode()));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.metrics.updates().rule(), "easgd");
  EXPECT_EQ(run.metrics.updates().updates(), 24);
  EXPECT_GE(run.metrics.updates().exchanges(), 10);
  // Replica 1's state was on the emulated accelerator.
  EXPECT_GT(run.metrics.peak_accelerator_bytes(), 0);
  EXPECT_TRUE(std::isfinite(run.eval_loss));
}

TEST(HybridUpdatesTest, SwaAveragesAnAcceleratorRunOnTheHost) {
  tandem::v1::JobSpec spec =
      Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE,
          4 * ModelStateBytes(Mlp(tandem::v1::STRATEGY_REUSE_DISTANCE, int64_t{1} << 30)),
          /*steps=*/12);
  spec.mutable_updates()->mutable_swa()->set_start_step(6);
  const TrainRun run = Train(spec, MakeRunnerFactory(TestNode()));
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.metrics.updates().swa_models(), 7);
  EXPECT_GT(run.metrics.peak_accelerator_bytes(), 0);
  EXPECT_GT(run.metrics.updates().swa_eval_accuracy(), 0);
}

}  // namespace
}  // namespace tandem::node
