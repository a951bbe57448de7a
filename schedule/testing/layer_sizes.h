// Layer sizes for schedule tests: every layer the same, small round numbers,
// so a test can read the bytes a schedule moves and holds.
#ifndef TANDEM_SCHEDULE_TESTING_LAYER_SIZES_H_
#define TANDEM_SCHEDULE_TESTING_LAYER_SIZES_H_

#include <vector>

#include "schedule/lower.h"

namespace tandem::schedule::testing {

inline std::vector<LayerSizes> UniformSizes(int layers) {
  std::vector<LayerSizes> sizes(layers);
  for (LayerSizes& z : sizes) {
    z.parameters = z.gradients = z.update = 100;
    z.optimizer_state = 200;
    z.activations = 50;
    z.workspace = 10;
  }
  return sizes;
}

}  // namespace tandem::schedule::testing

#endif  // TANDEM_SCHEDULE_TESTING_LAYER_SIZES_H_
