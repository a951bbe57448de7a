// Checkpoint files: a CheckpointHeader (checkpoint.proto) and named fp32 tensors,
// with a CRC over everything. Writes are atomic: a temporary file in the same
// directory, fsync, rename over the target, fsync of the directory, so a crash
// leaves either the old checkpoint or the new one, never half of one.
// Stateless functions; thread-safe for distinct paths.
#ifndef TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_
#define TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/checkpoint.pb.h"

namespace tandem {

struct NamedTensor {
  std::string name;
  float* data = nullptr;
  int64_t elements = 0;
};

// Writes `header` (its `tensors` list is filled here) and the tensors to `path`.
// Returns the file size in bytes.
absl::StatusOr<int64_t> WriteCheckpoint(const std::string& path,
                                        tandem::v1::CheckpointHeader header,
                                        const std::vector<NamedTensor>& tensors);

// Reads `path`, checks the CRC, the model fingerprint (when `fingerprint` is not
// empty) and that every tensor of `into` is present with the same size, then
// fills them. DATA_LOSS for a damaged file, FAILED_PRECONDITION for a checkpoint
// of another model.
absl::StatusOr<tandem::v1::CheckpointHeader> ReadCheckpoint(const std::string& path,
                                                            const std::string& fingerprint,
                                                            const std::vector<NamedTensor>& into);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_CHECKPOINT_H_
