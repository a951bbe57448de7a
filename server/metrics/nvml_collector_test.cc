// The NVML collector against a fake libnvidia-ml (testing/fake_nvml.c) with
// one GPU of known readings, and its refusals when NVML cannot be used.
#include "server/metrics/nvml_collector.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace tandem::metrics {
namespace {

std::string FakeLibrary() {
  const char* dir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return std::string(dir ? dir : ".") + "/" + (workspace ? workspace : "tandem") +
         "/server/metrics/libfake_nvml.so";
}

TEST(NvmlCollectorTest, ExportsTheFakeGpusReadings) {
  absl::StatusOr<std::shared_ptr<NvmlCollector>> nvml = NvmlCollector::Open(FakeLibrary());
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  EXPECT_EQ((*nvml)->device_count(), 1);
  const std::string text = prometheus::TextSerializer().Serialize((*nvml)->Collect());
  const std::string labels =
      "{gpu=\"0\",model=\"Fake GPU (tandem "
      "tests)\",uuid=\"GPU-00000000-0000-0000-0000-000000000000\"}";
  for (const std::string& line : {
           "tandem_gpu_utilization_ratio" + labels + " 0.37",
           "tandem_gpu_memory_utilization_ratio" + labels + " 0.12",
           "tandem_gpu_memory_used_bytes" + labels + " 10737418240",
           "tandem_gpu_memory_total_bytes" + labels + " 85899345920",
           "tandem_gpu_temperature_celsius" + labels + " 45",
           "tandem_gpu_power_watts" + labels + " 312.5",
       }) {
    EXPECT_NE(text.find(line + "\n"), std::string::npos) << line << "\nnot in\n" << text;
  }
}

TEST(NvmlCollectorTest, AMissingLibraryIsNotFound) {
  const absl::Status s = NvmlCollector::Open("/nonexistent/libnvidia-ml.so.1").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << s;
}

TEST(NvmlCollectorTest, ALibraryWithoutNvmlSaysWhichSymbolsLack) {
  const absl::Status s = NvmlCollector::Open("libz.so.1").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("nvmlInit_v2"), std::string::npos) << s;
}

TEST(NvmlCollectorTest, ADriverThatFailsToInitialiseIsUnavailable) {
  setenv("TANDEM_FAKE_NVML_FAIL_INIT", "1", 1);
  const absl::Status s = NvmlCollector::Open(FakeLibrary()).status();
  unsetenv("TANDEM_FAKE_NVML_FAIL_INIT");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

}  // namespace
}  // namespace tandem::metrics
