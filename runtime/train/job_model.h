// A resolved job spec (spec/job_spec.h) meets the runtime: the sequence length
// its model expects and the model itself, built from the datasets' headers
// alone, so a job can be planned without loading its data.
#ifndef TANDEM_RUNTIME_TRAIN_JOB_MODEL_H_
#define TANDEM_RUNTIME_TRAIN_JOB_MODEL_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/data/dataset.h"
#include "runtime/model/model.h"
#include "spec/job_spec.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// The sequence length a resolved spec's model expects (text datasets), or 0.
int64_t ModelContext(const tandem::v1::JobSpec& resolved);

// Everything needed to run or plan a job without loading its data: the data
// description and the built model. Reads only dataset headers.
struct JobModel {
  DataInfo data;
  std::unique_ptr<Model> model;
};
absl::StatusOr<JobModel> BuildJobModel(const tandem::v1::JobSpec& resolved,
                                       const PathResolver& resolve = nullptr);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_JOB_MODEL_H_
