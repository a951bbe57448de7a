// Reading a HardwareSpec or a Profile from a file, for `tandem plan
// --hardware=FILE | --profile=FILE` and the planner's benchmarks: protobuf
// text format (.textproto, .txtpb, .pbtxt, with # comments) or the protobuf
// JSON mapping (.json). Errors say which file, line and column. Free
// functions; thread-safe.
#ifndef TANDEM_PLANNER_SPEC_FILES_H_
#define TANDEM_PLANNER_SPEC_FILES_H_

#include <string>

#include "absl/status/statusor.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::planner {

// NOT_FOUND when the file cannot be read; INVALID_ARGUMENT when it does not
// parse (with the position) or has an unknown extension.
absl::StatusOr<tandem::v1::HardwareSpec> LoadHardwareSpec(const std::string& path);
absl::StatusOr<tandem::v1::Profile> LoadProfile(const std::string& path);

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_SPEC_FILES_H_
