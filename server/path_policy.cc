#include "server/path_policy.h"

#include <filesystem>

#include "absl/strings/str_cat.h"

namespace tandem::server {

namespace fs = std::filesystem;

absl::StatusOr<PathPolicy> PathPolicy::Create(const std::string& root) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(root, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--data_root '", root, "': ", ec.message()));
  return PathPolicy(canonical.string());
}

absl::StatusOr<std::string> PathPolicy::Resolve(const std::string& field,
                                                const std::string& path) const {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": is required"));
  if (path.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": path longer than 4096 characters"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": path contains a NUL byte"));
  }
  const fs::path joined = fs::path(path).is_absolute() ? fs::path(path) : fs::path(root_) / path;
  std::error_code ec;
  // Resolves symlinks of the existing prefix, then "." and "..".
  const fs::path resolved = fs::weakly_canonical(joined, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "': ", ec.message()));
  const std::string r = resolved.string();
  if (r != root_ && r.compare(0, root_.size() + 1, root_ + "/") != 0 && root_ != "/") {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": '", path, "' is outside the data root ", root_));
  }
  return r;
}

}  // namespace tandem::server
