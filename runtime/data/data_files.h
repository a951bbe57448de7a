// Dataset files named by untrusted job specs, read so that a file can never
// make the reader block, nor hold more memory than was reserved for it:
// only regular files are opened (a FIFO or a device is refused before any read
// could block on it), and no read returns more bytes than the caller's cap. A
// gzip file's size is what its trailer declares; one that inflates past it, or
// an IDX file whose bytes differ from what its header describes, is an error
// that names the field and says what is wrong.
#ifndef TANDEM_RUNTIME_DATA_DATA_FILES_H_
#define TANDEM_RUNTIME_DATA_DATA_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct DataFileInfo {
  int64_t file_bytes = 0;
  bool gzip = false;
  // The bytes a whole read gives: the file's size, or for gzip the size its
  // trailer declares (which is modulo 4 GiB, so a gzip file is read up to
  // 4 GiB; one that inflates further fails when read), at most what its bytes
  // could inflate to (deflate's 1032:1, and 64 KiB).
  int64_t content_bytes = 0;
};

// Opens `path` without blocking, refuses anything but a regular file (naming
// what it is: a directory, a FIFO, ...) and reads its gzip magic and trailer.
absl::StatusOr<DataFileInfo> StatDataFile(const std::string& field, const std::string& path);

// The file's content, gunzipped when it is gzip, at most `max_bytes` of it.
// With `more_is_error`, content past `max_bytes` is an error (the file is
// larger than declared) rather than ignored (a read of the head only).
absl::StatusOr<std::string> ReadDataFile(const std::string& field, const std::string& path,
                                         int64_t max_bytes, bool more_is_error);

// An IDX file of unsigned bytes: its dimensions and where its data lies.
struct IdxHeader {
  std::vector<int64_t> dims;
  int64_t header_bytes = 0;
  // The product of the dimensions: the data bytes the header promises.
  int64_t payload_bytes = 0;
};

// The most data bytes one IDX file may describe (its dimensions' product is
// computed with overflow checks and capped here: 64 GiB).
constexpr int64_t kMaxIdxPayloadBytes = int64_t{1} << 36;

// Parses the header at the start of `head` (which may hold more bytes):
// magic, type 0x08, `want_dims` dimensions each in [1, 2^28] with a product up
// to kMaxIdxPayloadBytes. `head` shorter than the header is DATA_LOSS.
absl::StatusOr<IdxHeader> ParseIdxHeader(const std::string& field, const std::string& path,
                                         const std::string& head, int want_dims);

// Reads an IDX file's header (16 bytes at most) and checks the file against
// it: a plain file must hold exactly the bytes the header describes; a gzip
// file is checked when read.
absl::StatusOr<IdxHeader> ReadIdxHeader(const std::string& field, const std::string& path,
                                        int want_dims);

// Reads a whole IDX file: exactly the bytes its header describes (DATA_LOSS
// when fewer, INVALID_ARGUMENT when the content goes on), returning the data
// without the header.
absl::StatusOr<std::string> ReadIdxPayload(const std::string& field, const std::string& path,
                                           const IdxHeader& header);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DATA_DATA_FILES_H_
