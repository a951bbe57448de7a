// The loss scale's schedule: halved on each overflow, doubled after
// growth_interval clean steps (the count restarting at each change), a run
// of overflows reported as an error, and a restored scaler continuing as the
// one it was saved from.
#include "runtime/train/loss_scaler.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

tandem::v1::LossScaling Spec(double initial, int64_t growth, int max_skips) {
  tandem::v1::LossScaling s;
  s.set_initial_scale(initial);
  s.set_growth_interval_steps(growth);
  s.set_max_consecutive_skips(max_skips);
  return s;
}

TEST(LossScalerTest, HalvesOnOverflowAndDoublesAfterCleanSteps) {
  LossScaler s(Spec(1024, 3, 10));
  EXPECT_EQ(s.scale(), 1024);
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 1024);
  ASSERT_TRUE(s.Update(true).ok());  // the clean count restarts
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.skipped_steps(), 1);
  ASSERT_TRUE(s.Update(false).ok());
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 512);
  ASSERT_TRUE(s.Update(false).ok());
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_EQ(s.good_steps(), 0);
}

TEST(LossScalerTest, ARunOfOverflowsIsAnErrorSayingWhatToDo) {
  LossScaler s(Spec(8, 100, 3));
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(false).ok());  // not consecutive
  ASSERT_TRUE(s.Update(true).ok());
  ASSERT_TRUE(s.Update(true).ok());
  const absl::Status st = s.Update(true);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("3 steps in a row"), std::string::npos) << st;
  EXPECT_NE(st.message().find("PRECISION_BF16"), std::string::npos) << st;
  EXPECT_EQ(s.skipped_steps(), 4);
}

TEST(LossScalerTest, ARestoredScalerContinuesWhereItWasSaved) {
  LossScaler a(Spec(256, 4, 3));
  for (bool skipped : {false, false, true, true}) ASSERT_TRUE(a.Update(skipped).ok());
  LossScaler b(Spec(256, 4, 3));
  b.Restore(a.scale(), a.good_steps(), a.skipped_steps(), a.consecutive_skips());
  // One more skip in a row is the third: both give up there, restored or not.
  EXPECT_FALSE(a.Update(true).ok());
  EXPECT_FALSE(b.Update(true).ok());
  for (bool skipped : {false, false, true, false, false, false, false, false}) {
    ASSERT_TRUE(a.Update(skipped).ok());
    ASSERT_TRUE(b.Update(skipped).ok());
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.good_steps(), b.good_steps());
    EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
  }
}

TEST(LossScalerTest, TheScaleStaysWithinWhatAFloatDividesBy) {
  LossScaler low(Spec(0x1p-23, 100, 1000));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(low.Update(true).ok());
  EXPECT_EQ(low.scale(), LossScaler::kMinScale);
  LossScaler high(Spec(0x1p63, 1, 10));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(high.Update(false).ok());
  EXPECT_EQ(high.scale(), LossScaler::kMaxScale);
}

}  // namespace
}  // namespace tandem
