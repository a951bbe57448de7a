// Version and build provenance of this binary, for --version, NodeInfo and the
// tandem_build_info metric. Thread-safe: constants only.
#ifndef TANDEM_BASE_BUILD_INFO_H_
#define TANDEM_BASE_BUILD_INFO_H_

#include <string>

namespace tandem {

// Semantic version of Tandem, e.g. "0.1.0".
const char* TandemVersion();
// Short commit hash the binary was built from ("-dirty" when the tree had local
// changes), or "unknown".
const char* GitCommit();
// "0.1.0 (abc123def456)".
std::string VersionString();

}  // namespace tandem

#endif  // TANDEM_BASE_BUILD_INFO_H_
