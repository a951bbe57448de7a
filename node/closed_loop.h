// Closed-loop planning: a running job's measured steps checked against its
// plan's prediction, and the plan solved again from what was measured when
// they disagree (docs/planning.md, "Closed loop").
//
// A job is planned at submission from the best figures the node has: a layer
// profile of its model measured here before (LayerProfileCache), else the
// analytic profile on the node profile's rates (placement.h). While it runs,
// a PlanLoop watches its steps: after a warm-up it takes a window of steps,
// compares their median wall time, and each resource's busy time per step,
// with the plan's prediction, and when either is off by more than the job's
// placement.replan_threshold (of the predicted step) it turns the window's
// measured spans into a layer profile (MeasuredLayerProfile) and solves the
// plan again from it. A new placement is switched to at a step boundary; the
// same placement keeps running with its prediction re-calibrated. A switch
// that measures slower than the plan it replaced is switched back, and the
// loop stops there; it also stops after a window that agrees with the
// prediction, after max_replans, and when a re-calibrated prediction is
// still off (what the simulator does not model, it cannot learn). So it is
// bounded in a run, though not kept from going A -> B -> A through
// placements of one strategy that each measure no slower than the last
// (max_replans bounds that), nor from a switch a restarted run repeats (the
// loop's memory is the run's).
//
// A distributed job's rank 0 is checked too, but its plan is never replaced
// (every rank runs it): off the prediction, it is re-timed once as one of
// the job's ranks runs it, from rank 0's measured spans and the rate its
// collectives measured (RetimeRank).
//
// A pipeline (Plan.pipeline) is checked on its step time. Its window's
// per-stage figures (PipelineStageStats: forward-backward busy time and
// update) over what the planner predicts for the running split without
// corrections give each layer a factor, its stage's, on its compute and on
// its update; the current split is timed again with them (a
// re-calibration), and the partition is solved again from them: a split
// predicted at least 5% faster is switched to, as a new placement is
// (PipelineCorrections, node/placement.h).
//
// Thread-compatible: a PlanLoop is driven by the job's training thread.
#ifndef TANDEM_NODE_CLOSED_LOOP_H_
#define TANDEM_NODE_CLOSED_LOOP_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "node/placement.h"
#include "planner/simulator.h"
#include "runtime/model/model.h"
#include "runtime/profile/profile_cache.h"
#include "runtime/train/trainer.h"
#include "tandem/v1/job.pb.h"
#include "tandem/v1/plan.pb.h"
#include "tandem/v1/profile.pb.h"

namespace tandem::node {

struct PlanLoopOptions {
  // Off by more than this fraction of the predicted step: re-plan. Negative:
  // compare once, never re-plan. 0 takes kDefaultReplanThreshold.
  double threshold = 0;
  // Steps skipped after the start and after each decision (one-time set-up,
  // first-touch pages), then steps in the window compared.
  int warmup_steps = 3;
  int window_steps = 5;
  // Re-plans per run, re-calibrations included.
  int max_replans = 3;
};

// One window of steps against the plan's prediction.
struct PlanCheck {
  double predicted_step_seconds = 0;
  // Median wall time of the window's steps.
  double measured_step_seconds = 0;
  struct Resource {
    tandem::v1::TimelineResource resource = tandem::v1::TIMELINE_RESOURCE_UNSPECIFIED;
    // Busy seconds per step.
    double predicted_seconds = 0;
    double measured_seconds = 0;
  };
  std::vector<Resource> resources;
  // UNSPECIFIED when within the threshold.
  tandem::v1::ReplanReason off = tandem::v1::REPLAN_REASON_UNSPECIFIED;
  // "step time 659 ms measured, 764 ms predicted (-13.7%)".
  std::string because;
};

// Compares `timelines` (measured steps of `plan`) and their wall times with
// the plan's prediction and its predicted timeline.
// `dispatch_seconds`: per resource, the dispatch time the plan's prediction
// charges to each call (PlanLoop::Decision), idle rather than busy when
// measured.
// Per compute resource, the idle time per call the `measured` steps show
// between their spans beyond what `simulated` (the running plan re-timed
// with their figures) has; only where it is more.
std::map<tandem::v1::TimelineResource, double> DispatchSeconds(
    const std::vector<tandem::v1::Timeline>& measured, const tandem::v1::Timeline& simulated);
// `dispatch` added to every forward and backward (and the accelerator's
// updates) of `profile`'s devices, and said in its provenance.
void AddDispatch(const std::map<tandem::v1::TimelineResource, double>& dispatch,
                 tandem::v1::Profile& profile);
// The per-call dispatch a plan's prediction charges (PlanPrediction's
// accelerator_ and host_dispatch_seconds), by compute resource; and back.
std::map<tandem::v1::TimelineResource, double> DispatchOf(
    const tandem::v1::PlanPrediction& prediction);
void SetDispatch(const std::map<tandem::v1::TimelineResource, double>& dispatch,
                 tandem::v1::PlanPrediction* prediction);

PlanCheck CheckPlan(const tandem::v1::Plan& plan, const std::vector<double>& step_seconds,
                    const std::vector<tandem::v1::Timeline>& timelines, double threshold,
                    const std::map<tandem::v1::TimelineResource, double>& dispatch_seconds = {});

// The layer profile of `model` on this node from the measured timelines of
// `plan`'s steps, for the planner (planner/cost_model.h's measured source):
// per layer and device, the median forward, backward and update span at the
// plan's micro-batch (each phase's TimingStats; the planner adds up the
// means, provenance.planning_statistic = MEAN, since a step takes the sum of
// its calls); per link, bandwidth and latency fitted to the copies.
// A phase the plan never ran on a device (a layer computed only on the
// accelerator has no host timing) takes the roofline of NodeHardware scaled
// by what the measured phases of that device took over their roofline; a
// link with no copies keeps NodeHardware's figure. `summary` (may be null)
// says which figures were measured. FAILED_PRECONDITION when the timelines
// hold no compute span.
absl::StatusOr<tandem::v1::Profile> MeasuredLayerProfile(
    const Model& model, const tandem::v1::JobSpec& resolved, const NodeOffer& node,
    const tandem::v1::Plan& plan, const std::vector<tandem::v1::Timeline>& timelines,
    std::string* summary);

// Whether two plans place every layer alike (compute, weights, update,
// activations) with the same micro-batch, strategy and update mode: if so the
// executor would run the same program.
bool SamePlacement(const tandem::v1::Plan& a, const tandem::v1::Plan& b);

// Measured layer profiles kept under a directory, keyed by the model's
// fingerprint, batch, ranks and threads, optimizer, the job's accelerator and
// link cap, and the node profile's hardware fingerprint: a job of the same
// model on the same node is planned from it at submission. A distributed
// job's is one rank's (rank 0 measured it, for its share of the batch): the
// next such job's rank plan is solved from it. A file that does not parse, or
// whose key or layers do not match, is ignored with a line on stderr.
class LayerProfileCache {
 public:
  // Empty `dir`: caches nothing.
  explicit LayerProfileCache(std::string dir) : files_(std::move(dir)) {}
  // The key of `resolved`'s model on `node`; empty when the node has no
  // profile (nothing to tie the figures to).
  static std::string Key(const Model& model, const tandem::v1::JobSpec& resolved,
                         const NodeOffer& node);
  std::optional<tandem::v1::Profile> Load(const Model& model, const tandem::v1::JobSpec& resolved,
                                          const NodeOffer& node) const;
  absl::Status Store(const Model& model, const tandem::v1::JobSpec& resolved, const NodeOffer& node,
                     tandem::v1::Profile profile) const;
  std::string PathOf(const std::string& key) const;

 private:
  // The files, as the model profiles' cache keeps them (<key>.profile.pb).
  profile::ProfileCache files_;
};

// A distributed job's gradient collectives as the NETWORK spans of
// `timelines` (rank 0's steps) measured them: per kind, latency + bytes /
// bandwidth fitted over its calls. FAILED_PRECONDITION when none was
// measured.
absl::StatusOr<tandem::v1::CollectiveProfile> FitCollectives(
    const std::vector<tandem::v1::Timeline>& timelines);
// Each collective's seconds under `profile`'s fits, for
// planner::SimulationOptions::collective_seconds: a kind never measured takes
// half an all-reduce's (one of its two phases), an all-reduce never measured
// twice a phase's, and with none 0.
std::function<double(schedule::OpKind, int64_t)> CollectiveSeconds(
    const tandem::v1::CollectiveProfile& profile);
// How one of `resolved`'s ranks is simulated with `profile`'s collectives:
// its ranks, gradient buckets and sharding (planner::SimulationOptions).
planner::SimulationOptions RankSimulation(const tandem::v1::JobSpec& resolved,
                                          const tandem::v1::CollectiveProfile& profile);
// "4 ALL_REDUCE at 2.00 GB/s + 100 us, ...".
std::string DescribeCollectives(const tandem::v1::CollectiveProfile& profile);

// The collectives the latest distributed job of as many ranks measured on
// this node, kept under a directory (<key>.collectives.pb), keyed by the
// ranks, the nodes the spec asks for (distributed.nodes, often none), the
// backend, the job's accelerator, threads per rank, link cap and throttle,
// and the node profile's hardware fingerprint: the next such job is
// predicted with them at submission. Which peers the ranks ran on is not
// part of the key: the figures are this node's latest, whatever the peers. A
// file that does not parse, was stored under another key or holds a fit of
// another kind or without a rate is a miss.
class CollectiveProfileCache {
 public:
  // Empty `dir`: caches nothing.
  explicit CollectiveProfileCache(std::string dir) : dir_(std::move(dir)) {}
  // Empty when the node has no profile or the job one rank.
  static std::string Key(const tandem::v1::JobSpec& resolved, const NodeOffer& node);
  std::optional<tandem::v1::CollectiveProfile> Load(const tandem::v1::JobSpec& resolved,
                                                    const NodeOffer& node) const;
  absl::Status Store(const tandem::v1::JobSpec& resolved, const NodeOffer& node,
                     tandem::v1::CollectiveProfile profile) const;

 private:
  std::string dir_;
};

// What pipeline jobs' stages measured (PlanLoop's corrections of a pipeline,
// ReplanPipeline), kept under a directory (<key>.corrections.pb), keyed by
// the model's fingerprint, batch, threads, stages, schedule (continuous,
// vertical sync), micro-batches and micro-batch size, strategy, optimizer,
// precision, the job's accelerator, its capacity and link cap, the node's
// link throttle, fingerprint and peer link, and the cost source the factors
// are over (`base`: the cached layer profile the job was planned from, or
// none): the
// next pipeline of the same model here is planned with them at submission. A
// file that does not parse, was stored under another key or does not fit
// the model is a miss. An auto_stages job (whose stages are chosen at
// submission) is not planned from them.
class PipelineCorrectionCache {
 public:
  // Empty `dir`: caches nothing.
  explicit PipelineCorrectionCache(std::string dir) : dir_(std::move(dir)) {}
  // Empty when the node has no profile or the job no pipeline of 2 stages or
  // more.
  static std::string Key(const Model& model, const tandem::v1::JobSpec& resolved,
                         const NodeOffer& node, const tandem::v1::Profile* base);
  std::optional<tandem::v1::PipelineCorrectionProfile> Load(const Model& model,
                                                            const tandem::v1::JobSpec& resolved,
                                                            const NodeOffer& node,
                                                            const tandem::v1::Profile* base) const;
  absl::Status Store(const Model& model, const tandem::v1::JobSpec& resolved, const NodeOffer& node,
                     const tandem::v1::Profile* base,
                     tandem::v1::PipelineCorrectionProfile profile) const;
  // Removes what Store kept under that key (a split they chose measured
  // slower than the one before it).
  void Forget(const Model& model, const tandem::v1::JobSpec& resolved, const NodeOffer& node,
              const tandem::v1::Profile* base) const;

 private:
  std::string dir_;
};

// `profile`'s factors as PipelineCorrections (a partition solved with them).
PipelineCorrections CorrectionsOf(const tandem::v1::PipelineCorrectionProfile& profile);
// And back: `corrections`' factors (not its stages) as a profile to keep.
tandem::v1::PipelineCorrectionProfile CorrectionProfileOf(const PipelineCorrections& corrections);

class PlanLoop {
 public:
  // `plan` is the plan the job starts under; `forced` plans (placement.plan)
  // are compared, never replaced.
  PlanLoop(const Model& model, tandem::v1::JobSpec resolved, NodeOffer node, tandem::v1::Plan plan,
           PlanLoopOptions options);

  struct Decision {
    // The plan to run from now on, its prediction from measured figures.
    tandem::v1::Plan plan;
    bool placement_changed = false;
    tandem::v1::ReplanReason reason = tandem::v1::REPLAN_REASON_UNSPECIFIED;
    std::string because;
    // The replaced plan's window.
    PlanCheck check;
    // What plan's prediction came from, and the profile (to cache).
    std::string cost_source;
    std::optional<tandem::v1::Profile> measured_profile;
    // Per compute resource, the idle time per call the executor measured
    // beyond the simulator's (a worker woken, a span handed over), charged
    // to every call of `plan`'s prediction.
    std::map<tandem::v1::TimelineResource, double> dispatch_seconds;
    // The plan it replaces, re-timed with the same figures: what a switch
    // back returns to.
    std::optional<tandem::v1::Plan> replaced_timed;
    // A new placement's step program, lowered when the runner switches to it
    // (AttachPlanLoop); empty for a re-calibration.
    tandem::v1::Schedule program;
    // A pipeline's corrections `plan` was timed with.
    std::optional<PipelineCorrections> corrections;
  };
  struct Outcome {
    std::optional<PlanCheck> check;  // a window just closed
    std::optional<Decision> decision;
    std::string log;  // a line for the job's log ("" none)
    // A distributed job's window: its collectives as rank 0 measured them.
    std::optional<tandem::v1::CollectiveProfile> collectives;
  };
  // After each step: its wall time and the runner's latest measured timeline
  // (a pipeline's: its stages' figures instead).
  Outcome AfterStep(double step_seconds, const tandem::v1::Timeline& timeline,
                    const std::vector<tandem::v1::PipelineStageStats>& stages = {});
  // The layer profile a pipeline is timed and solved again from, with its
  // corrections (nullopt: the analytic one).
  void set_planned_from(std::optional<tandem::v1::Profile> profile) {
    planned_from_ = std::move(profile);
  }
  bool pipeline() const { return plan_.pipeline_size() > 1; }
  const std::optional<tandem::v1::Profile>& planned_from() const { return planned_from_; }
  // A pipeline re-planned from its stages' figures (Decision::corrections),
  // once kSettledCorrectionSteps steps after their warm-up have run under the
  // plan they gave: those factors scaled alike by the steps' median over the
  // plan's prediction (`ratio`), so that a first window's transients do not
  // outlive it, and (`source`) what they were measured from. Once per
  // adopted decision; nullopt before, and after.
  std::optional<PipelineCorrections> TakeSettledCorrections(double* ratio = nullptr,
                                                            std::string* source = nullptr);
  // The job now runs decision.plan (switched, or re-calibrated in place).
  void Adopt(const Decision& decision);
  // The switch to decision.plan failed: the job goes on under the plan it had.
  void SwitchFailed();
  bool done() const { return done_; }
  // Median wall time of the steps run under plan() after its warm-up, the
  // checked windows' and every later one's (0 before the first), and how
  // many: the plan's measured step time over its life, not one window's.
  double plan_measured_seconds() const;
  int plan_measured_steps() const { return static_cast<int>(plan_seconds_.size()); }
  // Whether the next step belongs to a window (AfterStep keeps its timeline).
  bool InWindow() const { return !done_ && steps_ >= options_.warmup_steps; }
  const tandem::v1::Plan& plan() const { return plan_; }
  const Model& model() const { return model_; }
  const tandem::v1::JobSpec& resolved_spec() const { return resolved_; }
  const NodeOffer& node() const { return node_; }
  // `plan`'s step program for this job (Job.schedule).
  absl::StatusOr<tandem::v1::Schedule> ProgramOf(const tandem::v1::Plan& plan) const;

 private:
  Outcome Decide(const PlanCheck& check);
  // Back to the plan before the latest switch, which measured faster.
  Decision SwitchBack(const PlanCheck& check) const;
  // Why the loop will not re-plan now ("" when it may).
  std::string WhyNotReplan() const;
  // The window's measured figures, the running plan re-timed with them, and
  // the strategy solved again from them.
  absl::StatusOr<Decision> Replan(const PlanCheck& check) const;
  // Replan for a pipeline: from the window's stage figures.
  absl::StatusOr<Decision> ReplanPipeline(const PlanCheck& check) const;
  // A distributed job's rank plan, its placement kept (every rank runs it):
  // re-timed from the window's measured spans as one of the job's ranks runs
  // it (SimulationOptions: its buckets' collectives at the rate rank 0's
  // NETWORK spans measured, its partitioned host updates).
  absl::StatusOr<Decision> RetimeRank(const PlanCheck& check) const;
  bool distributed() const { return resolved_.distributed().replicas() > 1; }
  // `plan` as it is, its prediction and timeline simulated from `measured`.
  absl::StatusOr<tandem::v1::Plan> Resimulate(const tandem::v1::Plan& plan,
                                              const tandem::v1::Profile& measured,
                                              const planner::SimulationOptions& options = {}) const;

  const Model& model_;
  tandem::v1::JobSpec resolved_;
  NodeOffer node_;
  tandem::v1::Plan plan_;
  PlanLoopOptions options_;
  bool forced_ = false;
  bool done_ = false;
  int steps_ = 0;
  int replans_ = 0;
  bool recalibrated_ = false;
  std::vector<double> window_seconds_;
  std::vector<tandem::v1::Timeline> window_timelines_;
  std::vector<std::vector<tandem::v1::PipelineStageStats>> window_stages_;
  std::optional<tandem::v1::Profile> planned_from_;
  // The seconds of plan_'s steps after its warm-up (the first 256).
  std::vector<double> plan_seconds_;
  // The closing window's collectives, as FitCollectives fitted them.
  absl::StatusOr<tandem::v1::CollectiveProfile> window_collectives_ =
      absl::FailedPreconditionError("no window has closed");
  // The corrections the running plan was solved or re-timed with, what they
  // came from, and whether TakeSettledCorrections has given them.
  std::optional<PipelineCorrections> corrections_;
  std::string corrections_source_;
  bool settled_taken_ = false;
  // The plan before the latest switch and its measured step.
  std::map<tandem::v1::TimelineResource, double> dispatch_;
  std::optional<tandem::v1::Plan> previous_;
  double previous_measured_ = 0;
  // Per strategy, the fastest step measured under a plan of it in this run
  // (a window's median). A re-plan does not switch to a strategy that has
  // already run here no faster than the running plan measures: predictions
  // miss what the node does to a strategy (an emulated accelerator and the
  // host sharing two cores under hetero_dp), measurements do not.
  std::map<tandem::v1::Strategy, double> measured_strategies_;
};

// What the owner of a loop is told (each may be null): every closed window,
// every line for the job's log, and every decision the job now runs under
// (after its switch, for a new placement) with the step it took effect at.
// Steps under a corrected pipeline plan, after its warm-up, before its
// corrections are kept as settled (PlanLoopHooks::settled_corrections).
inline constexpr int kSettledCorrectionSteps = 16;

struct PlanLoopHooks {
  std::function<void(const PlanCheck&)> checked;
  // After the loop has settled (done): the running plan's
  // measured step time over its life so far (plan_measured_seconds), after
  // every step.
  std::function<void(double seconds, int steps)> measured;
  std::function<void(const std::string&)> log;
  std::function<void(const PlanLoop::Decision&, int64_t step)> adopted;
  // A pipeline's plan, solved or re-timed with its stages' corrections, has
  // run kSettledCorrectionSteps steps after its warm-up (the loop done):
  // PlanLoop::TakeSettledCorrections.
  std::function<void(const PipelineCorrections&, double ratio, const std::string& source)>
      settled_corrections;
  // A distributed job's window measured its collectives (Outcome::collectives).
  std::function<void(const tandem::v1::CollectiveProfile&)> collectives;
};

// Feeds `loop` from `callbacks`' after_step and switches the trainer to a
// decision's new placement at the next step boundary (switch_runner,
// on_switch); a callback already in after_step is still called first.
void AttachPlanLoop(std::shared_ptr<PlanLoop> loop, PlanLoopHooks hooks,
                    TrainerCallbacks& callbacks);

}  // namespace tandem::node

#endif  // TANDEM_NODE_CLOSED_LOOP_H_
