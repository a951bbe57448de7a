// The host link of a device: host-to-device and device-to-host copy bandwidth,
// from pageable and from page-locked (pinned) host memory, at several sizes.
// Small copies give the fixed cost per transfer (latency), large ones the
// asymptotic bandwidth; the planner's copy model is bytes / bandwidth + latency.
// Stateless; drives the device from the calling thread.
#ifndef TANDEM_RUNTIME_PROFILE_LINK_BANDWIDTH_H_
#define TANDEM_RUNTIME_PROFILE_LINK_BANDWIDTH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/profile/profiled_device.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

struct LinkOptions {
  // Copy sizes, in bytes, ascending.
  std::vector<int64_t> sizes_bytes = {int64_t{4} << 10, int64_t{256} << 10, int64_t{4} << 20,
                                      int64_t{64} << 20};
  // Timed copies per size after one warm-up; the median is reported.
  int repeats = 5;
};

// Four LinkProfiles (host-to-device and device-to-host, each pageable and
// pinned), or two when the device has no pinned host memory. Each has a sample
// per size; bandwidth_bytes_per_second is the largest size's, latency_seconds
// the smallest size's median time. Host ids are "cpu". Empty for a device
// without a host link (the CPU itself).
absl::StatusOr<std::vector<tandem::v1::LinkProfile>> MeasureHostLinks(
    ProfiledDevice& device, const LinkOptions& options = {});

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_LINK_BANDWIDTH_H_
