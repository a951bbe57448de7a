#include "base/flags_usage.h"

#include <string>

#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "base/build_info.h"

namespace tandem {
namespace {

bool IsTandemSource(absl::string_view path) {
  for (const char* dir : {"server/", "clients/", "runtime/", "planner/", "bench/", "tests/"}) {
    if (absl::StrContains(path, dir)) return true;
  }
  return false;
}

}  // namespace

void InstallFlagsUsage(const char* usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.contains_help_flags = IsTandemSource;
  config.contains_helpshort_flags = IsTandemSource;
  config.version_string = [] { return "tandem " + VersionString() + "\n"; };
  config.normalize_filename = [](absl::string_view f) { return std::string(f); };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace tandem
