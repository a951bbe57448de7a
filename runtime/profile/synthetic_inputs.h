// Random inputs for profiling: the profiler times layers on data of the right
// shape and type, not on a dataset (timings of these kernels do not depend on
// the values). Stateless functions; thread-safe.
#ifndef TANDEM_RUNTIME_PROFILE_SYNTHETIC_INPUTS_H_
#define TANDEM_RUNTIME_PROFILE_SYNTHETIC_INPUTS_H_

#include <cstdint>

#include "runtime/core/dtype.h"
#include "runtime/data/loader.h"
#include "runtime/model/model.h"

namespace tandem::profile {

// `elements` values at `out`: f32 uniform in [-1, 1), or i32 ids uniform in
// [0, classes) (token ids, class targets), from (seed, stream).
void FillRandom(DType dtype, int64_t classes, void* out, int64_t elements, uint64_t seed,
                uint64_t stream);

// A batch of `batch` random samples and targets for a model on `data`.
Batch SyntheticBatch(const DataInfo& data, int64_t batch, uint64_t seed);

}  // namespace tandem::profile

#endif  // TANDEM_RUNTIME_PROFILE_SYNTHETIC_INPUTS_H_
