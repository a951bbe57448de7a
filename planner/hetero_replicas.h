// HeteroReplicas: PlanSimulator's rules (simulator.h) for hetero_dp, run as
// recurrences instead of an event graph, bit for bit (a test holds every field
// of the result to the event graph's on random schedules), with or without
// gradient clipping (CostModel::clips_gradients: the host pool runs every
// average, the norm, then every host update; the accelerator's updates wait
// for the norm too).
//
// Why it is exact. Per iteration, the accelerator replica's program and the
// host replica's program each run in order (the host's FORWARD(l) also
// waiting for its UPDATE(l) of the iteration before). The D2H engine serves
// the gradient downloads and the H2D engine the averaged gradients in
// backward order (their inputs become ready in that order). The host pool
// serves two streams, the averages and the host replica's updates, each in
// backward order but interleaved by readiness: when it frees it takes the
// waiting span that became ready first (ties in creation order), so a
// two-way merge of the streams by (ready time, creation order) reproduces it.
// Every resource finishes an iteration's spans before the next iteration's
// become ready, so one pass per iteration with the event graph's
// floating-point operations gives its times. Memory lives on the two compute
// streams, each in time order; the replicas need not keep pace (a layer
// without parameters syncs nothing), so a second run with the window known
// feeds each stream to its own WindowLevel and sums busy time.
//
// Cost: O(iterations * (micro-batches + 1) * layers). hetero_dp's period
// often alternates between two values, so runs go to the 64-iteration cap
// and report the two values' mean (steady_state.h, ReportedPeriod).
//
// Not thread-safe (scratch buffers): one instance per thread.
#ifndef TANDEM_PLANNER_HETERO_REPLICAS_H_
#define TANDEM_PLANNER_HETERO_REPLICAS_H_

#include <cstdint>
#include <vector>

#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "planner/simulator.h"
#include "planner/steady_state.h"

namespace tandem::planner {

class HeteroReplicas {
 public:
  static bool Covers(const Decisions& schedule) {
    return schedule.strategy == tandem::v1::STRATEGY_HETERO_DP;
  }

  // `schedule` must be Covered and valid (PlanSimulator::Validate).
  HeteroReplicas(const CostModel& cost, const Decisions& schedule);

  // What PlanSimulator::Simulate reports for the schedule.
  SimulationResult Simulate(bool record_timeline);

 private:
  // The accelerator replica's figures per micro-batch (ChainLayerCosts), then
  // the host replica's, its whole share in one micro-batch, and the gradient sync.
  struct Layer : ChainLayerCosts {
    double host_fwd = 0, host_bwd = 0;
    int64_t host_act = 0, host_ws = 0;
    double grad_h2d = 0, average = 0;
  };
  struct Record;
  // Where each resource is in the run: the compute streams' clocks, when
  // each copy engine and the host pool are next free, and the accelerator
  // program's durations summed in order (the schedule's program prefix, for
  // reuse distances).
  struct Clocks {
    double acc = 0, host = 0, d2h_free = 0, pool_free = 0, h2d_free = 0, prefix = 0;
  };
  // One run of `iterations` iterations, stopped where the last one starts;
  // times only without a record. Each iteration is the three passes below;
  // `window` is the record when the iteration is the reported one.
  void RunOnce(int iterations, Record* record);
  void AcceleratorPass(Clocks& c, Record* record, Record* window);
  void HostPass(int iteration, Clocks& c, Record* record, Record* window);
  void SyncGradients(Clocks& c, Record* record, Record* window);
  // The gradient sync's spans' starts (their ends are kept per layer), and
  // when the norm ran (clipped).
  struct SyncStarts {
    std::vector<double> down, average, up, host_update;
    double norm = 0;
  };
  // The sync's times on the D2H engine, the host pool and the H2D engine.
  void TimeSync(Clocks& c, SyncStarts* starts);
  // Its busy time and (in the reported window) its spans.
  void RecordSync(const SyncStarts& starts, Record* record, Record* window) const;

  std::vector<Layer> layers_;
  // Layers with parameters, in backward order: the gradient sync's order.
  std::vector<int> synced_;
  // The job clips its gradients (CostModel::clips_gradients): the host pool
  // runs the norm after every average, and every update waits for it.
  bool clip_ = false;
  int micro_batches_ = 1;
  int batch_size_ = 1;
  int64_t static_accelerator_ = 0, static_host_ = 0;
  // Scratch, per layer.
  std::vector<double> starts_, acc_backward_end_, host_backward_end_, down_end_, average_end_,
      up_end_, host_update_end_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_HETERO_REPLICAS_H_
