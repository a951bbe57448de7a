// Dynamic loss scaling for fp16 training (as PyTorch's GradScaler): the scale
// each step's loss gradient is multiplied by, halved after a step whose
// scaled gradients overflowed (the runner skipped its update), doubled after
// growth_interval steps in a row without one. A run of max_consecutive_skips
// skipped steps means no scale keeps the model within fp16's range, and is
// reported as an error. Its state is three numbers, kept in checkpoints.
// Thread-compatible.
#ifndef TANDEM_RUNTIME_TRAIN_LOSS_SCALER_H_
#define TANDEM_RUNTIME_TRAIN_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

class LossScaler {
 public:
  // Growth stops at kMaxScale and halving at kMinScale (the runners take the
  // scale as a float, and divide by it).
  static constexpr double kMaxScale = 0x1p64;
  static constexpr double kMinScale = 0x1p-24;

  // `spec` is resolved (its defaults filled in).
  explicit LossScaler(const tandem::v1::LossScaling& spec);

  // The scale of the next step.
  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int consecutive_skips() const { return consecutive_skips_; }

  // After a step: `skipped` when its update was skipped for an overflow.
  // FAILED_PRECONDITION once max_consecutive_skips steps in a row were.
  absl::Status Update(bool skipped);

  // From a checkpoint: the scale (> 0), the good steps since it last changed,
  // the skipped steps so far and how many of the latest were in a row.
  void Restore(double scale, int64_t good_steps, int64_t skipped_steps, int consecutive_skips);

 private:
  const tandem::v1::LossScaling spec_;
  double scale_;
  int64_t good_steps_ = 0;
  int64_t skipped_steps_ = 0;
  int consecutive_skips_ = 0;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_TRAIN_LOSS_SCALER_H_
