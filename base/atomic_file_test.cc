// Files written whole: two threads writing one path at once (two jobs storing
// the same cached layer profile) take turns, so every write succeeds and the
// file is always one writer's whole content, never a blend.
#include "base/atomic_file.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(AtomicFileTest, WritersOfOnePathTakeTurns) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/atomic_file_test";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/profile.pb";
  // 256 KiB each, of one byte per writer.
  const std::vector<std::string> contents = {std::string(256 << 10, 'a'),
                                             std::string(256 << 10, 'b')};
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (const std::string& content : contents) {
    writers.emplace_back([&, content] {
      for (int i = 0; i < 50; ++i) {
        if (!WriteFileAtomically(path, content).ok()) ++failures;
      }
    });
  }
  std::atomic<bool> done{false};
  int reads = 0, blends = 0;
  std::thread reader([&] {
    while (!done) {
      const std::optional<std::string> got = ReadWholeFile(path);
      if (!got) continue;
      ++reads;
      if (*got != contents[0] && *got != contents[1]) ++blends;
    }
  });
  for (std::thread& t : writers) t.join();
  done = true;
  reader.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(blends, 0) << "of " << reads << " reads";
  const std::optional<std::string> last = ReadWholeFile(path);
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(*last == contents[0] || *last == contents[1]);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp." + std::to_string(::getpid())));
}

}  // namespace
}  // namespace tandem
