// ResidentChain: PlanSimulator's rules (simulator.h) for the schedules most
// plans are — every layer computes on the accelerator with its weights resident
// there, keeps or recomputes its activations (no OFFLOAD, no HOST_STREAMED), and
// updates on the accelerator or on the host (gpu_only, zero_offload and
// reuse_distance without streaming or offload) — run as recurrences instead of
// an event graph, with or without gradient clipping (CostModel::
// clips_gradients: the norm after the last backward and every gradient copy
// down, then every update).
//
// Why it is exact. In this class the copy engines and the host update pool
// carry only the gradient -> update -> weights chain of host-updated layers.
// Gradients become ready in backward order (iteration after iteration), so each
// FIFO resource serves the chain in that order and every span starts at
// max(its input is ready, its resource is free); the compute stream is its
// program with FORWARD(l, 0) also waiting for layer l's weights (and, under
// clipping, GRADIENT_NORM for the last gradient copy down, which ends every
// other: the D2H engine serves them in order). Each span's
// times are then fixed by the spans created before it, and the run is one pass
// in creation order with the same floating-point operations the event graph
// performs, so every number of the SimulationResult (prediction, timeline,
// memory samples, reuse distances, slack) is bit-for-bit the event graph's. A
// test holds the two to that on random schedules.
//
// Cost: O(iterations * micro-batches * layers) with a small constant and no
// graph; PlanSimulator uses it for every schedule it covers.
//
// Not thread-safe (scratch buffers): one instance per thread.
#ifndef TANDEM_PLANNER_RESIDENT_CHAIN_H_
#define TANDEM_PLANNER_RESIDENT_CHAIN_H_

#include <cstdint>
#include <vector>

#include "planner/cost_model.h"
#include "planner/decisions.h"
#include "planner/simulator.h"
#include "planner/steady_state.h"

namespace tandem::planner {

// One layer's figures at the schedule's micro-batch size, computed with the
// same CostModel calls as the event graph.
struct ResidentLayer : ChainLayerCosts {
  double param_h2d = 0;
};

class ResidentChain {
 public:
  // Whether `schedule` is in the class above (it must also be valid).
  static bool Covers(const Decisions& schedule);

  // Everything of `base` but where layers update; `base` must be Covered.
  ResidentChain(const CostModel& cost, const Decisions& base);

  int num_layers() const { return static_cast<int>(layers_.size()); }
  const ResidentLayer& layer(int l) const { return layers_[l]; }
  int micro_batches() const { return micro_batches_; }
  // One iteration's work on each resource (SimulationResult's
  // resource_work_seconds) when the layers in `acc` update on the
  // accelerator.
  std::vector<double> ResourceWork(const std::vector<bool>& acc) const;
  bool delayed_parameter_update() const { return delayed_; }

  struct Timing {
    double iteration_seconds = 0;
    // -1 unless asked for.
    int64_t accelerator_peak_bytes = -1;
  };
  // The reported iteration's time and, with need_peak, accelerator peak, when
  // the layers with on_accelerator[l] update on the accelerator and the others
  // on the host.
  Timing Run(const std::vector<bool>& on_accelerator, bool need_peak);

  // What PlanSimulator::Simulate reports for `base` with those placements.
  SimulationResult Simulate(const std::vector<bool>& on_accelerator, bool record_timeline);

 private:
  struct Record;
  // One run's clocks, memory feed and iteration under way.
  struct Pass;
  // One run of `iterations` iterations, stopped where the last one starts.
  // Each iteration is its micro-batches' forwards and backwards, every
  // layer's update after the last backward.
  void RunOnce(const std::vector<bool>& acc, int iterations, WindowLevel* memory, Record* record);
  void BeginIteration(Pass* p, int iteration, int iterations);
  // Layer l's forward in micro-batch j starts when the stream is free and,
  // in the first micro-batch, once its host-updated weights are back.
  double ForwardStart(const Pass& p, int j, int l) const;
  // At the last iteration's start: the reuse distances' last positions and
  // the memory window's close.
  void StopAt(Pass* p, double start);
  void Forwards(Pass* p, int micro_batch);
  // After the last micro-batch's backwards, each layer's update on its side.
  void Backwards(Pass* p, int micro_batch);
  void AcceleratorUpdate(Pass* p, int layer, int micro_batch);
  // The gradient -> host update -> weights chain on the D2H engine, the
  // host pool and the H2D engine: the gradient down, then (HostUpdateFrom)
  // the update once `ready` and the weights back.
  void HostUpdate(Pass* p, int layer, int micro_batch);
  void GradientDown(Pass* p, int layer, int micro_batch);
  void HostUpdateFrom(Pass* p, int layer, int micro_batch, double ready);
  // Clipping: after the last backward, the norm on the compute stream once
  // every gradient is down, then each layer's update (L-1 first), the
  // accelerator's on the stream and the host's on its chain.
  void UpdatesAfterTheNorm(Pass* p, int micro_batch);

  std::vector<ResidentLayer> layers_;
  // The job clips its gradients (CostModel::clips_gradients; lower.h,
  // "Gradient clipping").
  bool clip_ = false;
  int micro_batches_ = 1;
  bool delayed_ = false;
  int batch_size_ = 1;
  int64_t static_accelerator_params_ = 0;
  // Scratch.
  std::vector<double> starts_;
  // When each iteration's last operation ends (steady_state.h).
  std::vector<double> finishes_;
  std::vector<double> returned_;
  std::vector<MemoryChange> pending_frees_;
  std::vector<double> d2h_of_;
};

}  // namespace tandem::planner

#endif  // TANDEM_PLANNER_RESIDENT_CHAIN_H_
