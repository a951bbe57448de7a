#include "runtime/optim/optimizer.h"

#include <cmath>
#include <cstring>

#include "base/status_macros.h"
#include "runtime/core/bf16.h"

namespace tandem {

using tandem::v1::OptimizerKind;

std::unique_ptr<Optimizer> Optimizer::Stateless(const tandem::v1::OptimizerSpec& spec) {
  return std::unique_ptr<Optimizer>(new Optimizer(spec));
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const tandem::v1::OptimizerSpec& spec,
                                                             int64_t elements,
                                                             Allocator* allocator) {
  std::unique_ptr<Optimizer> opt = Stateless(spec);
  opt->elements_ = elements;
  for (int i = 0; i < opt->state_count(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(
        Buffer b, Buffer::Allocate(allocator, elements * 4, MemoryCategory::kOptimizerState));
    std::memset(b.data(), 0, elements * 4);
    opt->states_.push_back(std::move(b));
  }
  return opt;
}

int Optimizer::state_count() const {
  switch (spec_.kind()) {
    case tandem::v1::OPTIMIZER_KIND_SGD:
      return spec_.momentum() > 0 ? 1 : 0;
    default:
      return 2;
  }
}

float Optimizer::LearningRate(int64_t step, int64_t total_steps) const {
  const float base = spec_.learning_rate();
  if (spec_.warmup_steps() > 0 && step < spec_.warmup_steps()) {
    return base * static_cast<float>(step + 1) / static_cast<float>(spec_.warmup_steps());
  }
  if (spec_.schedule() != tandem::v1::LEARNING_RATE_SCHEDULE_COSINE) return base;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - spec_.warmup_steps());
  const double progress = std::min(
      1.0, static_cast<double>(step - spec_.warmup_steps()) / static_cast<double>(decay_steps));
  const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return static_cast<float>(spec_.min_learning_rate() +
                            (base - spec_.min_learning_rate()) * cosine);
}

StepConstants Optimizer::ConstantsAt(int64_t t, float learning_rate, float grad_scale) const {
  StepConstants c;
  c.kind = spec_.kind() == tandem::v1::OPTIMIZER_KIND_UNSPECIFIED ? tandem::v1::OPTIMIZER_KIND_ADAM
                                                                  : spec_.kind();
  c.learning_rate = learning_rate;
  c.t = t;
  c.adam = optim::AdamStep{.lr = learning_rate,
                           .beta1 = spec_.beta1(),
                           .beta2 = spec_.beta2(),
                           .eps = spec_.epsilon(),
                           .weight_decay = spec_.weight_decay(),
                           .decoupled = c.kind == tandem::v1::OPTIMIZER_KIND_ADAMW,
                           .grad_scale = grad_scale,
                           .t = t};
  c.sgd = optim::SgdStep{.lr = learning_rate,
                         .momentum = spec_.momentum(),
                         .nesterov = spec_.nesterov(),
                         .weight_decay = spec_.weight_decay(),
                         .grad_scale = grad_scale,
                         .first_step = t == 1};
  return c;
}

const StepConstants& Optimizer::BeginStep(float learning_rate, float grad_scale) {
  ++step_;
  current_ = ConstantsAt(step_, learning_rate, grad_scale);
  return current_;
}

void Optimizer::UpdateSlice(const StepConstants& c, float* params, const float* grads,
                            float* const* states, int64_t n) {
  if (c.kind == tandem::v1::OPTIMIZER_KIND_SGD) {
    optim::SgdUpdate(params, grads, c.sgd.momentum > 0 ? states[0] : nullptr, n, c.sgd);
  } else {
    optim::AdamUpdate(params, grads, states[0], states[1], n, c.adam);
  }
}

void Optimizer::UpdateSliceBf16(const StepConstants& c, float* params, const uint16_t* grads16,
                                float* const* states, uint16_t* copy16, float* scratch, int64_t n) {
  if (c.kind != tandem::v1::OPTIMIZER_KIND_SGD) {
    optim::AdamUpdateBf16(params, grads16, states[0], states[1], copy16, n, c.adam);
    return;
  }
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; ++i) scratch[i] = Bf16ToFloat(grads16[i]);
  UpdateSlice(c, params, scratch, states, n);
#pragma omp parallel for simd
  for (int64_t i = 0; i < n; ++i) copy16[i] = FloatToBf16(params[i]);
}

void Optimizer::Step(float* params, const float* grads, float learning_rate, float grad_scale) {
  const StepConstants& c = BeginStep(learning_rate, grad_scale);
  float* states[2] = {states_.size() > 0 ? state(0) : nullptr,
                      states_.size() > 1 ? state(1) : nullptr};
  UpdateSlice(c, params, grads, states, elements_);
}

float Optimizer::GradientScale(double scaled_sum_of_squares, float loss_scale, float max_norm,
                               double* norm) {
  if (!std::isfinite(scaled_sum_of_squares)) {
    *norm = std::sqrt(scaled_sum_of_squares);  // inf or NaN, as ClipScale's callers saw it
    return 0;
  }
  const double unscale = loss_scale > 0 ? 1.0 / loss_scale : 1.0;
  *norm = std::sqrt(scaled_sum_of_squares) * unscale;
  return static_cast<float>(ClipScale(*norm, max_norm) * unscale);
}

float Optimizer::ClipScale(double norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double scale = max_norm / (norm + 1e-6);
  return scale < 1.0 ? static_cast<float>(scale) : 1.0f;
}

}  // namespace tandem
