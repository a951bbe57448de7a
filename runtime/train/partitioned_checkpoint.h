// Checkpoints of ZeRO-partitioned data-parallel jobs (docs/distributed.md).
// Each rank writes only its own pieces of the optimizer state, as
// ckpt-<step>.tdm in its own checkpoint directory (rank 0's file also holds
// the weights, the buffers and the position). Once every rank has written its
// partition, rank 0 (the job's coordinator) commits ckpt-<step>.manifest,
// atomically, naming each partition's node, file, size and CRC. A partition
// without a manifest is not a checkpoint: a crash between the writes and the
// commit leaves the previous manifest in force.
//
// A resume: rank 0 loads the newest manifest whose partition 0 is intact,
// every rank starts at its step (StepRunner::SynchronizeStart), and each
// other rank loads its own partition of that step, which must be the file
// the manifest names (same size and CRC). The coordinator places rank r on
// the node that holds its partition (PartitionNodes).
//
// Every call that takes a StepRunner is a collective: all ranks make it, in
// the same order.
#ifndef TANDEM_RUNTIME_TRAIN_PARTITIONED_CHECKPOINT_H_
#define TANDEM_RUNTIME_TRAIN_PARTITIONED_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/exec/step_runner.h"
#include "runtime/train/checkpoint.h"
#include "tandem/v1/checkpoint.pb.h"

namespace tandem {

// What a partitioned save or load leaves: the manifest's path (rank 0) or the
// partition's (the others), and the bytes of all partitions.
struct SavedPartitions {
  std::string path;
  int64_t bytes = 0;
};

// Writes this rank's partition of the checkpoint at header.step() into `dir`
// (`whole`: the weights and buffers, rank 0 only), waits for every rank's, and
// on rank 0 commits the manifest, naming rank r's node nodes[r] ("rank r"
// where `nodes` is short). A rank whose write failed fails every rank's call,
// naming it. Then each rank prunes its files: rank 0 keeps the newest `keep`
// manifests and what they name, the others keep `keep` + 1 partitions (their
// newest may not be committed).
absl::StatusOr<SavedPartitions> SavePartitioned(StepRunner& runner, const StatePartition& part,
                                                const std::string& dir,
                                                tandem::v1::CheckpointHeader header,
                                                const std::vector<NamedTensor>& whole,
                                                const std::vector<std::string>& nodes, int keep);

// Rank 0: the newest manifest in `dir` whose own partition loads into `whole`
// and `part` (a damaged newest falls back to the one before, with `skipped`
// told why). nullopt when there is none. FAILED_PRECONDITION for a manifest of
// another model, rank count or layout.
struct LoadedManifest {
  tandem::v1::CheckpointManifest manifest;
  tandem::v1::CheckpointHeader header;
  std::string path;
};
absl::StatusOr<std::optional<LoadedManifest>> LoadNewestManifest(
    const std::string& dir, const std::string& fingerprint, const StatePartition& part,
    const std::vector<NamedTensor>& whole, const std::function<void(const std::string&)>& skipped);

// Every rank, once all start at `step` (> 0): rank 0 sends what `manifest`
// (rank 0's; null elsewhere) records of each partition, every other rank
// loads its own from `dir` and checks it against that, and every rank learns
// whether all did. Returns this rank's partition's path; an error naming the
// rank (and, on that rank, the cause) otherwise.
absl::StatusOr<std::string> LoadOwnPartition(StepRunner& runner, const StatePartition& part,
                                             const std::string& dir, int64_t step,
                                             const std::string& fingerprint,
                                             const tandem::v1::CheckpointManifest* manifest);

// The coordinator: the nodes that hold ranks 1..N-1's partitions of the
// newest readable manifest in `dir`, and its step; nullopt when there is none
// (or it is of another rank count).
struct PartitionPlacement {
  int64_t step = 0;
  std::vector<std::string> nodes;
};
std::optional<PartitionPlacement> PartitionNodes(const std::string& dir, int ranks);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_PARTITIONED_CHECKPOINT_H_
