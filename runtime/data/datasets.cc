#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/core/random.h"
#include "runtime/data/data_files.h"
#include "runtime/data/dataset.h"

namespace tandem {
namespace {

using tandem::v1::DatasetSpec;

absl::Status FieldError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

absl::StatusOr<std::string> Resolve(const PathResolver& resolve, const std::string& field,
                                    const std::string& path) {
  if (path.empty()) return FieldError(field, "is required");
  if (resolve) return resolve(field, path);
  return path;
}

// Reserved bytes left for a split's files (null when nothing was reserved:
// `tandem train` on its own machine). Each read is charged before it starts.
absl::Status Charge(const std::string& field, const std::string& path, int64_t bytes,
                    int64_t* left) {
  if (left == nullptr) return absl::OkStatus();
  if (bytes > *left) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": '", path, "' now needs ", bytes, " bytes, more than the ", *left,
                     " left of what the job reserved for its data (did it change since the job "
                     "was submitted?)"));
  }
  *left -= bytes;
  return absl::OkStatus();
}

struct IdxArray {
  std::vector<int64_t> dims;
  std::string bytes;  // The u8 payload only.
};

// Reads an IDX file of unsigned bytes with `want_dims` dimensions: exactly the
// bytes its header describes.
absl::StatusOr<IdxArray> ReadIdx(const std::string& field, const std::string& path, int want_dims,
                                 int64_t* left) {
  TANDEM_ASSIGN_OR_RETURN(const IdxHeader header, ReadIdxHeader(field, path, want_dims));
  TANDEM_RETURN_IF_ERROR(Charge(field, path, header.header_bytes + header.payload_bytes, left));
  IdxArray out;
  out.dims = header.dims;
  TANDEM_ASSIGN_OR_RETURN(out.bytes, ReadIdxPayload(field, path, header));
  return out;
}

class IdxDataset final : public Dataset {
 public:
  IdxDataset(std::string name, IdxArray images, IdxArray labels, int64_t limit, int64_t classes)
      : name_(std::move(name)), images_(std::move(images)), labels_(std::move(labels)) {
    size_ = images_.dims[0];
    if (limit > 0) size_ = std::min(size_, limit);
    info_.sample_shape = Shape({images_.dims[1], images_.dims[2], 1});
    info_.input_dtype = DType::kF32;
    info_.num_classes = classes;
  }
  int64_t size() const override { return size_; }
  const DataInfo& info() const override { return info_; }
  void Fill(int64_t, const int64_t* ids, int64_t n, void* inputs, int32_t* targets) const override {
    const int64_t pixels = info_.sample_shape.elements();
    float* out = static_cast<float*>(inputs);
    const uint8_t* src = reinterpret_cast<const uint8_t*>(images_.bytes.data());
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t* img = src + ids[i] * pixels;
      float* o = out + i * pixels;
      for (int64_t p = 0; p < pixels; ++p) o[p] = static_cast<float>(img[p]) * (1.0f / 255.0f);
      targets[i] = static_cast<uint8_t>(labels_.bytes[ids[i]]);
    }
  }
  std::string Describe() const override {
    return absl::StrCat(name_, " (", size_, " samples of ", info_.sample_shape.ToString(), ", ",
                        info_.num_classes, " classes)");
  }

 private:
  std::string name_;
  IdxArray images_, labels_;
  int64_t size_ = 0;
  DataInfo info_;
};

struct IdxSplit {
  IdxArray images, labels;
};

// A split's images and labels, read and matched.
absl::StatusOr<IdxSplit> ReadIdxSplit(const std::string& field_prefix,
                                      const std::string& images_path,
                                      const std::string& labels_path, int64_t* left) {
  IdxSplit split;
  TANDEM_ASSIGN_OR_RETURN(split.images, ReadIdx(field_prefix + "_images", images_path, 3, left));
  TANDEM_ASSIGN_OR_RETURN(split.labels, ReadIdx(field_prefix + "_labels", labels_path, 1, left));
  if (split.labels.dims[0] != split.images.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(field_prefix, "_labels: '", labels_path, "' has ", split.labels.dims[0],
                     " labels for ", split.images.dims[0], " images in '", images_path, "'"));
  }
  return split;
}

// MNIST-style data has 10 classes; a larger label (in either split: the
// model's output must cover every label it is scored on) widens the output.
int64_t IdxClasses(const std::string& labels, int64_t classes = 10) {
  for (char c : labels) classes = std::max<int64_t>(classes, static_cast<uint8_t>(c) + 1);
  return classes;
}

class TextDataset final : public Dataset {
 public:
  // `text` is the split's bytes; `train` splits draw random windows per epoch,
  // test splits use fixed consecutive windows.
  TextDataset(std::string name, std::shared_ptr<const std::string> text, int64_t begin, int64_t end,
              int64_t context, bool train, int64_t samples, uint64_t seed)
      : name_(std::move(name)),
        text_(std::move(text)),
        begin_(begin),
        end_(end),
        context_(context),
        train_(train),
        seed_(seed) {
    const int64_t windows = std::max<int64_t>(0, (end_ - begin_ - 1) / context_);
    size_ = samples > 0 ? samples : windows;
    info_.sample_shape = Shape({context_});
    info_.input_dtype = DType::kI32;
    info_.num_classes = 256;
    info_.targets_per_sample = context_;
  }
  int64_t size() const override { return size_; }
  const DataInfo& info() const override { return info_; }
  void Fill(int64_t epoch, const int64_t* ids, int64_t n, void* inputs,
            int32_t* targets) const override {
    int32_t* x = static_cast<int32_t*>(inputs);
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(text_->data());
    const uint64_t span = static_cast<uint64_t>(end_ - begin_ - context_);
    for (int64_t i = 0; i < n; ++i) {
      int64_t offset;
      if (train_) {
        const auto r = Philox4x32(seed_, MixStream(0x7e47, static_cast<uint64_t>(epoch)),
                                  static_cast<uint64_t>(ids[i]));
        offset = begin_ + static_cast<int64_t>(((static_cast<uint64_t>(r[0]) << 32) | r[1]) % span);
      } else {
        offset = begin_ + (ids[i] * context_) % static_cast<int64_t>(span);
      }
      for (int64_t t = 0; t < context_; ++t) {
        x[i * context_ + t] = bytes[offset + t];
        targets[i * context_ + t] = bytes[offset + t + 1];
      }
    }
  }
  std::string Describe() const override {
    return absl::StrCat(name_, " (", size_, " windows of ", context_, " bytes from ", end_ - begin_,
                        " bytes)");
  }

 private:
  std::string name_;
  std::shared_ptr<const std::string> text_;
  int64_t begin_, end_, context_;
  bool train_;
  uint64_t seed_;
  int64_t size_ = 0;
  DataInfo info_;
};

class SyntheticDataset final : public Dataset {
 public:
  SyntheticDataset(std::string name, DataInfo info, int64_t size, uint64_t seed, uint64_t split)
      : name_(std::move(name)), info_(std::move(info)), size_(size), seed_(seed), split_(split) {
    const int64_t features = info_.sample_shape.elements();
    if (info_.input_dtype == DType::kF32) {
      teacher_.resize(info_.num_classes * features);
      FillNormal(teacher_.data(), teacher_.size(), 0.0f, 1.0f, seed_, 0x7eac);
    } else {
      std::vector<int64_t> perm = Permutation(info_.num_classes, seed_, 0x7eac);
      next_.assign(perm.begin(), perm.end());
    }
  }
  int64_t size() const override { return size_; }
  const DataInfo& info() const override { return info_; }
  void Fill(int64_t, const int64_t* ids, int64_t n, void* inputs, int32_t* targets) const override {
    const int64_t features = info_.sample_shape.elements();
    const uint64_t stream = MixStream(split_, 0x5a3);
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t sample_stream = MixStream(stream, static_cast<uint64_t>(ids[i]));
      if (info_.input_dtype == DType::kF32) {
        float* x = static_cast<float*>(inputs) + i * features;
        FillUniform(x, features, 0.0f, 1.0f, seed_, sample_stream);
        // Centre the inputs before the teacher so classes are balanced.
        int best = 0;
        double best_score = -1e300;
        for (int64_t c = 0; c < info_.num_classes; ++c) {
          double score = 0;
          for (int64_t f = 0; f < features; ++f)
            score += teacher_[c * features + f] * (x[f] - 0.5f);
          if (score > best_score) {
            best_score = score;
            best = static_cast<int>(c);
          }
        }
        targets[i] = best;
      } else {
        int32_t* x = static_cast<int32_t*>(inputs) + i * features;
        for (int64_t t = 0; t < features; ++t) {
          x[t] = static_cast<int32_t>(UniformAt(seed_, sample_stream, t) * info_.num_classes) %
                 static_cast<int32_t>(info_.num_classes);
          targets[i * features + t] = static_cast<int32_t>(next_[x[t]]);
        }
      }
    }
  }
  std::string Describe() const override {
    return absl::StrCat(name_, " (", size_, " synthetic samples of ", info_.sample_shape.ToString(),
                        ", ", info_.num_classes, " classes)");
  }

 private:
  std::string name_;
  DataInfo info_;
  int64_t size_;
  uint64_t seed_, split_;
  std::vector<float> teacher_;
  std::vector<int64_t> next_;
};

constexpr int64_t kMaxSyntheticSamples = int64_t{1} << 30;

absl::StatusOr<DataInfo> SyntheticInfo(const tandem::v1::SyntheticDataset& s) {
  DataInfo info;
  if (s.sample_shape_size() == 0 || s.sample_shape_size() > 3) {
    return FieldError("data.synthetic.sample_shape", "needs 1 to 3 dimensions");
  }
  std::vector<int64_t> dims;
  int64_t elements = 1;
  for (int i = 0; i < s.sample_shape_size(); ++i) {
    if (s.sample_shape(i) <= 0 || s.sample_shape(i) > 65536) {
      return FieldError(absl::StrCat("data.synthetic.sample_shape[", i, "]"),
                        absl::StrCat("must be in [1, 65536], got ", s.sample_shape(i)));
    }
    dims.push_back(s.sample_shape(i));
    elements *= s.sample_shape(i);
  }
  if (elements > (int64_t{1} << 24)) {
    return FieldError("data.synthetic.sample_shape", "has more than 16M elements per sample");
  }
  if (s.num_classes() < 2 || s.num_classes() > 1000000) {
    return FieldError("data.synthetic.num_classes",
                      absl::StrCat("must be in [2, 1000000], got ", s.num_classes()));
  }
  if (s.train_samples() < 0 || s.train_samples() > kMaxSyntheticSamples) {
    return FieldError("data.synthetic.train_samples",
                      absl::StrCat("must be in [0, 2^30], got ", s.train_samples()));
  }
  if (s.test_samples() < 0 || s.test_samples() > kMaxSyntheticSamples) {
    return FieldError("data.synthetic.test_samples",
                      absl::StrCat("must be in [0, 2^30], got ", s.test_samples()));
  }
  info.sample_shape = Shape(dims);
  info.num_classes = s.num_classes();
  if (s.tokens()) {
    if (dims.size() != 1) return FieldError("data.synthetic.sample_shape", "token samples are [T]");
    info.input_dtype = DType::kI32;
    info.targets_per_sample = dims[0];
  }
  // What a run holds for it, reserved with the job: each split's labelling
  // teacher (a float per class and input element) or successor table, and
  // the loader's sample orders (two epochs' of the training split, one of
  // the test split's, 8 bytes a sample).
  constexpr int64_t kMaxTeacherFloats = int64_t{1} << 28;
  if (!s.tokens() && s.num_classes() * elements > kMaxTeacherFloats) {
    return FieldError(
        "data.synthetic.num_classes",
        absl::StrCat(s.num_classes(), " classes of ", elements,
                     "-element samples need a labelling teacher of ", s.num_classes() * elements,
                     " floats; at most 2^28 (num_classes x sample elements)"));
  }
  const int64_t per_split = s.tokens() ? 8 * s.num_classes() : 4 * s.num_classes() * elements;
  info.memory_bytes = 2 * per_split + 8 * (2 * s.train_samples() + s.test_samples());
  return info;
}

}  // namespace

namespace {

// The text split sizes for `n` bytes, or an error naming the field: the test
// fraction must be in [0, 0.5] and the training split must hold two windows.
absl::Status CheckTextSplit(const tandem::v1::TextDataset& t, const std::string& path, int64_t n,
                            int64_t context, int64_t* train_bytes, int64_t* test_bytes) {
  const float fraction = t.has_test_fraction() ? t.test_fraction() : 0.1f;
  if (!(fraction >= 0.0f && fraction <= 0.5f)) {
    return FieldError("data.text.test_fraction",
                      absl::StrCat("must be in [0, 0.5], got ", fraction));
  }
  if (t.samples_per_epoch() < 0 || t.samples_per_epoch() > kMaxSyntheticSamples) {
    return FieldError("data.text.samples_per_epoch", "must be in [0, 2^30]");
  }
  *test_bytes = static_cast<int64_t>(static_cast<double>(n) * fraction);
  *train_bytes = n - *test_bytes;
  if (*train_bytes < 2 * (context + 1)) {
    return absl::InvalidArgumentError(absl::StrCat("data.text.path: '", path, "' has ", n,
                                                   " bytes, too few for context ", context));
  }
  return absl::OkStatus();
}

// At submission: the file is regular and holds enough text for the split,
// reading (and gunzipping) no more than that proves. Returns the bytes a run
// reads: the file's size, or a gzip file's declared size.
absl::StatusOr<int64_t> DescribeText(const tandem::v1::TextDataset& t, const std::string& path,
                                     int64_t context) {
  TANDEM_ASSIGN_OR_RETURN(const DataFileInfo file, StatDataFile("data.text.path", path));
  const float fraction = t.has_test_fraction() ? t.test_fraction() : 0.1f;
  const double train_share = std::isfinite(fraction) ? std::max(0.5, 1.0 - fraction) : 1.0;
  const int64_t enough = static_cast<int64_t>(2 * (context + 1) / train_share) + 2;
  TANDEM_ASSIGN_OR_RETURN(const std::string head,
                          ReadDataFile("data.text.path", path, enough, false));
  // Fewer than `enough` bytes is the whole text; `enough` always splits.
  int64_t train_bytes = 0, test_bytes = 0;
  TANDEM_RETURN_IF_ERROR(CheckTextSplit(t, path, static_cast<int64_t>(head.size()), context,
                                        &train_bytes, &test_bytes));
  if (file.content_bytes < static_cast<int64_t>(head.size())) {
    return absl::InvalidArgumentError(absl::StrCat("data.text.path: '", path,
                                                   "' inflates past the ", file.content_bytes,
                                                   " bytes its gzip trailer declares"));
  }
  return file.content_bytes;
}

// The header of a split's images and labels, checked against each other.
absl::StatusOr<std::pair<IdxHeader, IdxHeader>> DescribeIdxSplit(const std::string& prefix,
                                                                 const std::string& images_path,
                                                                 const std::string& labels_path) {
  TANDEM_ASSIGN_OR_RETURN(IdxHeader images, ReadIdxHeader(prefix + "_images", images_path, 3));
  TANDEM_ASSIGN_OR_RETURN(IdxHeader labels, ReadIdxHeader(prefix + "_labels", labels_path, 1));
  if (labels.dims[0] != images.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "_labels: '", labels_path, "' has ",
                                                   labels.dims[0], " labels for ", images.dims[0],
                                                   " images in '", images_path, "'"));
  }
  return std::make_pair(std::move(images), std::move(labels));
}

// At submission: the sample limits are sane, every named IDX file is a regular
// file whose size matches its header, and labels match images. The memory is
// exactly what a run reads: every file's header and data.
absl::StatusOr<DataInfo> DescribeIdx(const tandem::v1::IdxDataset& idx,
                                     const PathResolver& resolve) {
  if (idx.max_train_samples() < 0) return FieldError("data.idx.max_train_samples", "must be >= 0");
  if (idx.max_test_samples() < 0) return FieldError("data.idx.max_test_samples", "must be >= 0");
  if (idx.test_images().empty() != idx.test_labels().empty()) {
    return FieldError(idx.test_images().empty() ? "data.idx.test_images" : "data.idx.test_labels",
                      "is required when the other test file is named");
  }
  const std::pair<const char*, const std::string*> files[] = {
      {"data.idx.train_images", &idx.train_images()},
      {"data.idx.train_labels", &idx.train_labels()},
      {"data.idx.test_images", &idx.test_images()},
      {"data.idx.test_labels", &idx.test_labels()}};
  std::string paths[4];
  for (int i = 0; i < 4; ++i) {
    const auto& [field, name] = files[i];
    if (name->empty() && absl::StrContains(field, "test")) continue;
    TANDEM_ASSIGN_OR_RETURN(paths[i], Resolve(resolve, field, *name));
  }
  TANDEM_ASSIGN_OR_RETURN(const auto train, DescribeIdxSplit("data.idx.train", paths[0], paths[1]));
  DataInfo info;
  info.sample_shape = Shape({train.first.dims[1], train.first.dims[2], 1});
  // The labels (a byte a sample) are read now, so that the model planned and
  // admitted has the output a run builds.
  TANDEM_ASSIGN_OR_RETURN(const std::string train_labels,
                          ReadIdxPayload("data.idx.train_labels", paths[1], train.second));
  info.num_classes = IdxClasses(train_labels);
  auto bytes = [](const IdxHeader& h) { return h.header_bytes + h.payload_bytes; };
  info.memory_bytes = bytes(train.first) + bytes(train.second);
  if (!paths[2].empty()) {
    TANDEM_ASSIGN_OR_RETURN(const auto test, DescribeIdxSplit("data.idx.test", paths[2], paths[3]));
    if (test.first.dims[1] != train.first.dims[1] || test.first.dims[2] != train.first.dims[2]) {
      return FieldError("data.idx.test_images", "image size differs from the training split");
    }
    info.memory_bytes += bytes(test.first) + bytes(test.second);
    TANDEM_ASSIGN_OR_RETURN(const std::string test_labels,
                            ReadIdxPayload("data.idx.test_labels", paths[3], test.second));
    info.num_classes = IdxClasses(test_labels, info.num_classes);
  }
  return info;
}

}  // namespace

absl::StatusOr<DataInfo> DescribeDatasets(const DatasetSpec& spec, const PathResolver& resolve,
                                          int64_t context) {
  switch (spec.source_case()) {
    case DatasetSpec::kIdx:
      return DescribeIdx(spec.idx(), resolve);
    case DatasetSpec::kText: {
      const auto& t = spec.text();
      TANDEM_ASSIGN_OR_RETURN(const std::string path, Resolve(resolve, "data.text.path", t.path()));
      if (context <= 0)
        return FieldError("model.gpt.context", "a text dataset needs a context length");
      TANDEM_ASSIGN_OR_RETURN(const int64_t text_bytes, DescribeText(t, path, context));
      DataInfo info;
      info.sample_shape = Shape({context});
      info.input_dtype = DType::kI32;
      info.num_classes = 256;
      info.targets_per_sample = context;
      info.memory_bytes = text_bytes;
      return info;
    }
    case DatasetSpec::kSynthetic:
      return SyntheticInfo(spec.synthetic());
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return FieldError("data", "is required: set one of idx, text, synthetic");
}

namespace {

absl::StatusOr<Datasets> OpenTextDatasets(const tandem::v1::TextDataset& t, int64_t context,
                                          uint64_t seed, const PathResolver& resolve,
                                          int64_t* left) {
  TANDEM_ASSIGN_OR_RETURN(const std::string path, Resolve(resolve, "data.text.path", t.path()));
  TANDEM_ASSIGN_OR_RETURN(const DataFileInfo file, StatDataFile("data.text.path", path));
  TANDEM_RETURN_IF_ERROR(Charge("data.text.path", path, file.content_bytes, left));
  TANDEM_ASSIGN_OR_RETURN(std::string bytes,
                          ReadDataFile("data.text.path", path, file.content_bytes, true));
  const int64_t n = static_cast<int64_t>(bytes.size());
  int64_t train_bytes = 0, test_bytes = 0;
  TANDEM_RETURN_IF_ERROR(CheckTextSplit(t, path, n, context, &train_bytes, &test_bytes));
  auto shared = std::make_shared<const std::string>(std::move(bytes));
  Datasets out;
  out.train = std::make_unique<TextDataset>(absl::StrCat(path, " train"), shared, 0, train_bytes,
                                            context, true, t.samples_per_epoch(), seed);
  if (test_bytes >= 2 * (context + 1)) {
    out.test = std::make_unique<TextDataset>(absl::StrCat(path, " test"), shared, train_bytes, n,
                                             context, false, 0, seed);
  }
  return out;
}

}  // namespace

absl::StatusOr<Datasets> OpenDatasets(const DatasetSpec& spec, uint64_t seed,
                                      const PathResolver& resolve, int64_t context,
                                      std::optional<int64_t> reserved_bytes) {
  int64_t* left = reserved_bytes ? &*reserved_bytes : nullptr;
  switch (spec.source_case()) {
    case DatasetSpec::kIdx: {
      const auto& idx = spec.idx();
      if (idx.max_train_samples() < 0)
        return FieldError("data.idx.max_train_samples", "must be >= 0");
      if (idx.max_test_samples() < 0)
        return FieldError("data.idx.max_test_samples", "must be >= 0");
      TANDEM_ASSIGN_OR_RETURN(const std::string ti,
                              Resolve(resolve, "data.idx.train_images", idx.train_images()));
      TANDEM_ASSIGN_OR_RETURN(const std::string tl,
                              Resolve(resolve, "data.idx.train_labels", idx.train_labels()));
      TANDEM_ASSIGN_OR_RETURN(IdxSplit train, ReadIdxSplit("data.idx.train", ti, tl, left));
      int64_t classes = IdxClasses(train.labels.bytes);
      std::optional<IdxSplit> test;
      if (!idx.test_images().empty() || !idx.test_labels().empty()) {
        TANDEM_ASSIGN_OR_RETURN(const std::string vi,
                                Resolve(resolve, "data.idx.test_images", idx.test_images()));
        TANDEM_ASSIGN_OR_RETURN(const std::string vl,
                                Resolve(resolve, "data.idx.test_labels", idx.test_labels()));
        TANDEM_ASSIGN_OR_RETURN(test, ReadIdxSplit("data.idx.test", vi, vl, left));
        if (test->images.dims[1] != train.images.dims[1] ||
            test->images.dims[2] != train.images.dims[2]) {
          return FieldError("data.idx.test_images", "image size differs from the training split");
        }
        classes = IdxClasses(test->labels.bytes, classes);
      }
      Datasets out;
      out.train =
          std::make_unique<IdxDataset>("idx train", std::move(train.images),
                                       std::move(train.labels), idx.max_train_samples(), classes);
      if (test) {
        out.test =
            std::make_unique<IdxDataset>("idx test", std::move(test->images),
                                         std::move(test->labels), idx.max_test_samples(), classes);
      }
      return out;
    }
    case DatasetSpec::kText:
      if (context <= 0)
        return FieldError("model.gpt.context", "a text dataset needs a context length");
      return OpenTextDatasets(spec.text(), context, seed, resolve, left);
    case DatasetSpec::kSynthetic: {
      const auto& s = spec.synthetic();
      TANDEM_ASSIGN_OR_RETURN(const DataInfo info, SyntheticInfo(s));
      const uint64_t data_seed = s.seed() != 0 ? s.seed() : seed;
      Datasets out;
      out.train = std::make_unique<SyntheticDataset>(
          "synthetic train", info, s.train_samples() > 0 ? s.train_samples() : 10000, data_seed, 1);
      out.test = std::make_unique<SyntheticDataset>(
          "synthetic test", info, s.test_samples() > 0 ? s.test_samples() : 2000, data_seed, 2);
      return out;
    }
    case DatasetSpec::SOURCE_NOT_SET:
      break;
  }
  return FieldError("data", "is required: set one of idx, text, synthetic");
}

}  // namespace tandem
