// Datasets: real Fashion-MNIST when installed, and hand-made IDX files that are
// truncated, corrupt or inconsistent, each giving a clear error and no crash.
// Loader: every sample once per epoch, seeded order, exact resume.
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "gtest/gtest.h"
#include "runtime/data/dataset.h"
#include "runtime/data/loader.h"

namespace tandem {
namespace {

const char kFashion[] = "/usr/share/datasets/fashion-mnist/";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

std::string IdxBytes(std::vector<uint32_t> dims, int fill_bytes, uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      s.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  for (int i = 0; i < fill_bytes; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

void WriteFile(const std::string& path, const std::string& bytes, bool gzip = false) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), bytes.size());
    gzclose(f);
    return;
  }
  std::ofstream(path, std::ios::binary) << bytes;
}

tandem::v1::DatasetSpec IdxSpec(const std::string& images, const std::string& labels) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_idx()->set_train_images(images);
  spec.mutable_idx()->set_train_labels(labels);
  return spec;
}

TEST(IdxTest, ReadsFashionMnist) {
  // tools/install-deps.sh installs dataset-fashion-mnist with the test packages.
  ASSERT_TRUE(std::ifstream(std::string(kFashion) + "train-images-idx3-ubyte.gz"))
      << "dataset-fashion-mnist is not installed under " << kFashion
      << ": run tools/install-deps.sh";
  tandem::v1::DatasetSpec spec = IdxSpec(std::string(kFashion) + "train-images-idx3-ubyte.gz",
                                         std::string(kFashion) + "train-labels-idx1-ubyte.gz");
  spec.mutable_idx()->set_test_images(std::string(kFashion) + "t10k-images-idx3-ubyte.gz");
  spec.mutable_idx()->set_test_labels(std::string(kFashion) + "t10k-labels-idx1-ubyte.gz");
  absl::StatusOr<Datasets> d = OpenDatasets(spec, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train->size(), 60000);
  EXPECT_EQ(d->test->size(), 10000);
  EXPECT_EQ(d->train->info().sample_shape, Shape({28, 28, 1}));
  EXPECT_EQ(d->train->info().num_classes, 10);
  std::vector<float> x(784);
  int32_t y = -1;
  int64_t id = 0;
  d->train->Fill(0, &id, 1, x.data(), &y);
  EXPECT_GE(y, 0);
  EXPECT_LT(y, 10);
  float max = 0;
  for (float v : x) max = std::max(max, v);
  EXPECT_LE(max, 1.0f);
  EXPECT_GT(max, 0.5f);
}

TEST(IdxTest, RawAndGzipReadAlike) {
  WriteFile(TempPath("img.idx"), IdxBytes({3, 2, 2}, 12));
  WriteFile(TempPath("img.idx.gz"), IdxBytes({3, 2, 2}, 12), true);
  WriteFile(TempPath("lab.idx"), IdxBytes({3}, 3));
  for (const char* images : {"img.idx", "img.idx.gz"}) {
    absl::StatusOr<Datasets> d = OpenDatasets(IdxSpec(TempPath(images), TempPath("lab.idx")), 0);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_EQ(d->train->size(), 3);
    EXPECT_EQ(d->train->info().sample_shape, Shape({2, 2, 1}));
  }
}

// Labels 0..9 to train on and a 12 in the test split (a mismatched file, or
// a class only the test split has): the model's output covers every label it
// is scored on, and submission describes the same model a run builds.
TEST(IdxTest, ClassesCoverEveryLabelOfBothSplitsAtSubmissionAndRun) {
  WriteFile(TempPath("img4.idx"), IdxBytes({4, 2, 2}, 16));
  WriteFile(TempPath("lab4.idx"), IdxBytes({4}, 4));  // labels 0..3
  std::string test_labels = IdxBytes({4}, 4);
  test_labels.back() = 12;
  WriteFile(TempPath("lab4-test.idx"), test_labels);
  tandem::v1::DatasetSpec spec = IdxSpec(TempPath("img4.idx"), TempPath("lab4.idx"));
  absl::StatusOr<DataInfo> train_only = DescribeDatasets(spec, nullptr, 0);
  ASSERT_TRUE(train_only.ok()) << train_only.status();
  EXPECT_EQ(train_only->num_classes, 10);
  spec.mutable_idx()->set_test_images(TempPath("img4.idx"));
  spec.mutable_idx()->set_test_labels(TempPath("lab4-test.idx"));
  absl::StatusOr<DataInfo> described = DescribeDatasets(spec, nullptr, 0);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->num_classes, 13);
  absl::StatusOr<Datasets> d = OpenDatasets(spec, 0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train->info().num_classes, 13);
  EXPECT_EQ(d->test->info().num_classes, 13);
}

TEST(IdxTest, TruncatedImagesAreDataLoss) {
  WriteFile(TempPath("short.idx"), IdxBytes({100, 28, 28}, 1000));
  WriteFile(TempPath("lab100.idx"), IdxBytes({100}, 100));
  absl::Status s = OpenDatasets(IdxSpec(TempPath("short.idx"), TempPath("lab100.idx")), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("data.idx.train_images"), std::string::npos) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

TEST(IdxTest, TruncatedGzipStreamIsAnError) {
  // A gzip file cut in half: zlib reports the broken stream, or the payload is
  // short; either way a clear error, never a crash.
  std::string gz;
  {
    WriteFile(TempPath("full.gz"), IdxBytes({50, 28, 28}, 50 * 784), true);
    std::ifstream f(TempPath("full.gz"), std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  WriteFile(TempPath("cut.gz"), gz.substr(0, gz.size() / 2));
  WriteFile(TempPath("lab50.idx"), IdxBytes({50}, 50));
  absl::Status s = OpenDatasets(IdxSpec(TempPath("cut.gz"), TempPath("lab50.idx")), 0).status();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("train_images"), std::string::npos) << s;
}

TEST(IdxTest, GarbageIsNotIdx) {
  WriteFile(TempPath("garbage.idx"), "this is not an idx file at all");
  WriteFile(TempPath("lab3.idx"), IdxBytes({3}, 3));
  absl::Status s = OpenDatasets(IdxSpec(TempPath("garbage.idx"), TempPath("lab3.idx")), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not an IDX file"), std::string::npos) << s;
}

TEST(IdxTest, WrongElementTypeIsRejected) {
  WriteFile(TempPath("float.idx"), IdxBytes({3, 2, 2}, 48, 0x0D));
  WriteFile(TempPath("lab3b.idx"), IdxBytes({3}, 3));
  absl::Status s = OpenDatasets(IdxSpec(TempPath("float.idx"), TempPath("lab3b.idx")), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unsigned bytes"), std::string::npos) << s;
}

TEST(IdxTest, LabelCountMismatch) {
  WriteFile(TempPath("img4.idx"), IdxBytes({4, 2, 2}, 16));
  WriteFile(TempPath("lab2.idx"), IdxBytes({2}, 2));
  absl::Status s = OpenDatasets(IdxSpec(TempPath("img4.idx"), TempPath("lab2.idx")), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("2 labels for 4 images"), std::string::npos) << s;
}

TEST(IdxTest, MissingFileIsNotFound) {
  absl::Status s = OpenDatasets(IdxSpec("/nonexistent/x", "/nonexistent/y"), 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("data.idx.train_images"), std::string::npos) << s;
}

TEST(TextTest, WindowsPredictTheNextByte) {
  std::string text;
  for (int i = 0; i < 5000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  WriteFile(TempPath("t.txt"), text);
  tandem::v1::DatasetSpec spec;
  spec.mutable_text()->set_path(TempPath("t.txt"));
  absl::StatusOr<Datasets> d = OpenDatasets(spec, 1, nullptr, 16);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_NE(d->test, nullptr);
  EXPECT_EQ(d->train->info().sample_shape, Shape({16}));
  std::vector<int32_t> x(16), y(16);
  const int64_t id = 7;
  d->train->Fill(0, &id, 1, x.data(), y.data());
  for (int t = 0; t < 16; ++t) EXPECT_EQ(y[t], 'a' + (x[t] - 'a' + 1) % 26);
}

// Everything about a text file that can be checked is checked when the spec
// is described (at submission), not when the job runs.
void ExpectDescribeRefuses(const tandem::v1::DatasetSpec& spec, absl::StatusCode code,
                           const std::string& words) {
  const absl::Status s = DescribeDatasets(spec, nullptr, 16).status();
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(words), std::string::npos) << s;
}

TEST(TextTest, NonRegularShortOrBadlySplitTextIsRefusedWhenDescribed) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_text()->set_path(TempPath(""));
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "is a directory");
  const std::string fifo = TempPath("text.fifo");
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // Refused from its type alone: opening a FIFO with no writer would block.
  spec.mutable_text()->set_path(fifo);
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "'" + fifo + "' is a FIFO");
  EXPECT_EQ(OpenDatasets(spec, 1, nullptr, 16).status().code(), absl::StatusCode::kInvalidArgument);
  spec.mutable_text()->set_path("/dev/zero");
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "a character device");

  WriteFile(TempPath("empty.txt"), "");
  spec.mutable_text()->set_path(TempPath("empty.txt"));
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "has 0 bytes, too few");
  WriteFile(TempPath("short.txt"), std::string(30, 'a'), /*gzip=*/true);
  spec.mutable_text()->set_path(TempPath("short.txt"));
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "has 30 bytes, too few");

  WriteFile(TempPath("long.txt"), std::string(5000, 'a'));
  spec.mutable_text()->set_path(TempPath("long.txt"));
  EXPECT_TRUE(DescribeDatasets(spec, nullptr, 16).ok());
  for (float bad : {std::nanf(""), 1.5f, -0.1f}) {
    spec.mutable_text()->set_test_fraction(bad);
    ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "data.text.test_fraction");
  }
}

TEST(SyntheticTest, NegativeSampleCountsAreRefusedWhenDescribed) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_synthetic()->add_sample_shape(4);
  spec.mutable_synthetic()->set_num_classes(2);
  spec.mutable_synthetic()->set_train_samples(-5);
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "data.synthetic.train_samples");
  spec.mutable_synthetic()->set_train_samples(5);
  spec.mutable_synthetic()->set_test_samples(-1);
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "data.synthetic.test_samples");
}

TEST(IdxTest, EveryNamedFileIsCheckedWhenDescribed) {
  WriteFile(TempPath("d-images"), IdxBytes({2, 2, 2}, 8));
  ExpectDescribeRefuses(IdxSpec(TempPath("d-images"), TempPath("no-such-labels")),
                        absl::StatusCode::kNotFound, "data.idx.train_labels");
  ExpectDescribeRefuses(IdxSpec(TempPath("d-images"), TempPath("")),
                        absl::StatusCode::kInvalidArgument, "data.idx.train_labels");
  tandem::v1::DatasetSpec spec = IdxSpec(TempPath("d-images"), TempPath("d-images"));
  spec.mutable_idx()->set_test_images(TempPath("d-images"));
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "data.idx.test_labels");
  spec = IdxSpec(TempPath("d-images"), TempPath("d-images"));
  spec.mutable_idx()->set_max_train_samples(-1);
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument, "data.idx.max_train_samples");
}

// Reads are bounded by what files declare, and what they declare is checked
// at submission (DescribeDatasets), where memory_bytes is what a run reads.
TEST(IdxTest, DescribedMemoryIsExactlyWhatTheFilesHold) {
  WriteFile(TempPath("m-img.idx"), IdxBytes({3, 2, 2}, 12));
  WriteFile(TempPath("m-lab.idx.gz"), IdxBytes({3}, 3), /*gzip=*/true);
  tandem::v1::DatasetSpec spec = IdxSpec(TempPath("m-img.idx"), TempPath("m-lab.idx.gz"));
  absl::StatusOr<DataInfo> info = DescribeDatasets(spec);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->memory_bytes, (16 + 12) + (8 + 3));
  spec.mutable_idx()->set_test_images(TempPath("m-img.idx"));
  spec.mutable_idx()->set_test_labels(TempPath("m-lab.idx.gz"));
  EXPECT_EQ(DescribeDatasets(spec)->memory_bytes, 2 * ((16 + 12) + (8 + 3)));
  EXPECT_TRUE(OpenDatasets(spec, 0, nullptr, 0, info->memory_bytes * 2).ok());
  // A file that grew after submission is refused before it is read.
  const absl::Status s = OpenDatasets(spec, 0, nullptr, 0, info->memory_bytes * 2 - 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("data.idx.test_labels"), std::string::npos) << s;
}

TEST(IdxTest, AFileLargerThanItsHeaderIsRefusedUnread) {
  // A sparse file of 1 GiB behind a header describing 8 images of 2x2: the
  // size disagrees with the header, so it is refused from its size alone.
  const std::string path = TempPath("sparse.idx");
  WriteFile(path, IdxBytes({8, 2, 2}, 32));
  ASSERT_EQ(truncate(path.c_str(), int64_t{1} << 30), 0);
  WriteFile(TempPath("lab8.idx"), IdxBytes({8}, 8));
  const tandem::v1::DatasetSpec spec = IdxSpec(path, TempPath("lab8.idx"));
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument,
                        "holds 1073741824 bytes, but its header describes 48");
  EXPECT_EQ(OpenDatasets(spec, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(IdxTest, HeadersThatOverflowOrDisagreeAreRefusedWhenDescribed) {
  WriteFile(TempPath("huge.idx"), IdxBytes({1u << 28, 1u << 28, 1u << 28}, 0));
  WriteFile(TempPath("lab1.idx"), IdxBytes({1}, 1));
  ExpectDescribeRefuses(IdxSpec(TempPath("huge.idx"), TempPath("lab1.idx")),
                        absl::StatusCode::kInvalidArgument, "describes more than the");
  WriteFile(TempPath("img5.idx"), IdxBytes({5, 2, 2}, 20));
  WriteFile(TempPath("lab4.idx"), IdxBytes({4}, 4));
  ExpectDescribeRefuses(IdxSpec(TempPath("img5.idx"), TempPath("lab4.idx")),
                        absl::StatusCode::kInvalidArgument, "4 labels for 5 images");
  // A gzip file whose trailer disagrees with its header.
  WriteFile(TempPath("img5-more.idx.gz"), IdxBytes({5, 2, 2}, 20) + std::string(100, 'x'),
            /*gzip=*/true);
  WriteFile(TempPath("lab5.idx"), IdxBytes({5}, 5));
  ExpectDescribeRefuses(IdxSpec(TempPath("img5-more.idx.gz"), TempPath("lab5.idx")),
                        absl::StatusCode::kInvalidArgument,
                        "inflates to 136 bytes by its gzip trailer, but its header describes 36");
}

// A gzip file with its trailer's size field set to `declared`.
void ForgeGzipSize(const std::string& path, uint32_t declared) {
  std::string gz;
  {
    std::ifstream f(path, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  for (int i = 0; i < 4; ++i)
    gz[gz.size() - 4 + i] = static_cast<char>((declared >> (8 * i)) & 0xff);
  WriteFile(path, gz);
}

TEST(TextTest, ATruncatedGzipTextIsAnErrorNotHalfTheCorpus) {
  // Text cut off halfway by an interrupted copy: its last four bytes, read as
  // the trailer's size, are whatever deflate data was there.
  std::string text;
  for (int i = 0; text.size() < (1 << 20); ++i) text += "line " + std::to_string(i * 7919) + "\n";
  WriteFile(TempPath("whole.txt.gz"), text, /*gzip=*/true);
  std::string gz;
  {
    std::ifstream f(TempPath("whole.txt.gz"), std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(f), {});
  }
  const std::string path = TempPath("cut.txt.gz");
  WriteFile(path, gz.substr(0, gz.size() / 2));
  tandem::v1::DatasetSpec spec;
  spec.mutable_text()->set_path(path);
  absl::StatusOr<DataInfo> info = DescribeDatasets(spec, nullptr, 16);
  const absl::Status s =
      info.ok() ? OpenDatasets(spec, 1, nullptr, 16, info->memory_bytes).status() : info.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("data.text.path"), std::string::npos) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

TEST(TextTest, AGzipBombIsReadNoFurtherThanItsTrailerDeclares) {
  // 64 MiB of text in a small gzip file. Honest, its trailer says 64 MiB: that
  // is what the job reserves (and admission refuses what the node cannot hold).
  const std::string path = TempPath("bomb.txt.gz");
  WriteFile(path, std::string(64 << 20, 'a'), /*gzip=*/true);
  tandem::v1::DatasetSpec spec;
  spec.mutable_text()->set_path(path);
  absl::StatusOr<DataInfo> info = DescribeDatasets(spec, nullptr, 16);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->memory_bytes, 64 << 20);
  // Forged to declare 1 MB: 1 MB is reserved, and the run stops reading there.
  ForgeGzipSize(path, 1000000);
  info = DescribeDatasets(spec, nullptr, 16);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->memory_bytes, 1000000);
  const absl::Status s = OpenDatasets(spec, 1, nullptr, 16, info->memory_bytes).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("inflates past the 1000000 bytes expected of it"), std::string::npos)
      << s;
  // Declaring fewer bytes than the windows it must hold is found at submission.
  ForgeGzipSize(path, 10);
  ExpectDescribeRefuses(spec, absl::StatusCode::kInvalidArgument,
                        "inflates past the 10 bytes its gzip trailer declares");
}

// What a run holds for synthetic data is reserved with the job: each
// split's labelling teacher and the loader's sample orders; a teacher past
// 2^28 floats is refused naming num_classes.
TEST(SyntheticTest, TheTeacherAndSampleOrdersAreReservedAndBounded) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_synthetic()->add_sample_shape(20);
  spec.mutable_synthetic()->set_num_classes(4);
  spec.mutable_synthetic()->set_train_samples(400);
  spec.mutable_synthetic()->set_test_samples(100);
  absl::StatusOr<DataInfo> info = DescribeDatasets(spec, nullptr, 0);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->memory_bytes, 2 * 4 * 4 * 20 + 8 * (2 * 400 + 100));
  spec.mutable_synthetic()->clear_sample_shape();
  spec.mutable_synthetic()->add_sample_shape(4096);
  spec.mutable_synthetic()->add_sample_shape(4096);
  spec.mutable_synthetic()->set_num_classes(1000);
  const absl::Status s = DescribeDatasets(spec, nullptr, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("data.synthetic.num_classes"), std::string::npos) << s;
}

TEST(SyntheticTest, LabelsAreDeterministicAndBalancedEnough) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_synthetic()->add_sample_shape(20);
  spec.mutable_synthetic()->set_num_classes(4);
  spec.mutable_synthetic()->set_train_samples(400);
  absl::StatusOr<Datasets> a = OpenDatasets(spec, 3), b = OpenDatasets(spec, 3);
  ASSERT_TRUE(a.ok());
  std::vector<int64_t> ids(400);
  for (int i = 0; i < 400; ++i) ids[i] = i;
  std::vector<float> xa(400 * 20), xb(400 * 20);
  std::vector<int32_t> ya(400), yb(400);
  a->train->Fill(0, ids.data(), 400, xa.data(), ya.data());
  b->train->Fill(0, ids.data(), 400, xb.data(), yb.data());
  EXPECT_EQ(ya, yb);
  std::set<int32_t> seen(ya.begin(), ya.end());
  EXPECT_EQ(seen.size(), 4u);
}

TEST(SyntheticTest, BadShapeNamesTheField) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_synthetic()->add_sample_shape(-3);
  spec.mutable_synthetic()->set_num_classes(4);
  absl::Status s = OpenDatasets(spec, 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("data.synthetic.sample_shape[0]"), std::string::npos) << s;
}

std::unique_ptr<Dataset> Synthetic(int64_t n) {
  tandem::v1::DatasetSpec spec;
  spec.mutable_synthetic()->add_sample_shape(1);
  spec.mutable_synthetic()->set_num_classes(2);
  spec.mutable_synthetic()->set_train_samples(n);
  return std::move(OpenDatasets(spec, 0)->train);
}

TEST(LoaderTest, EachEpochVisitsEverySampleOnceWithAPartialLastBatch) {
  auto ds = Synthetic(10);
  BatchLoader loader(*ds, 4, /*shuffle=*/true, 9);
  EXPECT_EQ(loader.batches_per_epoch(), 3);
  std::vector<float> seen;
  int64_t sizes[3];
  for (int b = 0; b < 3; ++b) {
    const Batch& batch = loader.Next();
    sizes[b] = batch.size;
    EXPECT_EQ(batch.epoch, 0);
    seen.insert(seen.end(), batch.inputs.begin(), batch.inputs.end());
  }
  EXPECT_EQ(sizes[2], 2);
  std::set<float> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 10u);
  EXPECT_EQ(loader.Next().epoch, 1);
}

TEST(LoaderTest, SeekResumesTheSameBatches) {
  auto ds = Synthetic(50);
  BatchLoader a(*ds, 8, true, 5);
  std::vector<std::vector<float>> batches;
  for (int i = 0; i < 12; ++i) batches.push_back(a.Next().inputs);
  BatchLoader b(*ds, 8, true, 5);
  for (int i = 0; i < 5; ++i) b.Next();
  const int64_t epoch = b.epoch(), offset = b.offset();
  BatchLoader c(*ds, 8, true, 5, /*prefetch=*/false);
  c.Seek(epoch, offset);
  for (int i = 5; i < 12; ++i) EXPECT_EQ(c.Next().inputs, batches[i]) << i;
}

TEST(LoaderTest, ShuffleDependsOnTheSeed) {
  auto ds = Synthetic(100);
  BatchLoader a(*ds, 100, true, 1), b(*ds, 100, true, 2), c(*ds, 100, false, 1);
  EXPECT_NE(a.Next().inputs, b.Next().inputs);
  const Batch& ordered = c.Next();
  EXPECT_EQ(ordered.size, 100);
}

}  // namespace
}  // namespace tandem
