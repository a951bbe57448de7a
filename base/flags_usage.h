// Makes `--help` on our binaries list our own flags (absl's default matches the
// source file against the program name, which lists nothing for main.cc).
#ifndef TANDEM_BASE_FLAGS_USAGE_H_
#define TANDEM_BASE_FLAGS_USAGE_H_

namespace tandem {

// Call before absl::ParseCommandLine. `usage` is the text shown above the flags.
void InstallFlagsUsage(const char* usage);

}  // namespace tandem

#endif  // TANDEM_BASE_FLAGS_USAGE_H_
