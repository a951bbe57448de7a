#include "runtime/dist/rank_step.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tandem {

int64_t TakeShare(const Model& model, const Batch& batch, int rank, int ranks, Batch* share) {
  const int64_t begin = batch.size * rank / ranks, end = batch.size * (rank + 1) / ranks;
  const int64_t in = model.data().sample_shape.elements();
  const int64_t targets = batch.size == 0 ? 0 : batch.targets.size() / batch.size;
  share->size = end - begin;
  share->epoch = batch.epoch;
  share->offset = batch.offset + begin;
  share->input_dtype = batch.input_dtype;
  share->inputs.assign(batch.inputs.begin() + begin * in, batch.inputs.begin() + end * in);
  share->targets.assign(batch.targets.begin() + begin * targets,
                        batch.targets.begin() + end * targets);
  return begin;
}

absl::StatusOr<double> AgreeStepEnd(Communicator* comm, double share_loss_sum, int64_t step,
                                    StopVote* vote) {
  const double s = static_cast<double>(step);
  const bool stop = vote != nullptr && vote->requested();
  double sums[4] = {share_loss_sum, stop ? 1.0 : 0.0, s, s * s};
  TANDEM_RETURN_IF_ERROR(comm->AllReduceSum(sums, 4));
  const double n = comm->size();
  if (sums[2] * sums[2] != n * sums[3]) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ranks are not at the same step (rank ", comm->rank(), " is at ", step,
                     ", the mean is ", sums[2] / n, "): a rank resumed from another checkpoint"));
  }
  if (sums[1] > 0 && vote != nullptr) vote->Agree();
  return sums[0];
}

absl::StatusOr<EvalResult> SumEvaluation(Communicator* comm, const EvalResult& share) {
  double sums[4] = {share.loss_sum, static_cast<double>(share.correct),
                    static_cast<double>(share.positions), static_cast<double>(share.samples)};
  TANDEM_RETURN_IF_ERROR(comm->AllReduceSum(sums, 4));
  EvalResult r;
  r.loss_sum = sums[0];
  r.correct = static_cast<int64_t>(std::llround(sums[1]));
  r.positions = static_cast<int64_t>(std::llround(sums[2]));
  r.samples = static_cast<int64_t>(std::llround(sums[3]));
  return r;
}

absl::StatusOr<bool> BroadcastStartPoint(Communicator* comm, StartPoint* point) {
  double at[5] = {static_cast<double>(point->step), static_cast<double>(point->samples),
                  static_cast<double>(point->epoch), static_cast<double>(point->epoch_offset),
                  static_cast<double>(point->optimizer_step)};
  TANDEM_RETURN_IF_ERROR(comm->Broadcast(at, 5, 0));
  if (comm->rank() == 0) return false;
  point->step = static_cast<int64_t>(at[0]);
  point->samples = static_cast<int64_t>(at[1]);
  point->epoch = static_cast<int64_t>(at[2]);
  point->epoch_offset = static_cast<int64_t>(at[3]);
  point->optimizer_step = static_cast<int64_t>(at[4]);
  return true;
}

absl::StatusOr<std::vector<double>> GatherFromRanks(Communicator* comm,
                                                    const std::vector<double>& mine) {
  const size_t n = mine.size();
  std::vector<double> all(n * comm->size(), 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + n * comm->rank());
  TANDEM_RETURN_IF_ERROR(comm->AllReduceSum(all.data(), static_cast<int64_t>(all.size())));
  return all;
}

}  // namespace tandem
