// Building a job's model from a resolved spec: errors name the spec's field.
#include "runtime/train/job_model.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(JobSpecTest, ModelErrorsNameThePresetField) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {gpt: {n_head: 3, d_model: 32}}
data: {synthetic: {sample_shape: [8], num_classes: 10, tokens: true}}
training: {batch_size: 4, steps: 2}
)",
                                                          "gpt.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<tandem::v1::JobSpec> r = ResolveJobSpec(*spec, false);
  ASSERT_TRUE(r.ok());
  const absl::Status s = BuildJobModel(*r).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model.gpt"), std::string::npos) << s;
}

}  // namespace
}  // namespace tandem
