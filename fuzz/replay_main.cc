// The main() of a fuzz target built without libFuzzer (the default, GCC build):
// runs LLVMFuzzerTestOneInput once on every file named on the command line, or
// in a directory named there, so `bazel test //fuzz/...` replays each target's
// corpus as a regression test. Arguments starting with '-' are libFuzzer flags
// and are ignored, so one command line serves both builds.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::string> FilesUnder(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "replay: cannot stat '%s'\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> files;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) {
    std::fprintf(stderr, "replay: cannot open directory '%s'\n", path.c_str());
    std::exit(2);
  }
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    for (std::string& f : FilesUnder(path + "/" + name)) files.push_back(std::move(f));
  }
  closedir(dir);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] == '-') continue;
    for (std::string& f : FilesUnder(argv[i])) files.push_back(std::move(f));
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIR... (no inputs found)\n", argv[0]);
    return 2;
  }
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs\n", files.size());
  return 0;
}
