#include "runtime/layers/init.h"

#include <cmath>

#include "runtime/core/random.h"

namespace tandem {

void InitWeightAndBias(const InitOptions& init, int64_t fan_in, float* weight, int64_t n_weight,
                       float* bias, int64_t n_bias, uint64_t seed, uint64_t stream) {
  const uint64_t weight_stream = MixStream(stream, 1);
  const uint64_t bias_stream = MixStream(stream, 2);
  if (init.kind == InitKind::kNormal) {
    FillNormal(weight, n_weight, 0.0f, init.stddev, seed, weight_stream);
    for (int64_t i = 0; i < n_bias; ++i) bias[i] = 0.0f;
    return;
  }
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
  FillUniform(weight, n_weight, -bound, bound, seed, weight_stream);
  if (n_bias > 0) FillUniform(bias, n_bias, -bound, bound, seed, bias_stream);
}

}  // namespace tandem
