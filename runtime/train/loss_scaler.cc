#include "runtime/train/loss_scaler.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tandem {

LossScaler::LossScaler(const tandem::v1::LossScaling& spec)
    : spec_(spec), scale_(spec.initial_scale()) {}

absl::Status LossScaler::Update(bool skipped) {
  if (!skipped) {
    consecutive_skips_ = 0;
    if (++good_steps_ >= spec_.growth_interval_steps()) {
      scale_ = std::min(scale_ * 2, kMaxScale);
      good_steps_ = 0;
    }
    return absl::OkStatus();
  }
  ++skipped_steps_;
  good_steps_ = 0;
  scale_ = std::max(scale_ * 0.5, kMinScale);
  if (++consecutive_skips_ >= spec_.max_consecutive_skips()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "fp16 loss scaling: %d steps in a row overflowed, down to a scale of %g; the model "
        "overflows fp16 itself (activations beyond 65504). Train it in PRECISION_BF16 or "
        "PRECISION_FP32, or raise training.loss_scaling.max_consecutive_skips",
        consecutive_skips_, scale_));
  }
  return absl::OkStatus();
}

void LossScaler::Restore(double scale, int64_t good_steps, int64_t skipped_steps,
                         int consecutive_skips) {
  scale_ = std::clamp(scale, kMinScale, kMaxScale);
  good_steps_ = good_steps;
  skipped_steps_ = skipped_steps;
  consecutive_skips_ = consecutive_skips;
}

}  // namespace tandem
