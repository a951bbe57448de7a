// Checkpoint files: what is written reads back, a damaged byte is DATA_LOSS,
// and the CRC covers every byte of files past 4 GiB (zlib takes 32-bit
// lengths: a checkpoint of a 358M-parameter model with Adam's moments is past
// them).
#include "runtime/train/checkpoint.h"

#include <sys/mman.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(CheckpointTest, WhatIsWrittenReadsBackAndADamagedByteIsDataLoss) {
  const std::string path = ::testing::TempDir() + "/ckpt-test.tdm";
  std::vector<float> w = {1, 2, 3, 4}, m = {0.5f, -0.5f};
  tandem::v1::CheckpointHeader header;
  header.set_step(7);
  absl::StatusOr<CheckpointFile> file =
      WriteCheckpoint(path, header, {{"w", w.data(), 4}, {"m", m.data(), 2}});
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<float> w2(4), m2(2);
  CheckpointFile read;
  absl::StatusOr<tandem::v1::CheckpointHeader> back =
      ReadCheckpoint(path, "", {{"w", w2.data(), 4}, {"m", m2.data(), 2}}, &read);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->step(), 7);
  EXPECT_EQ(w2, w);
  EXPECT_EQ(m2, m);
  EXPECT_EQ(read.crc32, file->crc32);
  EXPECT_EQ(read.bytes, file->bytes);
  // The CRC is zlib's over everything before it.
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  EXPECT_EQ(file->crc32, crc32(0, reinterpret_cast<const Bytef*>(bytes.data()),
                               static_cast<uInt>(bytes.size() - 4)));
  bytes[bytes.size() - 8] ^= 1;  // a bit of the last tensor
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const absl::Status damaged = ReadCheckpoint(path, "", {{"w", w2.data(), 4}}).status();
  EXPECT_EQ(damaged.code(), absl::StatusCode::kDataLoss) << damaged;
  std::filesystem::remove(path);
}

// Over 4 GiB of zeros (pages the kernel maps to its zero page: no memory),
// the CRC is the one zlib combines from two halves it can take whole.
TEST(CheckpointTest, TheCrcCoversEveryByteOfBuffersPast4GiB) {
  const size_t n = (size_t{1} << 32) + 16;
  void* p = mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  const auto* bytes = static_cast<const Bytef*>(p);
  const size_t half = size_t{1} << 31;
  const uLong first = crc32(0, bytes, static_cast<uInt>(half));
  const uLong second = crc32(0, bytes + half, static_cast<uInt>(n - half));
  const uLong whole = crc32_combine(first, second, static_cast<z_off_t>(n - half));
  EXPECT_EQ(Crc32(0, p, n), static_cast<uint32_t>(whole));
  // What a 32-bit length would have covered: the last 16 bytes alone.
  EXPECT_NE(Crc32(0, p, n), static_cast<uint32_t>(crc32(0, bytes, 16)));
  munmap(p, n);
}

}  // namespace
}  // namespace tandem
