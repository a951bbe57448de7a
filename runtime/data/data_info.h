// What a model needs to know about its data. Datasets describe themselves with
// it (runtime/data/dataset.h) and models are built for it
// (runtime/model/model.h); it lives here so the readers depend on no model code.
#ifndef TANDEM_RUNTIME_DATA_DATA_INFO_H_
#define TANDEM_RUNTIME_DATA_DATA_INFO_H_

#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/core/shape.h"

namespace tandem {

struct DataInfo {
  // One input sample: [H, W, C] images, [features], or [T] tokens.
  Shape sample_shape;
  DType input_dtype = DType::kF32;
  // Classes (or vocabulary for token targets).
  int64_t num_classes = 0;
  // Targets per sample: 1 for classification, T for language modelling.
  int64_t targets_per_sample = 1;
  // Host bytes the opened dataset holds (estimate, both splits); 0 if unknown.
  int64_t memory_bytes = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DATA_DATA_INFO_H_
