#include "runtime/data/data_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

absl::Status FieldError(const std::string& field, const std::string& path,
                        const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' ", message));
}

absl::Status OpenError(const std::string& field, const std::string& path, int errnum) {
  const std::string message =
      absl::StrCat(field, ": cannot open '", path, "': ", std::strerror(errnum));
  if (errnum == ENOENT || errnum == ENOTDIR) return absl::NotFoundError(message);
  if (errnum == EACCES || errnum == EPERM) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

// What a file is, for messages: "a directory", "a FIFO", ...
const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status CheckRegular(const std::string& field, const std::string& path, mode_t mode) {
  if (S_ISREG(mode)) return absl::OkStatus();
  return FieldError(field, path,
                    absl::StrCat("is ", FileKind(mode), "; a dataset must be a regular file"));
}

// An open regular file. The type is checked before opening (opening some
// devices has effects of its own) and again on the descriptor (the path may
// have been replaced in between); O_NONBLOCK keeps a FIFO swapped in from
// blocking the open.
class RegularFile {
 public:
  ~RegularFile() {
    if (fd_ >= 0) close(fd_);
  }
  absl::Status Open(const std::string& field, const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return OpenError(field, path, errno);
    TANDEM_RETURN_IF_ERROR(CheckRegular(field, path, st.st_mode));
    fd_ = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) return OpenError(field, path, errno);
    if (fstat(fd_, &st) != 0) return OpenError(field, path, errno);
    TANDEM_RETURN_IF_ERROR(CheckRegular(field, path, st.st_mode));
    bytes_ = st.st_size;
    return absl::OkStatus();
  }
  int fd() const { return fd_; }
  int64_t bytes() const { return bytes_; }
  // Hands the descriptor to zlib, which closes it.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
  int64_t bytes_ = 0;
};

// The most bytes one byte of a deflate stream can inflate to.
constexpr int64_t kMaxDeflateRatio = 1032;

DataFileInfo Describe(const RegularFile& file) {
  DataFileInfo info;
  info.file_bytes = file.bytes();
  info.content_bytes = file.bytes();
  uint8_t magic[2] = {0, 0};
  // A gzip member is at least 18 bytes: header, empty deflate block, trailer.
  if (file.bytes() < 18 || pread(file.fd(), magic, 2, 0) != 2) return info;
  if (magic[0] != 0x1f || magic[1] != 0x8b) return info;
  uint8_t trailer[4];
  if (pread(file.fd(), trailer, 4, file.bytes() - 4) != 4) return info;
  info.gzip = true;
  const int64_t declared =
      static_cast<int64_t>(trailer[0]) | (static_cast<int64_t>(trailer[1]) << 8) |
      (static_cast<int64_t>(trailer[2]) << 16) | (static_cast<int64_t>(trailer[3]) << 24);
  // Never more than the file could inflate to: a 21-byte gzip whose trailer
  // claims 2.9 GB (found by fuzz/datasets_fuzz) is worth kilobytes, to the
  // reader's reservation and to admission alike.
  info.content_bytes = std::min(declared, kMaxDeflateRatio * file.bytes() + (int64_t{64} << 10));
  return info;
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

}  // namespace

absl::StatusOr<DataFileInfo> StatDataFile(const std::string& field, const std::string& path) {
  RegularFile file;
  TANDEM_RETURN_IF_ERROR(file.Open(field, path));
  return Describe(file);
}

absl::StatusOr<std::string> ReadDataFile(const std::string& field, const std::string& path,
                                         int64_t max_bytes, bool more_is_error) {
  RegularFile file;
  TANDEM_RETURN_IF_ERROR(file.Open(field, path));
  const DataFileInfo info = Describe(file);
  gzFile gz = gzdopen(file.Release(), "rb");
  if (gz == nullptr) return absl::ResourceExhaustedError(absl::StrCat(field, ": out of memory"));
  gzbuffer(gz, 1 << 17);
  std::string data;
  // One allocation of the expected size: growing by doubling would hold up to
  // twice the data at its peak.
  data.reserve(static_cast<size_t>(std::min(max_bytes, std::max<int64_t>(info.content_bytes, 0))));
  auto corrupt = [&]() {
    int errnum = 0;
    const std::string message = gzerror(gz, &errnum);
    gzclose(gz);
    return absl::DataLossError(absl::StrCat(field, ": '", path, "' is corrupt: ", message));
  };
  bool at_end = false;
  while (static_cast<int64_t>(data.size()) < max_bytes) {
    const size_t at = data.size();
    const int want = static_cast<int>(std::min<int64_t>(1 << 20, max_bytes - at));
    data.resize(at + want);
    const int n = gzread(gz, data.data() + at, want);
    if (n < 0) return corrupt();
    data.resize(at + n);
    if (n < want) {
      at_end = true;
      break;
    }
  }
  int errnum = Z_OK;
  gzerror(gz, &errnum);
  if (at_end && info.gzip && errnum == Z_BUF_ERROR) {
    // zlib hands out what it inflated and flags a stream cut short only here:
    // an interrupted copy would otherwise train on part of the file.
    gzclose(gz);
    return absl::DataLossError(absl::StrCat(field, ": '", path,
                                            "' is truncated: its gzip stream ends after ",
                                            data.size(), " bytes, before its end"));
  }
  if (more_is_error && static_cast<int64_t>(data.size()) == max_bytes) {
    char extra;
    const int n = gzread(gz, &extra, 1);
    if (n < 0) return corrupt();
    if (n > 0) {
      gzclose(gz);
      return FieldError(
          field, path,
          absl::StrCat(info.gzip ? "inflates" : "goes on", " past the ", max_bytes,
                       " bytes expected of it (its size when checked",
                       info.gzip ? ", by its gzip trailer" : "", "); it is not read further"));
    }
  }
  gzclose(gz);
  return data;
}

absl::StatusOr<IdxHeader> ParseIdxHeader(const std::string& field, const std::string& path,
                                         const std::string& head, int want_dims) {
  if (head.size() < 4 || head[0] != 0 || head[1] != 0) {
    return FieldError(field, path, "is not an IDX file (bad magic number)");
  }
  if (static_cast<uint8_t>(head[2]) != 0x08) {
    return FieldError(field, path,
                      absl::StrCat("holds IDX type 0x", absl::Hex(static_cast<uint8_t>(head[2])),
                                   "; only unsigned bytes (0x08) are supported"));
  }
  const int ndims = static_cast<uint8_t>(head[3]);
  if (ndims != want_dims) {
    return FieldError(field, path,
                      absl::StrCat("has ", ndims, " dimensions, expected ", want_dims));
  }
  IdxHeader header;
  header.header_bytes = 4 + 4 * int64_t{ndims};
  if (static_cast<int64_t>(head.size()) < header.header_bytes) {
    return absl::DataLossError(absl::StrCat(field, ": '", path, "' is truncated in its header"));
  }
  int64_t elements = 1;
  for (int i = 0; i < ndims; ++i) {
    const int64_t d = BigEndian32(head, 4 + 4 * i);
    if (d <= 0 || d > (int64_t{1} << 28)) {
      return FieldError(field, path, absl::StrCat("has an implausible dimension ", d));
    }
    if (__builtin_mul_overflow(elements, d, &elements) || elements > kMaxIdxPayloadBytes) {
      return FieldError(field, path,
                        absl::StrCat("describes more than the ", kMaxIdxPayloadBytes,
                                     " bytes of data an IDX file may hold"));
    }
    header.dims.push_back(d);
  }
  header.payload_bytes = elements;
  return header;
}

absl::StatusOr<IdxHeader> ReadIdxHeader(const std::string& field, const std::string& path,
                                        int want_dims) {
  TANDEM_ASSIGN_OR_RETURN(const DataFileInfo info, StatDataFile(field, path));
  TANDEM_ASSIGN_OR_RETURN(const std::string head,
                          ReadDataFile(field, path, 4 + 4 * int64_t{want_dims}, false));
  TANDEM_ASSIGN_OR_RETURN(const IdxHeader header, ParseIdxHeader(field, path, head, want_dims));
  const int64_t described = header.header_bytes + header.payload_bytes;
  if (info.gzip) {
    // The trailer holds the inflated size modulo 2^32.
    if (info.content_bytes != described % (int64_t{1} << 32)) {
      return FieldError(
          field, path,
          absl::StrCat("inflates to ", info.content_bytes,
                       " bytes by its gzip trailer, but its header describes ", described));
    }
  } else if (info.file_bytes < described) {
    return absl::DataLossError(absl::StrCat(field, ": '", path,
                                            "' is truncated: its header promises ", described,
                                            " bytes, the file holds ", info.file_bytes));
  } else if (info.file_bytes > described) {
    return FieldError(
        field, path,
        absl::StrCat("holds ", info.file_bytes, " bytes, but its header describes ", described));
  }
  return header;
}

absl::StatusOr<std::string> ReadIdxPayload(const std::string& field, const std::string& path,
                                           const IdxHeader& header) {
  const int64_t described = header.header_bytes + header.payload_bytes;
  TANDEM_ASSIGN_OR_RETURN(std::string data, ReadDataFile(field, path, described, true));
  if (static_cast<int64_t>(data.size()) < described) {
    return absl::DataLossError(absl::StrCat(
        field, ": '", path, "' is truncated: its header promises ", header.payload_bytes,
        " bytes of data, the file holds ",
        std::max<int64_t>(0, static_cast<int64_t>(data.size()) - header.header_bytes)));
  }
  // In place: a copy of the payload would hold the data twice.
  data.erase(0, header.header_bytes);
  return data;
}

}  // namespace tandem
