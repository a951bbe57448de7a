#include "runtime/profile/node_profile.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/atomic_file.h"
#include "base/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "runtime/core/clock.h"
#include "runtime/optim/kernels.h"

namespace tandem::profile {
namespace {

// Bumped when what is measured, or how, changes: older files are then another
// node's as far as the cache is concerned.
constexpr char kMeasurementVersion[] = "node-profile v2";  // v2: GEMM on one thread
constexpr int kRepeats = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes copied per second by memcpy between two buffers of `bytes`, the
// median of kRepeats after one warm-up (which also faults the pages in).
double MeasureMemcpy(int64_t bytes) {
  std::unique_ptr<char[]> a(new char[bytes]), b(new char[bytes]);
  std::memset(a.get(), 1, bytes);
  std::memcpy(b.get(), a.get(), bytes);
  std::vector<double> rates;
  for (int r = 0; r < kRepeats; ++r) {
    const double start = WallSeconds();
    std::memcpy(r % 2 ? a.get() : b.get(), r % 2 ? b.get() : a.get(), bytes);
    rates.push_back(bytes / std::max(1e-9, WallSeconds() - start));
  }
  return Median(rates);
}

// Parameters per second of the fused Adam update over `n` parameters.
double MeasureAdam(int64_t n) {
  std::vector<float> p(n, 0.5f), g(n, 1e-3f), m(n, 0.0f), v(n, 0.0f);
  optim::AdamStep step;
  optim::AdamUpdate(p.data(), g.data(), m.data(), v.data(), n, step);
  std::vector<double> rates;
  for (int r = 0; r < kRepeats; ++r) {
    step.t = r + 2;
    const double start = WallSeconds();
    optim::AdamUpdate(p.data(), g.data(), m.data(), v.data(), n, step);
    rates.push_back(n / std::max(1e-9, WallSeconds() - start));
  }
  return Median(rates);
}

// The cached profile at `path` if it is this node's; otherwise nullopt and,
// when a file was there, why it was not used in `note`.
std::optional<tandem::v1::NodeProfile> LoadCached(const std::string& path,
                                                  const std::string& fingerprint,
                                                  std::string* note) {
  std::error_code missing;
  if (!std::filesystem::exists(path, missing)) return std::nullopt;
  const std::optional<std::string> bytes = ReadWholeFile(path);
  if (!bytes) {
    *note = absl::StrCat("node profile cache ", path, " could not be read; measuring again");
    return std::nullopt;
  }
  tandem::v1::NodeProfile cached;
  if (!cached.ParseFromString(*bytes) || cached.fingerprint().empty() ||
      cached.devices_size() == 0) {
    *note = absl::StrCat("node profile cache ", path,
                         " is damaged (not a NodeProfile); ignored, measuring again");
    return std::nullopt;
  }
  if (cached.fingerprint() != fingerprint) {
    *note = absl::StrCat(
        "node profile cache ", path, " was measured on other hardware or with other settings (",
        cached.fingerprint(), "; this node: ", fingerprint, "); ignored, measuring again");
    return std::nullopt;
  }
  return cached;
}

}  // namespace

std::string NodeFingerprint(const std::vector<ProfiledDevice*>& devices,
                            const NodeProfileOptions& options) {
  std::vector<std::string> parts = {kMeasurementVersion};
  parts.push_back(absl::StrCat("over Adam ", options.adam_parameters, " parameters, memcpy ",
                               options.memcpy_bytes, " bytes, copies of ",
                               absl::StrJoin(options.links.sizes_bytes, "/"), " bytes x",
                               options.links.repeats));
  for (ProfiledDevice* d : devices) {
    const tandem::v1::DeviceProfile described = d->Describe();
    std::vector<std::string> versions;
    for (const auto& [name, version] : d->Versions()) versions.push_back(name + " " + version);
    parts.push_back(absl::StrCat(described.id(), ": ", described.name(), ", ",
                                 described.memory_bytes(), " bytes, ",
                                 absl::StrJoin(versions, ", ")));
  }
  return absl::StrJoin(parts, "; ");
}

absl::StatusOr<tandem::v1::NodeProfile> MeasureNodeProfile(
    const std::vector<ProfiledDevice*>& devices, const NodeProfileOptions& options) {
  const double start = WallSeconds();
  tandem::v1::NodeProfile profile;
  profile.set_fingerprint(NodeFingerprint(devices, options));
  for (ProfiledDevice* device : devices) {
    tandem::v1::DeviceProfile* d = profile.add_devices();
    *d = device->Describe();
    TANDEM_RETURN_IF_ERROR(device->MeasurePeaks(d));
    if (device->has_host_link()) {
      TANDEM_ASSIGN_OR_RETURN(std::vector<tandem::v1::LinkProfile> links,
                              MeasureHostLinks(*device, options.links));
      for (auto& link : links) *profile.add_links() = std::move(link);
    }
  }
  profile.set_host_memcpy_bytes_per_second(MeasureMemcpy(options.memcpy_bytes));
  profile.set_host_adam_parameters_per_second(MeasureAdam(options.adam_parameters));
  *profile.mutable_measured_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
  profile.set_measure_seconds(WallSeconds() - start);
  return profile;
}

absl::StatusOr<NodeProfileResult> LoadOrMeasureNodeProfile(
    const std::vector<ProfiledDevice*>& devices, const NodeProfileOptions& options) {
  NodeProfileResult result;
  const std::string fingerprint = NodeFingerprint(devices, options);
  if (!options.cache_path.empty() && !options.refresh) {
    std::string note;
    std::optional<tandem::v1::NodeProfile> cached =
        LoadCached(options.cache_path, fingerprint, &note);
    if (!note.empty()) result.notes.push_back(note);
    if (cached) {
      result.profile = *std::move(cached);
      result.cached = true;
      return result;
    }
  }
  TANDEM_ASSIGN_OR_RETURN(result.profile, MeasureNodeProfile(devices, options));
  if (!options.cache_path.empty()) {
    const absl::Status stored =
        WriteFileAtomically(options.cache_path, result.profile.SerializeAsString());
    if (!stored.ok()) {
      result.notes.push_back(absl::StrCat("node profile not cached: ", stored.message(),
                                          " (measured again next time)"));
    }
  }
  return result;
}

}  // namespace tandem::profile
