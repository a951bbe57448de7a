#include "runtime/train/partitioned_checkpoint.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "google/protobuf/util/time_util.h"

namespace tandem {
namespace {

using tandem::v1::CheckpointManifest;

// The tensors of `part`, as its checkpoint file names them.
std::vector<NamedTensor> PartitionTensors(const StatePartition& part) {
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < part.moments.size(); ++i) {
    tensors.push_back(
        {absl::StrCat("optimizer.", i, ".partition"), part.moments[i], part.elements});
  }
  return tensors;
}

// The first rank whose figure `at` (of `per_rank` each) in `all` is zero; -1
// when none is.
int FirstFailed(const std::vector<double>& all, size_t per_rank, size_t at) {
  for (size_t r = 0; r * per_rank < all.size(); ++r) {
    if (all[r * per_rank + at] == 0) return static_cast<int>(r);
  }
  return -1;
}

void Prune(const std::string& dir, int rank, int keep, int64_t current) {
  RemoveCheckpointsAfter(dir, current);
  if (rank != 0) {
    const auto parts = ListCheckpoints(dir, kCheckpointSuffix);
    for (size_t i = keep + 1; i < parts.size(); ++i) RemoveCheckpointStep(dir, parts[i].first);
    return;
  }
  const auto manifests = ListCheckpoints(dir, kManifestSuffix);
  if (static_cast<int>(manifests.size()) < keep) return;
  const int64_t oldest_kept = manifests[keep - 1].first;
  // Older manifests go, and so do rank 0's partitions older than the oldest
  // kept one (those never committed included).
  for (const auto& [step, path] : ListCheckpoints(dir, kCheckpointSuffix)) {
    if (step < oldest_kept) RemoveCheckpointStep(dir, step);
  }
  for (const auto& [step, path] : manifests) {
    if (step < oldest_kept) RemoveCheckpointStep(dir, step);
  }
}

// Why a manifest cannot be this job's: empty when it can.
std::string Mismatch(const CheckpointManifest& m, const std::string& fingerprint,
                     const StatePartition& part) {
  if (m.model_fingerprint() != fingerprint) {
    return absl::StrCat("belongs to model ", m.model_fingerprint(), ", not ", fingerprint);
  }
  if (m.ranks() != part.ranks || m.partitions_size() != part.ranks) {
    return absl::StrCat("has ", m.partitions_size(), " partitions of ", m.ranks(),
                        " ranks; this job has ", part.ranks);
  }
  if (m.layout() != part.layout) {
    return "cuts the optimizer state differently (another bucket size)";
  }
  for (int r = 0; r < m.partitions_size(); ++r) {
    if (m.partitions(r).rank() != r) return absl::StrCat("lists partition ", r, " out of order");
  }
  return "";
}

}  // namespace

absl::StatusOr<SavedPartitions> SavePartitioned(StepRunner& runner, const StatePartition& part,
                                                const std::string& dir,
                                                tandem::v1::CheckpointHeader header,
                                                const std::vector<NamedTensor>& whole,
                                                const std::vector<std::string>& nodes, int keep) {
  const int64_t step = header.step();
  tandem::v1::CheckpointPartition* p = header.mutable_partition();
  p->set_rank(part.rank);
  p->set_ranks(part.ranks);
  p->set_layout(part.layout);
  std::vector<NamedTensor> tensors = part.rank == 0 ? whole : std::vector<NamedTensor>{};
  for (const NamedTensor& t : PartitionTensors(part)) tensors.push_back(t);
  const std::string path = CheckpointPath(dir, step, kCheckpointSuffix);
  const absl::StatusOr<CheckpointFile> file = WriteCheckpoint(path, header, tensors);
  // Written (1 or 0), bytes, CRC: every rank learns every rank's.
  constexpr size_t kFigures = 3;
  TANDEM_ASSIGN_OR_RETURN(
      const std::vector<double> all,
      runner.GatherFromRanks({file.ok() ? 1.0 : 0.0, file.ok() ? double(file->bytes) : 0.0,
                              file.ok() ? double(file->crc32) : 0.0}));
  if (!file.ok()) return file.status();
  if (const int failed = FirstFailed(all, kFigures, 0); failed >= 0) {
    return absl::DataLossError(absl::StrCat("rank ", failed,
                                            " could not write its partition of the checkpoint at "
                                            "step ",
                                            step, " (its rank status says why)"));
  }
  SavedPartitions saved{path, 0};
  for (int r = 0; r < part.ranks; ++r) saved.bytes += static_cast<int64_t>(all[r * kFigures + 1]);
  CheckpointManifest manifest;
  if (part.rank == 0) {
    manifest.set_job_id(header.job_id());
    manifest.set_model_fingerprint(header.model_fingerprint());
    manifest.set_step(step);
    manifest.set_ranks(part.ranks);
    manifest.set_layout(part.layout);
    *manifest.mutable_create_time() = google::protobuf::util::TimeUtil::GetCurrentTime();
    for (int r = 0; r < part.ranks; ++r) {
      CheckpointManifest::Partition* m = manifest.add_partitions();
      m->set_rank(r);
      m->set_node(r < static_cast<int>(nodes.size()) ? nodes[r] : absl::StrCat("rank ", r));
      m->set_file(std::filesystem::path(path).filename().string());
      m->set_bytes(static_cast<int64_t>(all[r * kFigures + 1]));
      m->set_crc32(static_cast<uint32_t>(all[r * kFigures + 2]));
    }
    saved.path = CheckpointPath(dir, step, kManifestSuffix);
  }
  // Every rank learns whether rank 0 committed the manifest, so that a failed
  // commit ends every rank's run here, not only rank 0's (the others would
  // wait for it in the next collective until its timeout).
  const absl::Status committed =
      part.rank == 0 ? WriteManifest(saved.path, manifest) : absl::OkStatus();
  TANDEM_ASSIGN_OR_RETURN(const std::vector<double> commits,
                          runner.GatherFromRanks({committed.ok() ? 1.0 : 0.0}));
  if (!committed.ok()) return committed;
  if (commits[0] == 0) {
    return absl::DataLossError(
        absl::StrCat("rank 0 could not commit the manifest of the checkpoint at step ", step,
                     " (its status says why)"));
  }
  Prune(dir, part.rank, keep, step);
  return saved;
}

absl::StatusOr<std::optional<LoadedManifest>> LoadNewestManifest(
    const std::string& dir, const std::string& fingerprint, const StatePartition& part,
    const std::vector<NamedTensor>& whole, const std::function<void(const std::string&)>& skipped) {
  std::vector<NamedTensor> tensors = whole;
  for (const NamedTensor& t : PartitionTensors(part)) tensors.push_back(t);
  for (const auto& [step, path] : ListCheckpoints(dir, kManifestSuffix)) {
    absl::StatusOr<CheckpointManifest> manifest = ReadManifest(path);
    if (!manifest.ok()) {
      skipped(std::string(manifest.status().message()));
      continue;
    }
    if (const std::string why = Mismatch(*manifest, fingerprint, part); !why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("manifest '", path, "' ", why));
    }
    const CheckpointManifest::Partition& own = manifest->partitions(0);
    const std::string file = absl::StrCat(dir, "/", own.file());
    CheckpointFile read;
    absl::StatusOr<tandem::v1::CheckpointHeader> header =
        ReadCheckpoint(file, fingerprint, tensors, &read);
    if (header.ok() && (read.bytes != own.bytes() || read.crc32 != own.crc32())) {
      header = absl::DataLossError(
          absl::StrCat("'", file, "' is not the partition manifest '", path, "' committed"));
    }
    if (!header.ok()) {
      skipped(std::string(header.status().message()));
      if (header.status().code() == absl::StatusCode::kFailedPrecondition) return header.status();
      continue;
    }
    return LoadedManifest{*std::move(manifest), *std::move(header), path};
  }
  return std::nullopt;
}

absl::StatusOr<std::string> LoadOwnPartition(StepRunner& runner, const StatePartition& part,
                                             const std::string& dir, int64_t step,
                                             const std::string& fingerprint,
                                             const CheckpointManifest* manifest) {
  // Rank 0 sends each partition's size and CRC as its manifest records them.
  std::vector<double> expected(2 * part.ranks, 0.0);
  if (part.rank == 0 && manifest != nullptr) {
    for (int r = 0; r < part.ranks; ++r) {
      expected[2 * r] = static_cast<double>(manifest->partitions(r).bytes());
      expected[2 * r + 1] = manifest->partitions(r).crc32();
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const std::vector<double> sent, runner.GatherFromRanks(expected));
  const std::string path = CheckpointPath(dir, step, kCheckpointSuffix);
  absl::Status status;
  if (part.rank != 0) {
    CheckpointFile read;
    absl::StatusOr<tandem::v1::CheckpointHeader> header =
        ReadCheckpoint(path, fingerprint, PartitionTensors(part), &read);
    const int64_t bytes = static_cast<int64_t>(sent[2 * part.rank]);
    const uint32_t crc = static_cast<uint32_t>(sent[2 * part.rank + 1]);
    if (!header.ok()) {
      status = header.status();
    } else if (header->step() != step || header->partition().rank() != part.rank ||
               header->partition().ranks() != part.ranks ||
               header->partition().layout() != part.layout) {
      status = absl::FailedPreconditionError(
          absl::StrCat("'", path, "' is partition ", header->partition().rank(), " of ",
                       header->partition().ranks(), " at step ", header->step(), ", not ",
                       part.rank, " of ", part.ranks, " at step ", step));
    } else if (read.bytes != bytes || read.crc32 != crc) {
      status = absl::DataLossError(absl::StrCat(
          "'", path, "' is not the partition the manifest of step ", step, " committed (",
          read.bytes, " bytes, CRC ", read.crc32, "; it names ", bytes, " bytes, CRC ", crc, ")"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const std::vector<double> loaded,
                          runner.GatherFromRanks({status.ok() ? 1.0 : 0.0}));
  if (!status.ok()) {
    return absl::Status(status.code(), absl::StrCat("rank ", part.rank,
                                                    " cannot load its partition of the "
                                                    "checkpoint at step ",
                                                    step, ": ", status.message()));
  }
  if (const int failed = FirstFailed(loaded, 1, 0); failed >= 0) {
    return absl::DataLossError(absl::StrCat("rank ", failed,
                                            " cannot load its partition of the checkpoint at step ",
                                            step, " (its rank status says why)"));
  }
  return path;
}

std::optional<PartitionPlacement> PartitionNodes(const std::string& dir, int ranks) {
  for (const auto& [step, path] : ListCheckpoints(dir, kManifestSuffix)) {
    absl::StatusOr<CheckpointManifest> manifest = ReadManifest(path);
    if (!manifest.ok()) continue;
    if (manifest->ranks() != ranks || manifest->partitions_size() != ranks) return std::nullopt;
    PartitionPlacement placement{manifest->step(), {}};
    for (int r = 1; r < ranks; ++r) placement.nodes.push_back(manifest->partitions(r).node());
    return placement;
  }
  return std::nullopt;
}

}  // namespace tandem
