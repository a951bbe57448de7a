#include "base/build_info.h"

namespace tandem {

const char* TandemVersion() { return "0.1.0"; }

const char* GitCommit() {
  static const char kCommit[] =
#include "base/build_info_commit.inc"
      ;
  return kCommit;
}

std::string VersionString() { return std::string(TandemVersion()) + " (" + GitCommit() + ")"; }

}  // namespace tandem
