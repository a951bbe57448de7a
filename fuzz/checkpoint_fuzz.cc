// Fuzz target: the checkpoint reader, which a resumed job points at a file that
// may be truncated, damaged or from another model. The first input byte holds
// flags, the rest is the file:
//
//   bit 0  append the CRC the rest deserves, so the fuzzer reaches the header
//          and tensor checks behind it (unset, the rest is the whole file)
//   bit 1  ask for model fingerprint "fuzz-model" (unset, any model)
//
// The reader is asked for two tensors, "w" (6 floats) and "b" (2 floats).
// Checks: nothing crashes or reads out of bounds; an error always says what is
// wrong; a success filled the tensors from inside the file.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fuzz/scratch_dir.h"
#include "runtime/train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  std::string file(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (flags & 1) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(crc32(0, nullptr, 0), reinterpret_cast<const Bytef*>(file.data()), file.size()));
    file.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
  }
  const std::string path = tandem::fuzz::WriteScratchFile("checkpoint", file);
  std::vector<float> w(6, -1.0f), b(2, -1.0f);
  const std::vector<tandem::NamedTensor> into = {{"w", w.data(), 6}, {"b", b.data(), 2}};
  absl::StatusOr<tandem::v1::CheckpointHeader> header =
      tandem::ReadCheckpoint(path, (flags & 2) ? "fuzz-model" : "", into);
  if (!header.ok() && header.status().message().empty()) {
    std::fprintf(stderr, "checkpoint_fuzz: an error without a message\n");
    std::abort();
  }
  return 0;
}
