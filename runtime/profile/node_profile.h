// The node profile (tandem.v1.NodeProfile): what this node's devices and links
// measure, independent of any model. Each device's fp32 GEMM rate and memory
// bandwidth (ProfiledDevice::MeasurePeaks), each accelerator's host links,
// pinned and pageable (MeasureHostLinks), the host's memcpy rate and its fused
// Adam update rate. A few seconds on 2 cores, so tandemd measures it once and
// caches it in one file, keyed by the node's fingerprint: a cached profile is
// used only when its fingerprint is this node's; a file from another machine
// (or another build of the measurement), a damaged or unreadable file, is
// ignored with a note saying why, and the node is measured again.
// Not thread-safe with other profiling (the devices measure each other).
#ifndef TANDEM_RUNTIME_PROFILE_NODE_PROFILE_H_
#define TANDEM_RUNTIME_PROFILE_NODE_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/profile/link_bandwidth.h"
#include "runtime/profile/profiled_device.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

struct NodeProfileOptions {
  // The cache file; empty = measure every time and store nothing.
  std::string cache_path;
  // Measure even when the cache holds this node's profile, and store the result.
  bool refresh = false;
  LinkOptions links;
  // The Adam rate is timed over this many fp32 parameters (16 bytes of state
  // each: 128 MiB, past the last-level caches of 2026 servers, held briefly).
  int64_t adam_parameters = int64_t{8} << 20;
  // memcpy is timed over two buffers of this size.
  int64_t memcpy_bytes = int64_t{64} << 20;
};

struct NodeProfileResult {
  tandem::v1::NodeProfile profile;
  // Whether `profile` came from the cache file.
  bool cached = false;
  // Sentences for the log: a cache file ignored and why, a failed store.
  std::vector<std::string> notes;
};

// A stable description of what the figures depend on: each device's id, name
// (the CPU's includes its thread count), memory and library versions, the
// measurement's version and its settings (`options`' sizes and repeats: a
// cache measured over other sizes is not served).
std::string NodeFingerprint(const std::vector<ProfiledDevice*>& devices,
                            const NodeProfileOptions& options = {});

// Measures every device in `devices` (the host first).
absl::StatusOr<tandem::v1::NodeProfile> MeasureNodeProfile(
    const std::vector<ProfiledDevice*>& devices, const NodeProfileOptions& options = {});

// The cached profile when options.cache_path holds this node's (and refresh
// is false); else measures, and stores the result there.
absl::StatusOr<NodeProfileResult> LoadOrMeasureNodeProfile(
    const std::vector<ProfiledDevice*>& devices, const NodeProfileOptions& options);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_NODE_PROFILE_H_
