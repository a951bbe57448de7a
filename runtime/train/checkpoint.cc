#include "runtime/train/checkpoint.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/atomic_file.h"
#include "base/status_macros.h"
#include "google/protobuf/text_format.h"

namespace tandem {
namespace {

constexpr char kMagic[8] = {'T', 'N', 'D', 'M', 'C', 'K', 'P', 'T'};
constexpr uint32_t kFormatVersion = 1;
constexpr char kCheckpointPrefix[] = "ckpt-";

// Writes all of `data` to `fd`, updating `crc`.
absl::Status WriteAll(int fd, const void* data, size_t n, uint32_t* crc, const std::string& path) {
  if (crc != nullptr) *crc = Crc32(*crc, data, n);
  return tandem::WriteAll(fd, data, n, path);
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  uLong c = crc;
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < n;) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n - done, size_t{1} << 30));
    c = crc32(c, reinterpret_cast<const Bytef*>(p + done), chunk);
    done += chunk;
  }
  return static_cast<uint32_t>(c);
}

absl::StatusOr<CheckpointFile> WriteCheckpoint(const std::string& path,
                                               tandem::v1::CheckpointHeader header,
                                               const std::vector<NamedTensor>& tensors) {
  header.set_format_version(kFormatVersion);
  header.clear_tensors();
  int64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    auto* entry = header.add_tensors();
    entry->set_name(t.name);
    entry->set_dtype("f32");
    entry->set_elements(t.elements);
    entry->set_offset(offset);
    offset += t.elements * 4;
  }
  const std::string header_bytes = header.SerializeAsString();
  CheckpointFile file;
  absl::StatusOr<int64_t> bytes = WriteFileAtomically(path, [&](int fd) -> absl::Status {
    uint32_t crc = 0;
    const uint32_t version = kFormatVersion;
    const uint64_t header_len = header_bytes.size();
    TANDEM_RETURN_IF_ERROR(WriteAll(fd, kMagic, sizeof(kMagic), &crc, path));
    TANDEM_RETURN_IF_ERROR(WriteAll(fd, &version, sizeof(version), &crc, path));
    TANDEM_RETURN_IF_ERROR(WriteAll(fd, &header_len, sizeof(header_len), &crc, path));
    TANDEM_RETURN_IF_ERROR(WriteAll(fd, header_bytes.data(), header_bytes.size(), &crc, path));
    for (const NamedTensor& t : tensors) {
      TANDEM_RETURN_IF_ERROR(WriteAll(fd, t.data, t.elements * 4, &crc, path));
    }
    file.crc32 = crc;
    return WriteAll(fd, &file.crc32, sizeof(file.crc32), nullptr, path);
  });
  if (!bytes.ok()) return bytes.status();
  file.bytes = *bytes;
  return file;
}

absl::StatusOr<tandem::v1::CheckpointHeader> ReadCheckpoint(const std::string& path,
                                                            const std::string& fingerprint,
                                                            const std::vector<NamedTensor>& into,
                                                            CheckpointFile* file) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open checkpoint '", path, "'"));
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t fixed = sizeof(kMagic) + 4 + 8;
  if (bytes.size() < fixed + 4 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::DataLossError(absl::StrCat("'", path, "' is not a Tandem checkpoint"));
  }
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + bytes.size() - 4, 4);
  // Over every byte but the CRC's, however many (a 32-bit length here once
  // made every checkpoint of 4 GiB or more read as damaged).
  if (Crc32(0, bytes.data(), bytes.size() - 4) != stored_crc) {
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' is damaged (CRC mismatch)"));
  }
  if (file != nullptr) *file = {static_cast<int64_t>(bytes.size()), stored_crc};
  uint32_t version;
  uint64_t header_len;
  std::memcpy(&version, bytes.data() + sizeof(kMagic), 4);
  std::memcpy(&header_len, bytes.data() + sizeof(kMagic) + 4, 8);
  if (version != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint '", path, "' has format version ",
                                                      version, "; this build reads ",
                                                      kFormatVersion));
  }
  if (header_len > bytes.size() - fixed - 4) {
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' has a bad header length"));
  }
  tandem::v1::CheckpointHeader header;
  if (!header.ParseFromArray(bytes.data() + fixed, static_cast<int>(header_len))) {
    return absl::DataLossError(absl::StrCat("checkpoint '", path, "' has an unreadable header"));
  }
  if (!fingerprint.empty() && header.model_fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint '", path, "' belongs to model ",
                                                      header.model_fingerprint(), ", not ",
                                                      fingerprint));
  }
  const char* data = bytes.data() + fixed + header_len;
  const int64_t data_bytes = static_cast<int64_t>(bytes.size() - fixed - header_len - 4);
  for (const NamedTensor& t : into) {
    const tandem::v1::CheckpointTensor* found = nullptr;
    for (const auto& entry : header.tensors()) {
      if (entry.name() == t.name) found = &entry;
    }
    if (found == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint '", path, "' has no tensor '", t.name, "'"));
    }
    // Compared without adding to the offset: a stored offset near 2^63 would
    // overflow the sum and pass (found with a crafted input after the fuzz run).
    const int64_t bytes = t.elements * 4;
    if (found->elements() != t.elements || found->offset() < 0 || bytes > data_bytes ||
        found->offset() > data_bytes - bytes) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint '", path, "': tensor '", t.name,
                                                        "' has ", found->elements(),
                                                        " elements, expected ", t.elements));
    }
    std::memcpy(t.data, data + found->offset(), t.elements * 4);
  }
  return header;
}

absl::Status WriteManifest(const std::string& path,
                           const tandem::v1::CheckpointManifest& manifest) {
  std::string text;
  if (!google::protobuf::TextFormat::PrintToString(manifest, &text)) {
    return absl::InternalError(absl::StrCat("cannot print the manifest for '", path, "'"));
  }
  return WriteFileAtomically(path, text);
}

absl::StatusOr<tandem::v1::CheckpointManifest> ReadManifest(const std::string& path) {
  const std::optional<std::string> text = ReadWholeFile(path);
  if (!text) return absl::NotFoundError(absl::StrCat("cannot read manifest '", path, "'"));
  tandem::v1::CheckpointManifest manifest;
  if (!google::protobuf::TextFormat::ParseFromString(*text, &manifest)) {
    return absl::DataLossError(absl::StrCat("manifest '", path, "' does not parse"));
  }
  return manifest;
}

std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir,
                                                             const std::string& suffix) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  const size_t prefix = std::strlen(kCheckpointPrefix);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, kCheckpointPrefix) || !absl::EndsWith(name, suffix)) continue;
    int64_t step;
    const std::string digits = name.substr(prefix, name.size() - prefix - suffix.size());
    if (absl::SimpleAtoi(digits, &step)) out.emplace_back(step, entry.path().string());
  }
  std::sort(out.begin(), out.end(), std::greater<>());
  return out;
}

std::string CheckpointPath(const std::string& dir, int64_t step, const std::string& suffix) {
  return absl::StrFormat("%s/%s%010d%s", dir, kCheckpointPrefix, step, suffix);
}

std::string SwaPath(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/swa-%010d%s", dir, step, kCheckpointSuffix);
}

void RemoveCheckpointStep(const std::string& dir, int64_t step) {
  ::unlink(CheckpointPath(dir, step, kCheckpointSuffix).c_str());
  ::unlink(CheckpointPath(dir, step, kManifestSuffix).c_str());
  ::unlink(SwaPath(dir, step).c_str());
}

void RemoveCheckpointsAfter(const std::string& dir, int64_t step) {
  for (const char* suffix : {kCheckpointSuffix, kManifestSuffix}) {
    for (const auto& [found, path] : ListCheckpoints(dir, suffix)) {
      if (found > step) RemoveCheckpointStep(dir, found);
    }
  }
}

}  // namespace tandem
