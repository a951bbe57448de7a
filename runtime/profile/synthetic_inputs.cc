#include "runtime/profile/synthetic_inputs.h"

#include <algorithm>

#include "runtime/core/random.h"

namespace tandem::profile {

void FillRandom(DType dtype, int64_t classes, void* out, int64_t elements, uint64_t seed,
                uint64_t stream) {
  if (dtype == DType::kI32) {
    int32_t* ids = static_cast<int32_t*>(out);
    for (int64_t i = 0; i < elements; ++i) {
      const float u = UniformAt(seed, stream, static_cast<uint64_t>(i));
      ids[i] = static_cast<int32_t>(
          std::min<int64_t>(classes - 1, static_cast<int64_t>(u * static_cast<float>(classes))));
    }
    return;
  }
  FillUniform(static_cast<float*>(out), elements, -1.0f, 1.0f, seed, stream);
}

Batch SyntheticBatch(const DataInfo& data, int64_t batch, uint64_t seed) {
  Batch b;
  b.size = batch;
  b.input_dtype = data.input_dtype;
  b.inputs.resize(batch * data.sample_shape.elements());
  b.targets.resize(batch * data.targets_per_sample);
  FillRandom(data.input_dtype, data.num_classes, b.inputs.data(),
             static_cast<int64_t>(b.inputs.size()), seed, 0x1b7);
  FillRandom(DType::kI32, data.num_classes, b.targets.data(),
             static_cast<int64_t>(b.targets.size()), seed, 0x7a6);
  return b;
}

}  // namespace tandem::profile
