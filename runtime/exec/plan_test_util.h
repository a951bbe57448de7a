// What the plan executor's tests share, whatever accelerator they run on: the
// jobs they train (a small MLP and a small GPT), plans of every shape the
// planner emits, and the CPU engine's losses to compare against. For tests only.
// Not thread-safe (one test thread).
#ifndef TANDEM_RUNTIME_EXEC_PLAN_TEST_UTIL_H_
#define TANDEM_RUNTIME_EXEC_PLAN_TEST_UTIL_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/exec/plan_executor.h"
#include "runtime/exec/step_runner.h"
#include "runtime/model/model.h"
#include "spec/job_spec.h"
#include "tandem/v1/plan.pb.h"

namespace tandem::exec_test {

// An MLP with dropout, Adam; batch 32.
extern const char kMlp[];
// A 2-layer GPT with dropout, AdamW and gradient clipping; batch 16.
extern const char kGpt[];

struct Fixture {
  tandem::v1::JobSpec spec;
  std::unique_ptr<Model> model;
  Datasets data;
  // The model's matrix-product type (Model::Build).
  DType compute = DType::kF32;
  // StepOptions::loss_scale of every step RunSteps takes (0: none).
  float loss_scale = 0;
};

// The job of a YAML spec: its model (products in `compute`) and datasets.
Fixture MakeFixture(const std::string& yaml, DType compute = DType::kF32);

// `steps` training steps of the job's batches (shuffled by its seed) at its
// learning rate; the mean loss of each. Stops at the first failure, reported
// with ADD_FAILURE.
std::vector<double> RunSteps(const Fixture& f, StepRunner& runner, int steps);

// RunSteps on the CPU engine: the reference every plan must match.
std::vector<double> Reference(const Fixture& f, int steps);

// Each step's loss within `rtol` of the reference's, relative (a failure names
// `what` and the step); returns the largest relative deviation.
double ExpectLossesClose(const std::vector<double>& losses, const std::vector<double>& reference,
                         double rtol, const std::string& what);

// An executor's options for `plan` of f's job (its optimizer and seed) at
// batches of up to `max_batch`, on `accelerator` with `host` memory.
ExecutorOptions ExecutorOptionsFor(const Fixture& f, tandem::v1::Plan plan, int64_t max_batch,
                                   Accelerator* accelerator, Allocator* host);

// A plan in which every layer computes on the accelerator with resident
// weights, updates there and keeps its activations, then gets `make(l)`.
tandem::v1::Plan MakePlan(const Model& m, tandem::v1::Strategy strategy, int batch, int micro,
                          const std::function<void(int, tandem::v1::LayerPlan*)>& make);

// A plan shape, and how closely the executor must follow the CPU engine under
// it on exact (CPU) arithmetic: 0 = the same losses, bit for bit.
struct Case {
  std::string name;
  std::function<tandem::v1::Plan(const Model&, int batch)> plan;
  double rtol;
};

// gpu_only, zero_offload, reuse_distance, streamed_offload_recompute,
// micro_batches, cpu_only, hetero_dp, streamed_state (in that order).
std::vector<Case> Cases();

}  // namespace tandem::exec_test

#endif  // TANDEM_RUNTIME_EXEC_PLAN_TEST_UTIL_H_
