// Tests' scratch directories: `name` under Bazel's TEST_TMPDIR (/tmp outside
// Bazel), emptied first so a test starts from nothing. Not created.
#ifndef TANDEM_BASE_TEST_DIR_H_
#define TANDEM_BASE_TEST_DIR_H_

#include <cstdlib>
#include <filesystem>
#include <string>

namespace tandem {

inline std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace tandem

#endif  // TANDEM_BASE_TEST_DIR_H_
