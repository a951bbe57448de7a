// Checkpoint files: a CheckpointHeader (checkpoint.proto) and named fp32 tensors,
// with a CRC over everything. Writes are atomic: a temporary file in the same
// directory, fsync, rename over the target, fsync of the directory, so a crash
// leaves either the old checkpoint or the new one, never half of one.
// Stateless functions; thread-safe for distinct paths.
#ifndef TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_
#define TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/checkpoint.pb.h"

namespace tandem {

struct NamedTensor {
  std::string name;
  float* data = nullptr;
  int64_t elements = 0;
};

// A checkpoint file as written or read: its size and its trailing CRC-32,
// which a partitioned checkpoint's manifest records for each partition.
struct CheckpointFile {
  int64_t bytes = 0;
  uint32_t crc32 = 0;
};

// zlib's CRC-32 of `n` bytes at `data`, continuing from `crc` (0 to start),
// for any length: zlib takes 32-bit lengths, so this feeds it in pieces (a
// checkpoint of a 358M-parameter model with Adam is past 4 GiB).
uint32_t Crc32(uint32_t crc, const void* data, size_t n);

// Writes `header` (its `tensors` list is filled here) and the tensors to `path`.
absl::StatusOr<CheckpointFile> WriteCheckpoint(const std::string& path,
                                               tandem::v1::CheckpointHeader header,
                                               const std::vector<NamedTensor>& tensors);

// Reads `path`, checks the CRC, the model fingerprint (when `fingerprint` is not
// empty) and that every tensor of `into` is present with the same size, then
// fills them. DATA_LOSS for a damaged file, FAILED_PRECONDITION for a checkpoint
// of another model. `file` (when not null) gets the file's size and CRC.
absl::StatusOr<tandem::v1::CheckpointHeader> ReadCheckpoint(const std::string& path,
                                                            const std::string& fingerprint,
                                                            const std::vector<NamedTensor>& into,
                                                            CheckpointFile* file = nullptr);

// A partitioned checkpoint's manifest, written atomically (text format) or
// read back; DATA_LOSS when it does not parse.
absl::Status WriteManifest(const std::string& path, const tandem::v1::CheckpointManifest& manifest);
absl::StatusOr<tandem::v1::CheckpointManifest> ReadManifest(const std::string& path);

// ckpt-<step><suffix> in `dir` (".tdm": checkpoints; ".manifest": manifests),
// newest step first; and the path of one.
std::vector<std::pair<int64_t, std::string>> ListCheckpoints(const std::string& dir,
                                                             const std::string& suffix);
std::string CheckpointPath(const std::string& dir, int64_t step, const std::string& suffix);
inline constexpr char kCheckpointSuffix[] = ".tdm";
inline constexpr char kManifestSuffix[] = ".manifest";

// SWA's average at a checkpoint's step: swa-<step>.tdm beside ckpt-<step>.tdm,
// kept and pruned with it, so whichever checkpoint a resume loads has its own.
std::string SwaPath(const std::string& dir, int64_t step);
// Removes a step's checkpoint, manifest and SWA average, where they exist.
void RemoveCheckpointStep(const std::string& dir, int64_t step);
// Removes every step past `step`: a run resumed from an older checkpoint (a
// newer one was damaged) abandoned them, and they are never the ones to keep.
void RemoveCheckpointsAfter(const std::string& dir, int64_t step);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_
