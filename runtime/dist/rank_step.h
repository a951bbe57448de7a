// What every kind of data-parallel rank does the same way (the CPU engine's
// ranks, data_parallel_runner.h; a hybrid plan's, plan_rank.h): take its share
// of the global batch, agree with the others at the end of each step (loss,
// stop vote, step check), sum its evaluation figures, and start where rank 0
// starts.
#ifndef TANDEM_RUNTIME_DIST_RANK_STEP_H_
#define TANDEM_RUNTIME_DIST_RANK_STEP_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/data/loader.h"
#include "runtime/dist/communicator.h"
#include "runtime/exec/step_runner.h"
#include "runtime/model/model.h"

namespace tandem {

// How the ranks of a job stop together. Any rank may ask (a cancel, a daemon
// stopping); the request travels with the next step's loss reduction, after
// which every rank sees agreed() at the same step boundary and stops there
// (with the same final checkpoint). Thread-safe.
class StopVote {
 public:
  void Request() { requested_.store(true); }
  bool requested() const { return requested_.load(); }
  bool agreed() const { return agreed_.load(); }
  void Agree() { agreed_.store(true); }

 private:
  std::atomic<bool> requested_{false};
  std::atomic<bool> agreed_{false};
};

// Rank `rank` of `ranks`'s share of `batch`: samples [B r / N, B (r+1) / N),
// into `share`; returns the share's first sample's index in the batch.
int64_t TakeShare(const Model& model, const Batch& batch, int rank, int ranks, Batch* share);

// The end of a step, one reduction: the share's summed loss, this rank's stop
// vote and its step (sum and sum of squares are N s and N s^2 only when every
// rank is at step s: a rank that resumed elsewhere is caught at its first
// step). Returns the whole batch's summed loss; agrees `vote` when any rank
// asked to stop. FAILED_PRECONDITION when the ranks are at different steps.
absl::StatusOr<double> AgreeStepEnd(Communicator* comm, double share_loss_sum, int64_t step,
                                    StopVote* vote);

// The whole batch's figures from each rank's share's.
absl::StatusOr<EvalResult> SumEvaluation(Communicator* comm, const EvalResult& share);

// Every rank's `mine` (the same length on each), concatenated in rank order,
// through one collective (StepRunner::GatherFromRanks).
absl::StatusOr<std::vector<double>> GatherFromRanks(Communicator* comm,
                                                    const std::vector<double>& mine);

// Rank 0's start point to every rank; true on the ranks whose point changed
// hands (every rank but 0).
absl::StatusOr<bool> BroadcastStartPoint(Communicator* comm, StartPoint* point);

}  // namespace tandem

#endif  // TANDEM_RUNTIME_DIST_RANK_STEP_H_
