// Parameter initialisation schemes, deterministic in (seed, stream).
#ifndef TANDEM_RUNTIME_LAYERS_INIT_H_
#define TANDEM_RUNTIME_LAYERS_INIT_H_

#include <cstdint>

namespace tandem {

enum class InitKind {
  // PyTorch's nn.Linear/nn.Conv2d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for
  // weights and biases (kaiming_uniform with a = sqrt(5)).
  kUniformFanIn,
  // N(0, std) weights and zero biases (GPT-2).
  kNormal,
};

struct InitOptions {
  InitKind kind = InitKind::kUniformFanIn;
  // Standard deviation for kNormal.
  float stddev = 0.02f;
};

// Fills `weight` (n_weight elements) and `bias` (n_bias, may be 0) per `init`.
void InitWeightAndBias(const InitOptions& init, int64_t fan_in, float* weight, int64_t n_weight,
                       float* bias, int64_t n_bias, uint64_t seed, uint64_t stream);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_LAYERS_INIT_H_
