// Checks a layer's Backward against central finite differences of its Forward.
//
// With a fixed random projection r, the scalar L = sum(y * r) has dL/dy = r, so
// Backward(dy = r) must give dL/dx and dL/dparams. Each checked coordinate is
// perturbed by +-eps and L recomputed (in double); the analytic value must match
// within `rtol` relative to max(|numeric|, |analytic|, atol_floor). For tests.
#ifndef TANDEM_RUNTIME_LAYERS_GRADIENT_CHECK_H_
#define TANDEM_RUNTIME_LAYERS_GRADIENT_CHECK_H_

#include <functional>
#include <string>
#include <vector>

#include "runtime/layers/layer.h"

namespace tandem {

struct GradientCheckOptions {
  int64_t batch = 2;
  float eps = 1e-2f;
  double rtol = 2e-2;
  double atol_floor = 1e-3;
  // Coordinates checked per tensor (spread evenly); all if the tensor is smaller.
  int max_checks = 40;
  uint64_t seed = 7;
  bool training = true;
  // Input values: uniform in [-input_range, input_range]; for i32 inputs,
  // [0, int_input_limit).
  float input_range = 1.0f;
  int int_input_limit = 0;
  // Targets for loss layers: [batch * targets_per_sample] ids in [0, target_limit).
  int target_limit = 0;
  int targets_per_sample = 1;
  // Also check the input gradient (off for layers whose input is integral).
  bool check_input = true;
};

struct GradientCheckResult {
  int checked = 0;
  int failed = 0;
  double max_rel_error = 0;
  // Up to 10 lines describing failing coordinates.
  std::vector<std::string> failures;
};

// `layer` must be built. Runs on the CPU.
GradientCheckResult CheckGradients(const Layer& layer, const GradientCheckOptions& options);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_GRADIENT_CHECK_H_
