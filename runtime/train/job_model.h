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
#include "spec/precision.h"
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
// `compute`: the model's matrix-product type (Model::Build); ComputeDType of the
// job's resolved precision for a job that runs here.
absl::StatusOr<JobModel> BuildJobModel(const tandem::v1::JobSpec& resolved,
                                       const PathResolver& resolve = nullptr,
                                       DType compute = DType::kF32);

// The layers' compute type for a resolved precision: kBF16 for BF16, kF16 for
// FP16, else kF32.
DType ComputeDType(tandem::v1::Precision precision);

// Where a resolved job would run here, for ChoosePrecisionHere: its accelerator,
// oneDNN's ISA on this CPU and, for CUDA, cuda:0's compute capability and name.
LocalCompute LocalComputeFor(const tandem::v1::JobSpec& resolved);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_JOB_MODEL_H_
