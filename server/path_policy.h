// Confines job paths to a root directory (--data_root for datasets). A path is
// resolved against the root when relative, symlinks and ".." are resolved, and
// the result must lie inside the root; anything else is refused with
// INVALID_ARGUMENT naming the field. Thread-safe (stateless after construction).
#ifndef TANDEM_SERVER_PATH_POLICY_H_
#define TANDEM_SERVER_PATH_POLICY_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem::server {

class PathPolicy {
 public:
  // `root` must exist.
  static absl::StatusOr<PathPolicy> Create(const std::string& root);
  // The resolved path of `path`, or an error naming `field`.
  absl::StatusOr<std::string> Resolve(const std::string& field, const std::string& path) const;
  const std::string& root() const { return root_; }

 private:
  explicit PathPolicy(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_PATH_POLICY_H_
