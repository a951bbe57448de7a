// Files written whole or not at all: a temporary file beside the target,
// fsync, rename over the target, fsync of the directory. A crash leaves the
// old file or the new one, never a torn one. Used by checkpoints and the
// profile caches; ReadWholeFile reads them back. Free functions; thread-safe:
// writers of one path in one process take turns (the last to finish wins).
#ifndef TANDEM_BASE_ATOMIC_FILE_H_
#define TANDEM_BASE_ATOMIC_FILE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Writes `path` through `write(fd)`; returns the file's size. Errors name the
// file and the system call.
absl::StatusOr<int64_t> WriteFileAtomically(const std::string& path,
                                            const std::function<absl::Status(int fd)>& write);
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// The whole of `path`; nullopt when it cannot be opened or read.
std::optional<std::string> ReadWholeFile(const std::string& path);

// All of `data` to `fd` (retrying short writes and EINTR); errors name `path`.
absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path);

}  // namespace tandem

#endif  // TANDEM_BASE_ATOMIC_FILE_H_
