// Training data: a split of samples that can fill any subset of itself into a
// batch. Datasets are immutable after opening and Fill is thread-safe, so the
// loader can prepare the next batch while a step runs.
#ifndef TANDEM_RUNTIME_DATA_DATASET_H_
#define TANDEM_RUNTIME_DATA_DATASET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/data/data_info.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Samples in one epoch of this split.
  virtual int64_t size() const = 0;
  virtual const DataInfo& info() const = 0;
  // Writes samples ids[0..n) of `epoch` into `inputs` (n x sample, f32 or i32 per
  // info().input_dtype) and `targets` (n x targets_per_sample). Ids are in
  // [0, size()); a dataset may vary a sample with the epoch (random text windows).
  virtual void Fill(int64_t epoch, const int64_t* ids, int64_t n, void* inputs,
                    int32_t* targets) const = 0;
  // "fashion-mnist train (60000 samples of [28, 28, 1])".
  virtual std::string Describe() const = 0;
};

struct Datasets {
  std::unique_ptr<Dataset> train;
  // Null when the spec has no test split.
  std::unique_ptr<Dataset> test;
};

// Maps a path from a job spec to one on disk, or refuses it (a path escaping the
// daemon's data root). Identity when null.
using PathResolver =
    std::function<absl::StatusOr<std::string>(const std::string& field, const std::string& path)>;

// Opens both splits of `spec`. `context` is the sequence length of text samples
// (the model's context; ignored by other sources). Errors name the field
// ("data.idx.train_images") and say what is wrong with the file (missing,
// truncated, not IDX, mismatched counts, larger than declared). Only regular
// files are read, and never more than they declare (IDX headers, gzip
// trailers); `reserved_bytes`, when given, is what the job reserved for its
// data (DescribeDatasets' memory_bytes at submission): files that now declare
// more are RESOURCE_EXHAUSTED before they are read.
absl::StatusOr<Datasets> OpenDatasets(const tandem::v1::DatasetSpec& spec, uint64_t seed,
                                      const PathResolver& resolve = nullptr, int64_t context = 0,
                                      std::optional<int64_t> reserved_bytes = std::nullopt);

// The sample shape and classes without loading the data: for validation,
// admission and planning. Every file is opened and its header read (and a
// text file's first windows), so what can be wrong with a file is found here;
// memory_bytes is exactly what OpenDatasets will read.
absl::StatusOr<DataInfo> DescribeDatasets(const tandem::v1::DatasetSpec& spec,
                                          const PathResolver& resolve = nullptr,
                                          int64_t context = 0);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DATA_DATASET_H_
