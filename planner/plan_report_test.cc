#include "planner/plan_report.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "gtest/gtest.h"
#include "planner/planner.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

TEST(PlanReportTest, FormatsHumanUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(3 << 20), "3.00 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 30), "5.00 GiB");
  EXPECT_EQ(FormatSeconds(0.0125), "12.500 ms");
  EXPECT_EQ(FormatSeconds(2.5), "2.500 s");
  EXPECT_EQ(FormatSeconds(42e-6), "42 us");
}

TEST(PlanReportTest, RendersTheLayerTableAndTheComparison) {
  testing::SyntheticLayer a;
  a.name = "fc0";
  a.accelerator_forward_seconds = 0.001;
  a.accelerator_backward_seconds = 0.002;
  a.accelerator_update_seconds = 0.0005;
  a.host_forward_seconds = 0.01;
  a.host_backward_seconds = 0.02;
  a.host_update_seconds = 0.004;
  a.parameter_bytes = 4 << 20;
  a.activation_bytes = 1 << 20;
  testing::SyntheticLayer b = a;
  b.name = "fc1";
  testing::SyntheticNode node;
  node.accelerator_memory_bytes = int64_t{1} << 30;
  PlanRequest request;
  request.profile = testing::MeasuredChainProfile({a, b}, 8, node);
  request.accelerator_memory_bytes = 28 << 20;
  absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(request);
  ASSERT_TRUE(response.ok()) << response.status();
  const std::string text = RenderPlanReport(*response);
  if (getenv("SHOW_REPORT")) std::cout << text;
  for (const char* expected :
       {"Plan: reuse_distance", "reuse dist", "slack", "fc0", "fc1", "gpu_only", "cpu_only",
        "zero_offload", "hetero_dp", "samples/s", "MiB", " ms"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << expected << " in\n" << text;
  }
  // One row per layer plus the header.
  const std::string table = RenderLayerTable(response->plan());
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 3);
  // A layer whose state streams says so in its update column.
  tandem::v1::Plan streamed = response->plan();
  streamed.mutable_layers(0)->set_update(tandem::v1::PLACEMENT_ACCELERATOR);
  streamed.mutable_layers(0)->set_stream_optimizer_state(true);
  EXPECT_NE(RenderLayerTable(streamed).find("accel (state streamed)"), std::string::npos)
      << RenderLayerTable(streamed);
  // A pipeline plan lists its stages, each with its predicted update.
  tandem::v1::PlanModelResponse piped = *response;
  tandem::v1::PipelineStage* stage = piped.mutable_plan()->add_pipeline();
  stage->set_last_layer(1);
  stage->set_compute_seconds(0.003);
  stage->set_update_seconds(0.0005);
  stage->set_memory_bytes(8 << 20);
  EXPECT_NE(RenderPlanReport(piped).find("pipeline stage 0: layers 0-1, 3.000 ms compute, 0 us "
                                         "send, 500 us update, 8.00 MiB"),
            std::string::npos)
      << RenderPlanReport(piped);
  absl::StatusOr<std::string> json = PlanResponseToJson(*response);
  ASSERT_TRUE(json.ok());
  EXPECT_NE(json->find("\"reuse_distance_seconds\""), std::string::npos);
}

}  // namespace
}  // namespace tandem::planner
