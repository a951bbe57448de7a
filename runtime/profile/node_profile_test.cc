#include "runtime/profile/node_profile.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "runtime/profile/testing/fakes.h"

namespace tandem::profile {
namespace {

std::string CachePath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/node_profile_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir + "/node_profile.pb";
}

NodeProfileOptions SmallOptions(const std::string& path) {
  NodeProfileOptions o;
  o.cache_path = path;
  o.links.sizes_bytes = {4096, 1 << 20};
  o.links.repeats = 3;
  o.adam_parameters = 1 << 16;
  o.memcpy_bytes = 1 << 20;
  return o;
}

bool Contains(const std::vector<std::string>& notes, const std::string& text) {
  for (const std::string& n : notes) {
    if (n.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(NodeProfileTest, MeasuresOnceThenServesThisNodesCache) {
  testing::FakeAccelerator accelerator;
  const std::vector<ProfiledDevice*> devices = {&accelerator};
  const NodeProfileOptions options = SmallOptions(CachePath("reuse"));
  absl::StatusOr<NodeProfileResult> first = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->cached);
  EXPECT_TRUE(first->notes.empty());
  const tandem::v1::NodeProfile& p = first->profile;
  EXPECT_EQ(p.fingerprint(), NodeFingerprint(devices, options));
  ASSERT_EQ(p.devices_size(), 1);
  EXPECT_EQ(p.devices(0).name(), "fake accelerator");
  EXPECT_EQ(p.links_size(), 4);  // each direction, pinned and pageable
  for (const auto& link : p.links()) EXPECT_GT(link.bandwidth_bytes_per_second(), 0);
  EXPECT_GT(p.host_memcpy_bytes_per_second(), 0);
  EXPECT_GT(p.host_adam_parameters_per_second(), 0);
  EXPECT_GT(p.measure_seconds(), 0);

  absl::StatusOr<NodeProfileResult> again = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cached);
  EXPECT_EQ(again->profile.SerializeAsString(), p.SerializeAsString());

  // A refresh measures even over this node's cache (here marked by an
  // impossible memcpy rate), and stores what it measured.
  tandem::v1::NodeProfile marked = p;
  marked.set_host_memcpy_bytes_per_second(1e15);
  std::ofstream(options.cache_path, std::ios::binary | std::ios::trunc)
      << marked.SerializeAsString();
  NodeProfileOptions refresh = options;
  refresh.refresh = true;
  absl::StatusOr<NodeProfileResult> refreshed = LoadOrMeasureNodeProfile(devices, refresh);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_FALSE(refreshed->cached);
  EXPECT_LT(refreshed->profile.host_memcpy_bytes_per_second(), 1e15);
  again = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->cached);
  EXPECT_LT(again->profile.host_memcpy_bytes_per_second(), 1e15);
}

// A cache measured over other sizes is another measurement: not served to a
// caller asking for these (tandemd asks for the defaults).
TEST(NodeProfileTest, ACacheMeasuredWithOtherSettingsIsMeasuredAgain) {
  testing::FakeAccelerator accelerator;
  const std::vector<ProfiledDevice*> devices = {&accelerator};
  const NodeProfileOptions options = SmallOptions(CachePath("settings"));
  absl::StatusOr<NodeProfileResult> first = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(first.ok()) << first.status();
  NodeProfileOptions larger = options;
  larger.memcpy_bytes = 2 << 20;
  EXPECT_NE(NodeFingerprint(devices, larger), NodeFingerprint(devices, options));
  absl::StatusOr<NodeProfileResult> r = LoadOrMeasureNodeProfile(devices, larger);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->cached);
  EXPECT_TRUE(Contains(r->notes, "with other settings")) << r->notes.size();
  NodeProfileOptions other_copies = larger;
  other_copies.links.repeats = 4;
  r = LoadOrMeasureNodeProfile(devices, other_copies);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->cached);
  r = LoadOrMeasureNodeProfile(devices, other_copies);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cached);
}

TEST(NodeProfileTest, AnotherMachinesOrADamagedCacheIsIgnoredWithANote) {
  testing::FakeAccelerator accelerator;
  const std::vector<ProfiledDevice*> devices = {&accelerator};
  const std::string path = CachePath("foreign");
  const NodeProfileOptions options = SmallOptions(path);

  tandem::v1::NodeProfile foreign;
  foreign.set_fingerprint("node-profile v1; cpu: another CPU (64 threads)");
  foreign.add_devices()->set_name("another CPU");
  foreign.set_host_memcpy_bytes_per_second(1e15);
  std::ofstream(path, std::ios::binary) << foreign.SerializeAsString();
  absl::StatusOr<NodeProfileResult> r = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->cached);
  EXPECT_TRUE(Contains(r->notes, "measured on other hardware")) << r->notes.size();
  EXPECT_LT(r->profile.host_memcpy_bytes_per_second(), 1e15);
  // The file now holds this node's profile.
  r = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->cached);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "\x0a\xff\xff garbage";
  r = LoadOrMeasureNodeProfile(devices, options);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->cached);
  EXPECT_TRUE(Contains(r->notes, "is damaged"));

  // A cache that cannot be written: measured, used, and said.
  NodeProfileOptions nowhere = options;
  nowhere.cache_path = path + ".d/missing/node_profile.pb";
  r = LoadOrMeasureNodeProfile(devices, nowhere);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Contains(r->notes, "node profile not cached"));
}

}  // namespace
}  // namespace tandem::profile
