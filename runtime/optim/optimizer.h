// The optimizer of a job: its configuration, its state (one contiguous buffer per
// moment, laid out like the parameters) and the step counter.
//
// A step is split so the hybrid executor can update layers separately, on either
// device: BeginStep() fixes this step's constants (t, learning rate, gradient
// scale from clipping), then UpdateSlice() updates any range of the flat
// buffers and may run concurrently for disjoint ranges. Step() does both for
// the whole model. Not thread-safe apart from concurrent UpdateSlice calls.
#ifndef TANDEM_RUNTIME_OPTIM_OPTIMIZER_H_
#define TANDEM_RUNTIME_OPTIM_OPTIMIZER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/core/allocator.h"
#include "runtime/optim/kernels.h"
#include "tandem/v1/job.pb.h"

namespace tandem {

// The constants of one optimizer step.
struct StepConstants {
  tandem::v1::OptimizerKind kind = tandem::v1::OPTIMIZER_KIND_ADAM;
  optim::AdamStep adam;
  optim::SgdStep sgd;
  // The same learning rate and t as above, for reporting.
  float learning_rate = 0;
  int64_t t = 0;
};

class Optimizer {
 public:
  // `spec` must be resolved (defaults filled, see job_spec.h). Moments of
  // `elements` floats are allocated from `allocator` as optimizer state (none for
  // plain SGD) and zeroed.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const tandem::v1::OptimizerSpec& spec,
                                                           int64_t elements, Allocator* allocator);
  // Without state buffers: for executors that keep moments elsewhere (on a
  // device) and only need the step constants.
  static std::unique_ptr<Optimizer> Stateless(const tandem::v1::OptimizerSpec& spec);

  // Moments per parameter: 2 (Adam, AdamW), 1 (SGD with momentum), 0 (SGD).
  int state_count() const;
  // Moment i (0: Adam's m or SGD's momentum buffer; 1: Adam's v), `elements` long.
  float* state(int i) const { return states_[i].f32(); }
  int64_t elements() const { return elements_; }

  // Learning rate at `step` (0-based) of `total_steps`, per the schedule.
  float LearningRate(int64_t step, int64_t total_steps) const;

  // Starts step t = step() + 1 with the given learning rate; `grad_scale`
  // multiplies every gradient (global-norm clipping). Returns its constants.
  const StepConstants& BeginStep(float learning_rate, float grad_scale);
  // The constants of step `t` (1-based) without starting it: for workers that
  // update shared state concurrently, each with its own t (Hogwild, the
  // parameter server).
  StepConstants ConstantsAt(int64_t t, float learning_rate, float grad_scale) const;
  const StepConstants& current() const { return current_; }
  // Updates elements [begin, begin + n) of the flat buffers with the current
  // step's constants; `states` has state_count() pointers at the same offset.
  static void UpdateSlice(const StepConstants& c, float* params, const float* grads,
                          float* const* states, int64_t n);
  // UpdateSlice in mixed precision (docs/planning.md, "Mixed precision"): the
  // fp32 master `params` and state stepped with the bf16 gradient `grads16`
  // (widened exactly), and the updated weights rounded to bf16 into `copy16`,
  // the working copy the accelerator reads. Adam and AdamW in one fused pass
  // (optim::AdamUpdateBf16); SGD widens the gradient into `scratch` (n floats)
  // first and rounds after.
  static void UpdateSliceBf16(const StepConstants& c, float* params, const uint16_t* grads16,
                              float* const* states, uint16_t* copy16, float* scratch, int64_t n);
  // BeginStep + UpdateSlice over everything.
  void Step(float* params, const float* grads, float learning_rate, float grad_scale);

  // Steps taken so far (Adam's t of the last step).
  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }

  // Scale for clipping to `max_norm` given the gradients' global norm (PyTorch's
  // clip_grad_norm_): min(1, max_norm / (norm + 1e-6)); 1 when max_norm is 0.
  static float ClipScale(double norm, float max_norm);
  // What multiplies every gradient when the gradients were computed for a loss
  // scaled by `loss_scale` (0: not scaled) and `scaled_sum_of_squares` is their
  // squared global norm: sets *norm to the unscaled gradients' norm and
  // returns ClipScale(*norm, max_norm) / loss_scale; or returns 0 when the sum
  // is not finite (*norm then inf or NaN): under loss scaling an overflow, and
  // the update is skipped; without it, diverged gradients.
  static float GradientScale(double scaled_sum_of_squares, float loss_scale, float max_norm,
                             double* norm);

  const tandem::v1::OptimizerSpec& spec() const { return spec_; }

 private:
  explicit Optimizer(const tandem::v1::OptimizerSpec& spec) : spec_(spec) {}

  tandem::v1::OptimizerSpec spec_;
  int64_t elements_ = 0;
  std::vector<Buffer> states_;
  int64_t step_ = 0;
  StepConstants current_;
};

}  // namespace tandem

#endif  // TANDEM_RUNTIME_OPTIM_OPTIMIZER_H_
