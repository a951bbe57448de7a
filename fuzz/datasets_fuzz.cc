// Fuzz target: the dataset readers a job spec points at (IDX images and labels,
// text, each plain or gzip). The first input byte picks what the rest becomes:
//
//   bits 0-1  0: IDX images file (labels made to match its header)
//             1: IDX labels file (images made to match its header)
//             2: text file;  3: both IDX files, split at the first "@@@@"
//   bit 2     gzip the content(s) before writing (a valid stream around fuzzed
//             bytes; unset, fuzzed bytes that look like gzip are read as gzip)
//   bit 3     the same files also serve as the test split
//   bits 4-7  the text context: 1 + 4 * value tokens
//
// Then DescribeDatasets and, when it succeeds, OpenDatasets with what it said
// would be read as the reservation, and a Fill of the first and last samples.
// Every error must say something; nothing may crash or read past its bounds.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/scratch_dir.h"
#include "runtime/data/data_files.h"
#include "runtime/data/dataset.h"

namespace {

std::string Gzip(const std::string& bytes) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::string out(deflateBound(&z, bytes.size()) + 32, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = bytes.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// A valid IDX file of `dims` with zero bytes of data.
std::string IdxFile(const std::vector<uint32_t>& dims) {
  std::string out = {0, 0, 8, static_cast<char>(dims.size())};
  int64_t n = 1;
  for (uint32_t d : dims) {
    out += BigEndian(d);
    n *= d;
  }
  return out + std::string(n, '\0');
}

// The sample count `file`'s header declares, capped so the file made to match
// stays small; 1 when it has no readable header.
uint32_t DeclaredSamples(const std::string& file, int want_dims) {
  absl::StatusOr<tandem::IdxHeader> header = tandem::ParseIdxHeader("f", "p", file, want_dims);
  if (!header.ok()) return 1;
  return static_cast<uint32_t>(std::min<int64_t>(header->dims[0], 4096));
}

void CheckError(const absl::Status& status, const char* where) {
  if (status.ok() || !status.message().empty()) return;
  std::fprintf(stderr, "datasets_fuzz: %s failed without a message (code %d)\n", where,
               static_cast<int>(status.code()));
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  std::string content(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool gzip = mode & 4;
  const int64_t context = 1 + 4 * (mode >> 4);

  tandem::v1::DatasetSpec spec;
  auto write = [&](const std::string& name, const std::string& bytes) {
    return tandem::fuzz::WriteScratchFile(name, gzip ? Gzip(bytes) : bytes);
  };
  switch (mode & 3) {
    case 0: {
      auto* idx = spec.mutable_idx();
      idx->set_train_images(write("images", content));
      idx->set_train_labels(write("labels", IdxFile({DeclaredSamples(content, 3)})));
      break;
    }
    case 1: {
      auto* idx = spec.mutable_idx();
      idx->set_train_labels(write("labels", content));
      idx->set_train_images(write("images", IdxFile({DeclaredSamples(content, 1), 2, 2})));
      break;
    }
    case 2:
      spec.mutable_text()->set_path(write("text", content));
      break;
    case 3: {
      const size_t split = content.find("@@@@");
      auto* idx = spec.mutable_idx();
      idx->set_train_images(write("images", content.substr(0, split)));
      idx->set_train_labels(
          write("labels", split == std::string::npos ? "" : content.substr(split + 4)));
      break;
    }
  }
  if ((mode & 8) && spec.has_idx()) {
    spec.mutable_idx()->set_test_images(spec.idx().train_images());
    spec.mutable_idx()->set_test_labels(spec.idx().train_labels());
  } else if (mode & 8) {
    spec.mutable_text()->set_test_fraction(0.25f);
  }

  absl::StatusOr<tandem::DataInfo> info = tandem::DescribeDatasets(spec, nullptr, context);
  CheckError(info.status(), "DescribeDatasets");
  if (!info.ok()) return 0;
  absl::StatusOr<tandem::Datasets> sets =
      tandem::OpenDatasets(spec, /*seed=*/1, nullptr, context, info->memory_bytes);
  CheckError(sets.status(), "OpenDatasets");
  if (!sets.ok()) return 0;
  for (const tandem::Dataset* set : {sets->train.get(), sets->test.get()}) {
    if (set == nullptr) continue;
    if (set->size() <= 0) {
      std::fprintf(stderr, "datasets_fuzz: %s opened with no samples\n", set->Describe().c_str());
      std::abort();
    }
    const tandem::DataInfo& d = set->info();
    const int64_t ids[2] = {0, set->size() - 1};
    std::vector<float> inputs(2 * d.sample_shape.elements());
    std::vector<int32_t> targets(2 * d.targets_per_sample);
    set->Fill(/*epoch=*/0, ids, 2, inputs.data(), targets.data());
  }
  return 0;
}
