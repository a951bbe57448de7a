// ProfileModel, the RPC's and `tandem profile`'s entry point: validation with
// field names, the on-disk cache (instant repeat, refresh, keys), devices and
// links, the trace, and the text report.
#include "runtime/train/profile_model.h"

#include <filesystem>

#include "base/test_dir.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "runtime/profile/layer_profiler.h"
#include "runtime/profile/profile_cache.h"
#include "runtime/profile/profile_report.h"
#include "runtime/profile/testing/fakes.h"
#include "spec/job_spec.h"

namespace tandem::profile {
namespace {

tandem::v1::ProfileModelRequest Request(int batch = 8) {
  absl::StatusOr<tandem::v1::JobSpec> spec = ParseJobSpec(R"(
model: {cnn: {conv1_channels: 4, conv2_channels: 8, hidden_size: 16}}
data: {synthetic: {sample_shape: [12, 12, 1], num_classes: 10}}
training: {batch_size: 8, epochs: 3})",
                                                          "cnn.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  tandem::v1::ProfileModelRequest request;
  *request.mutable_spec() = *spec;
  request.mutable_spec()->mutable_training()->set_batch_size(batch);
  request.set_iterations(2);
  request.set_warmup_iterations(1);
  return request;
}

ProfilerEnvironment Env(const std::string& cache_dir) {
  ProfilerEnvironment env;
  env.cache_dir = cache_dir;
  env.cpu.triad.elements = 1 << 16;
  env.cpu.triad.repeats = 1;
  env.cpu.gemm.size = 64;
  env.cpu.gemm.repeats = 1;
  env.links.sizes_bytes = {4096, 1 << 16};
  env.links.repeats = 2;
  return env;
}

TEST(ProfileModelTest, RepeatedQueryComesFromTheCacheUnlessRefreshed) {
  const ProfilerEnvironment env = Env(TempDir("cache"));
  absl::StatusOr<ProfileResult> first = ProfileModel(Request(), env);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->cached);
  const tandem::v1::Profile& p = first->profile;
  EXPECT_EQ(p.provenance().source(), "measured");
  EXPECT_EQ(p.provenance().iterations(), 2);
  EXPECT_EQ(p.provenance().warmup_iterations(), 1);
  EXPECT_EQ(p.provenance().cache_key().size(), 32u);
  EXPECT_TRUE(p.provenance().versions().count("tandem"));
  EXPECT_TRUE(p.provenance().versions().count("onednn"));
  EXPECT_GT(p.provenance().profiling_seconds(), 0);
  EXPECT_TRUE(
      std::filesystem::exists(ProfileCache(env.cache_dir).ProfilePath(p.provenance().cache_key())));

  absl::StatusOr<ProfileResult> again = ProfileModel(Request(), env);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cached);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(again->profile, p));

  tandem::v1::ProfileModelRequest refresh = Request();
  refresh.set_refresh(true);
  absl::StatusOr<ProfileResult> fresh = ProfileModel(refresh, env);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE(fresh->cached);
  EXPECT_EQ(fresh->profile.provenance().cache_key(), p.provenance().cache_key());
  EXPECT_FALSE(google::protobuf::util::MessageDifferencer::Equals(fresh->profile, p));
}

TEST(ProfileModelTest, TheKeyCoversBatchIterationsAndOptimizer) {
  const ProfilerEnvironment env = Env(TempDir("keys"));
  absl::StatusOr<ProfileResult> base = ProfileModel(Request(8), env);
  ASSERT_TRUE(base.ok()) << base.status();
  absl::StatusOr<ProfileResult> other_batch = ProfileModel(Request(4), env);
  ASSERT_TRUE(other_batch.ok()) << other_batch.status();
  EXPECT_FALSE(other_batch->cached);
  EXPECT_EQ(other_batch->profile.batch_size(), 4);
  tandem::v1::ProfileModelRequest more = Request(8);
  more.set_iterations(3);
  absl::StatusOr<ProfileResult> more_iterations = ProfileModel(more, env);
  ASSERT_TRUE(more_iterations.ok());
  EXPECT_FALSE(more_iterations->cached);
  tandem::v1::ProfileModelRequest sgd = Request(8);
  sgd.mutable_spec()->mutable_optimizer()->set_kind(tandem::v1::OPTIMIZER_KIND_SGD);
  absl::StatusOr<ProfileResult> with_sgd = ProfileModel(sgd, env);
  ASSERT_TRUE(with_sgd.ok());
  EXPECT_FALSE(with_sgd->cached);
  EXPECT_EQ(with_sgd->profile.optimizer_state_per_parameter(), 0);
  // Fields a profile does not depend on share the key.
  tandem::v1::ProfileModelRequest renamed = Request(8);
  renamed.mutable_spec()->set_display_name("another name");
  renamed.mutable_spec()->mutable_training()->set_epochs(7);
  absl::StatusOr<ProfileResult> same = ProfileModel(renamed, env);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->cached);
}

TEST(ProfileModelTest, ADamagedCacheFileIsAMiss) {
  const ProfilerEnvironment env = Env(TempDir("damaged"));
  absl::StatusOr<ProfileResult> first = ProfileModel(Request(), env);
  ASSERT_TRUE(first.ok());
  const std::string path =
      ProfileCache(env.cache_dir).ProfilePath(first->profile.provenance().cache_key());
  std::filesystem::resize_file(path, 17);
  absl::StatusOr<ProfileResult> again = ProfileModel(Request(), env);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->cached);
}

TEST(ProfileModelTest, TraceIsReturnedFreshAndFromTheCache) {
  const ProfilerEnvironment env = Env(TempDir("trace"));
  tandem::v1::ProfileModelRequest request = Request();
  request.set_include_trace(true);
  absl::StatusOr<ProfileResult> first = ProfileModel(request, env);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_NE(first->chrome_trace_json.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(first->chrome_trace_json.find("conv2d0 forward"), std::string::npos);
  absl::StatusOr<ProfileResult> again = ProfileModel(request, env);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->cached);
  EXPECT_EQ(again->chrome_trace_json, first->chrome_trace_json);
  // Without include_trace, none is returned.
  absl::StatusOr<ProfileResult> plain = ProfileModel(Request(), env);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->chrome_trace_json.empty());
}

TEST(ProfileModelTest, AnAcceleratorAddsItsDeviceAndFourLinks) {
  testing::FakeAccelerator accelerator;
  std::unique_ptr<CpuProfiledDevice> cpu = CpuProfiledDevice::Create(Env("").cpu);
  ProfilerEnvironment env = Env("");
  env.devices = {cpu.get(), &accelerator};
  absl::StatusOr<ProfileResult> r = ProfileModel(Request(), env);
  ASSERT_TRUE(r.ok()) << r.status();
  const tandem::v1::Profile& p = r->profile;
  ASSERT_EQ(p.devices_size(), 2);
  EXPECT_EQ(p.devices(0).id(), "cpu");
  EXPECT_EQ(p.devices(1).id(), "emulated:0");
  for (const auto& layer : p.layers()) EXPECT_EQ(layer.devices_size(), 2) << layer.name();
  ASSERT_EQ(p.links_size(), 4);
  int pinned = 0;
  for (const tandem::v1::LinkProfile& link : p.links()) {
    pinned += link.pinned();
    ASSERT_EQ(link.samples_size(), 2);
    EXPECT_EQ(link.samples(0).bytes(), 4096);
    EXPECT_GT(link.bandwidth_bytes_per_second(), 0);
    EXPECT_DOUBLE_EQ(link.bandwidth_bytes_per_second(), link.samples(1).bytes_per_second());
    EXPECT_DOUBLE_EQ(link.latency_seconds(), link.samples(0).seconds());
    if (link.direction() == tandem::v1::LINK_DIRECTION_HOST_TO_DEVICE) {
      EXPECT_EQ(link.from_device_id(), "cpu");
      EXPECT_EQ(link.to_device_id(), "emulated:0");
    } else {
      EXPECT_EQ(link.from_device_id(), "emulated:0");
    }
  }
  EXPECT_EQ(pinned, 2);
  EXPECT_EQ(accelerator.live_pinned_buffers(), 0);

  // Only the accelerator, by id.
  tandem::v1::ProfileModelRequest only = Request();
  only.add_device_ids("emulated:0");
  absl::StatusOr<ProfileResult> one = ProfileModel(only, env);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->profile.devices_size(), 1);
  EXPECT_EQ(one->profile.devices(0).id(), "emulated:0");
}

TEST(ProfileModelTest, WithoutPinnedMemoryOnlyPageableLinksAreMeasured) {
  testing::FakeAccelerator accelerator(/*pinned=*/false);
  ProfilerEnvironment env = Env("");
  env.devices = {&accelerator};
  absl::StatusOr<ProfileResult> r = ProfileModel(Request(), env);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->profile.links_size(), 2);
  for (const auto& link : r->profile.links()) EXPECT_FALSE(link.pinned());
}

TEST(ProfileModelTest, BadRequestsNameTheField) {
  const ProfilerEnvironment env = Env("");
  tandem::v1::ProfileModelRequest r = Request();
  r.set_iterations(5000);
  absl::StatusOr<ProfileResult> result = ProfileModel(r, env);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "iterations: must be in [1, 1000], got 5000");

  r = Request();
  r.set_warmup_iterations(-1);
  result = ProfileModel(r, env);
  EXPECT_EQ(result.status().message(), "warmup_iterations: must be in [0, 100], got -1");

  r = Request();
  r.add_device_ids("cuda:3");
  result = ProfileModel(r, env);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(result.status().message(), "device_ids[0]: unknown device 'cuda:3'; this node has cpu");

  r = Request();
  r.mutable_spec()->mutable_training()->set_batch_size(0);
  result = ProfileModel(r, env);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("spec.training.batch_size"), std::string::npos)
      << result.status();

  r = Request();
  r.mutable_spec()->mutable_model()->mutable_gpt();
  result = ProfileModel(r, env);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("spec.model.gpt"), std::string::npos) << result.status();
}

TEST(ProfileReportTest, ShowsEveryLayerTheFallbackAndAbsentPhases) {
  absl::StatusOr<ProfileResult> r = ProfileModel(Request(), Env(""));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string report = FormatProfileReport(r->profile);
  for (const auto& layer : r->profile.layers()) {
    EXPECT_NE(report.find(layer.name()), std::string::npos) << layer.name() << "\n" << report;
  }
  EXPECT_NE(report.find(r->profile.devices(0).counter_note()), std::string::npos) << report;
  EXPECT_NE(report.find("analytic and measured bytes agree for"), std::string::npos) << report;
  EXPECT_NE(report.find("links: none measured"), std::string::npos) << report;
  // relu2 has no parameters: its update is "-", not 0.
  const size_t relu = report.find("relu1");
  ASSERT_NE(relu, std::string::npos);
  const std::string line = report.substr(relu, report.find('\n', relu) - relu);
  EXPECT_NE(line.find(" - "), std::string::npos) << line;
}

TEST(AnalyticProfileForJobTest, NeedsNoMeasurement) {
  tandem::v1::ProfileModelRequest r = Request();
  absl::StatusOr<tandem::v1::JobSpec> resolved = ResolveJobSpec(r.spec(), false);
  ASSERT_TRUE(resolved.ok());
  absl::StatusOr<tandem::v1::Profile> p = AnalyticProfileForJob(*resolved);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->layers_size(), 11);  // conv relu pool x2, flatten, linear relu linear, loss.
  EXPECT_EQ(p->devices_size(), 0);
  EXPECT_EQ(p->batch_size(), 8);
}

}  // namespace
}  // namespace tandem::profile
