#include "planner/spec_files.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "planner/cost_model.h"
#include "planner/planner.h"
#include "planner/testing/synthetic_models.h"

namespace tandem::planner {
namespace {

// Bazel runs tests from the workspace root in the runfiles tree.
constexpr const char* kShipped[] = {
    "planner/hardware/h100_sxm_node.textproto",
    "planner/hardware/h100_pcie_node.textproto",
    "planner/hardware/h200_node.textproto",
};

TEST(SpecFilesTest, ShippedHardwareSpecsLoadAndPlan) {
  for (const char* path : kShipped) {
    SCOPED_TRACE(path);
    absl::StatusOr<tandem::v1::HardwareSpec> spec = LoadHardwareSpec(path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ(spec->accelerators_size(), 8);
    EXPECT_EQ(spec->host().kind(), tandem::v1::DEVICE_KIND_CPU);
    EXPECT_GT(spec->host().threads(), 0);
    for (const tandem::v1::ProcessorSpec& gpu : spec->accelerators()) {
      EXPECT_EQ(gpu.SerializeAsString(), spec->accelerators(0).SerializeAsString());
    }
    // A roofline over a small GPT builds, and the planner answers.
    testing::GptShape shape;
    shape.n_layer = 2;
    shape.d_model = 256;
    shape.n_head = 4;
    shape.context = 128;
    shape.vocab = 1000;
    PlanRequest request;
    request.profile = testing::GptProfile(shape);
    request.hardware = *spec;
    absl::StatusOr<tandem::v1::PlanModelResponse> response = SolvePlan(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_TRUE(response->plan().feasible());
    EXPECT_GT(response->plan().prediction().iteration_seconds(), 0);
  }
}

TEST(SpecFilesTest, TheH200IsTheH100SxmWithMoreAndFasterMemory) {
  absl::StatusOr<tandem::v1::HardwareSpec> h100 = LoadHardwareSpec(kShipped[0]);
  absl::StatusOr<tandem::v1::HardwareSpec> h200 = LoadHardwareSpec(kShipped[2]);
  ASSERT_TRUE(h100.ok() && h200.ok());
  EXPECT_EQ(h100->accelerators(0).peak_matmul_flops_per_second(),
            h200->accelerators(0).peak_matmul_flops_per_second());
  EXPECT_GT(h200->accelerators(0).memory_bytes(), h100->accelerators(0).memory_bytes());
  EXPECT_GT(h200->accelerators(0).memory_bandwidth_bytes_per_second(),
            h100->accelerators(0).memory_bandwidth_bytes_per_second());
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(SpecFilesTest, ReadsJsonAndReportsWhereTextFails) {
  const std::string json = WriteTemp("spec.json", R"({"name": "j", "host": {"threads": 4}})");
  absl::StatusOr<tandem::v1::HardwareSpec> spec = LoadHardwareSpec(json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "j");
  EXPECT_EQ(spec->host().threads(), 4);

  const std::string bad = WriteTemp("bad.textproto", "name: \"x\"\nhost {\n  threadz: 3\n}\n");
  spec = LoadHardwareSpec(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spec.status().message().find("line 3"), std::string::npos) << spec.status();
  EXPECT_NE(spec.status().message().find("threadz"), std::string::npos) << spec.status();

  spec = LoadHardwareSpec("/nonexistent/spec.textproto");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);

  spec = LoadHardwareSpec(WriteTemp("spec.yaml", "name: x"));
  ASSERT_FALSE(spec.ok());
  EXPECT_NE(spec.status().message().find("extension"), std::string::npos);
}

TEST(SpecFilesTest, LoadsProfiles) {
  const tandem::v1::Profile profile = testing::MlpProfile({8, 4}, 2);
  const std::string path = WriteTemp("profile.textproto", profile.DebugString());
  absl::StatusOr<tandem::v1::Profile> loaded = LoadProfile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->SerializeAsString(), profile.SerializeAsString());
}

}  // namespace
}  // namespace tandem::planner
