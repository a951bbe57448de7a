#include "base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " '", path, "': ", std::strerror(errno)));
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Writers of one path in this process take turns: each writes through the
// same temporary file (path.tmp.<pid>), which two at once would interleave
// (and the second rename would find it gone). A path's lock lives while
// someone holds or waits for it.
class PathTurn {
 public:
  explicit PathTurn(const std::string& path) : path_(path) {
    {
      absl::MutexLock lock(&Registry().mu);
      Entry& e = Registry().paths[path_];
      ++e.users;
      mu_ = &e.mu;
    }
    mu_->Lock();
  }
  ~PathTurn() {
    mu_->Unlock();
    absl::MutexLock lock(&Registry().mu);
    auto it = Registry().paths.find(path_);
    if (--it->second.users == 0) Registry().paths.erase(it);
  }

 private:
  struct Entry {
    absl::Mutex mu;
    int users = 0;
  };
  struct Paths {
    absl::Mutex mu;
    // A std::map: an entry does not move while others come and go.
    std::map<std::string, Entry> paths ABSL_GUARDED_BY(mu);
  };
  static Paths& Registry() {
    static Paths* paths = new Paths;  // never destroyed: writers may outlive main
    return *paths;
  }
  const std::string path_;
  absl::Mutex* mu_ = nullptr;
};

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Errno("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Errno("cannot fsync directory", dir);
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WriteFileAtomically(const std::string& path,
                                            const std::function<absl::Status(int fd)>& write) {
  const PathTurn turn(path);
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create", tmp);
  absl::Status s = write(fd);
  if (s.ok() && ::fsync(fd) != 0) s = Errno("cannot fsync", tmp);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  if (::close(fd) != 0 && s.ok()) s = Errno("cannot close", tmp);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = Errno("cannot rename to", path);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  TANDEM_RETURN_IF_ERROR(SyncDirectory(DirName(path)));
  return static_cast<int64_t>(size);
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  return WriteFileAtomically(path,
                             [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size(), path); })
      .status();
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  if (f.bad()) return std::nullopt;
  return ss.str();
}

}  // namespace tandem
