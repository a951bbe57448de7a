// JobSpec handling shared by `tandem train` and tandemd: reading YAML or JSON
// files, validating every field with errors that name its path
// ("training.batch_size: must be in [1, 65536], got 0"), and filling defaults so
// the effective configuration is explicit (Job.resolved_spec). Every default of
// the API (proto comments) is applied here and nowhere else, except the model
// presets' sizes, which live with the model builder (runtime/model/model.h).
// Depends on no runtime code: a job file can be read and checked anywhere;
// building its model is runtime/train/job_model.h.
#ifndef TANDEM_SPEC_JOB_SPEC_H_
#define TANDEM_SPEC_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// Parses a job file: JSON (by extension .json or a leading '{') or YAML, both in
// the protobuf JSON mapping of JobSpec (field names in snake_case or camelCase,
// enums by name). Errors name the file and, for YAML, the line.
absl::StatusOr<tandem::v1::JobSpec> ParseJobSpec(const std::string& text,
                                                 const std::string& filename);
absl::StatusOr<tandem::v1::JobSpec> LoadJobSpecFile(const std::string& path);

// YAML (a superset of JSON) to a JSON string; quoted scalars stay strings, plain
// ones become numbers, booleans or null when they read as such.
absl::StatusOr<std::string> YamlToJson(const std::string& yaml, const std::string& filename);

// Checks ranges and enums of every field that needs no files. Field paths are
// relative to the spec ("optimizer.beta1").
absl::Status ValidateJobSpec(const tandem::v1::JobSpec& spec);

// placement.replan_threshold when a spec does not say: a measured step more
// than 10% off the plan's prediction re-plans the job.
inline constexpr double kDefaultReplanThreshold = 0.10;
// placement.pipeline.stages at most.
inline constexpr int kMaxPipelineStages = 64;
// distributed.replicas' upper bound.
inline constexpr int kMaxReplicas = 1024;

// Validates, then fills every default. `has_accelerator` decides what an
// unspecified strategy means.
absl::StatusOr<tandem::v1::JobSpec> ResolveJobSpec(const tandem::v1::JobSpec& spec,
                                                   bool has_accelerator);

// A resolved spec whose placement.pipeline.auto_stages was chosen: `stages`
// (<= 1: one accelerator) and `micro_batches` (0: the spec's, else the
// default) filled in as a spec asking for them would be resolved (schedule,
// strategy), auto_stages cleared.
absl::Status ResolvePipelineStages(tandem::v1::JobSpec& resolved, int stages,
                                   int micro_batches = 0);

// The largest batch a resolved spec runs: its training or its eval batch.
int64_t MaxBatch(const tandem::v1::JobSpec& resolved);

// Total optimizer steps of a resolved spec for a training split of `samples`.
int64_t TotalSteps(const tandem::v1::JobSpec& resolved, int64_t samples);

}  // namespace tandem

#endif  // TANDEM_SPEC_JOB_SPEC_H_
