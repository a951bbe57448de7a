// A private directory for the files a fuzz target writes its input into (the
// readers under test take paths): under $TEST_TMPDIR in `bazel test`, else
// $TMPDIR or /tmp; made once per process.
#ifndef TANDEM_FUZZ_SCRATCH_DIR_H_
#define TANDEM_FUZZ_SCRATCH_DIR_H_

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tandem::fuzz {

inline const std::string& ScratchDir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TEST_TMPDIR");
    if (base == nullptr) base = std::getenv("TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/tandem-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    return pattern;
  }();
  return dir;
}

// Replaces `name` in the scratch directory with `bytes`; returns its path.
inline std::string WriteScratchFile(const std::string& name, const std::string& bytes) {
  const std::string path = ScratchDir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() ||
      std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();
  }
  return path;
}

}  // namespace tandem::fuzz

#endif  // TANDEM_FUZZ_SCRATCH_DIR_H_
