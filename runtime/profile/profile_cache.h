// Profiles cached on disk, so asking again for the same model on the same node
// is instant. A profile is keyed by everything that changes its figures: the
// model's fingerprint (architecture and sample shape), the batch size, the
// optimizer (kind and moments), the devices (ids and names, which include the
// CPU thread count), the software (Tandem's version and commit, oneDNN, CUDA),
// and the measurement (iterations, warm-up).
//
// Files: <dir>/<key>.profile.pb (a serialized Profile) and, when recorded,
// <dir>/<key>.trace.json (its Chrome trace), each written atomically
// (checkpoint.h's WriteFileAtomically), so a reader never sees half a file. A
// damaged file reads as a miss and is overwritten by the next store.
// Thread-safe for distinct keys; concurrent stores of one key leave one of
// them.
#ifndef TANDEM_RUNTIME_PROFILE_PROFILE_CACHE_H_
#define TANDEM_RUNTIME_PROFILE_PROFILE_CACHE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::profile {

// 32 hex digits: two 64-bit FNV-1a hashes of `canonical` (a stable, printable
// description of what the key covers).
std::string HexKey(const std::string& canonical);

class ProfileCache {
 public:
  // An empty `dir` caches nothing: loads miss and stores do nothing.
  explicit ProfileCache(std::string dir) : dir_(std::move(dir)) {}

  bool enabled() const { return !dir_.empty(); }
  std::optional<tandem::v1::Profile> Load(const std::string& key) const;
  std::optional<std::string> LoadTrace(const std::string& key) const;
  // Creates the directory when missing. An empty trace stores none.
  absl::Status Store(const std::string& key, const tandem::v1::Profile& profile,
                     const std::string& chrome_trace_json) const;

  std::string ProfilePath(const std::string& key) const;
  std::string TracePath(const std::string& key) const;

 private:
  std::string dir_;
};

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_PROFILE_CACHE_H_
