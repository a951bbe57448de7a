#include "planner/scale_out.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "planner/simulator.h"

namespace tandem::planner {
namespace {

using tandem::v1::Plan;
using tandem::v1::ScaleOutPlan;

// One ring phase (a reduce-scatter or an all-gather) of `bytes` among `n`
// members over `link`.
double RingPhase(const tandem::v1::LinkSpec& link, int n, double bytes) {
  if (n <= 1 || bytes <= 0) return 0;
  return (n - 1.0) / n * bytes / link.bandwidth_bytes_per_second() +
         (n - 1.0) * link.latency_seconds();
}

int64_t ParameterCount(const tandem::v1::Profile& profile) {
  int64_t p = 0;
  for (const auto& l : profile.layers()) p += l.parameter_count();
  return p;
}

// The rank's best plan for `host_bytes` of host memory, solved as one
// device's: with optimizer state streamed in where `stream` (and the request
// allows it), else with the two-place search alone. Which is faster as a
// rank depends on what one device's solve does not see: partitioned host
// updates take 1/N of the time, and the collectives' share of the links.
absl::StatusOr<Plan> RankPlan(PlanRequest request, int64_t host_bytes, bool stream) {
  request.host_memory_bytes = host_bytes;
  request.pipeline_devices = 1;
  request.pipeline_auto = false;
  request.stream_optimizer_state = request.stream_optimizer_state && stream;
  TANDEM_ASSIGN_OR_RETURN(const tandem::v1::PlanModelResponse r, SolvePlan(request));
  return r.plan();
}

// Of two predictions of one sharding, the one that fits, else the faster.
ScaleOutPlan Faster(ScaleOutPlan a, ScaleOutPlan b) {
  return SecondRankPlanWins(a.feasible(), a.step_seconds(), b.feasible(), b.step_seconds()) ? b : a;
}

// One node count's prediction under `sharding` with the rank's `plan`: the
// plan's step as each rank's executor runs it (schedule/lower.h,
// DATA-PARALLEL RANKS: buckets reduced on the NETWORK stream as backward
// finishes them; partitioned, the host's reduce-scattered, updated in pieces
// and all-gathered), timed by the simulator with each collective at the
// hierarchical ring formula's seconds, and again with the collectives free.
absl::StatusOr<ScaleOutPlan> Predict(const ScaleOutRequest& request, const PlanSimulator& simulator,
                                     const Plan& plan, int nodes, int accelerators,
                                     tandem::v1::OptimizerSharding sharding) {
  ScaleOutPlan s;
  s.set_nodes(nodes);
  s.set_ranks(nodes * accelerators);
  s.set_sharding(sharding);
  s.set_feasible(plan.feasible());
  s.set_note(plan.solver().note());
  s.set_compute_seconds(plan.prediction().iteration_seconds());
  s.set_step_seconds(s.compute_seconds());
  Plan kept = plan;
  kept.clear_timeline();
  *s.mutable_rank_plan() = std::move(kept);
  if (!plan.feasible() || s.ranks() == 1) return s;
  const tandem::v1::HardwareSpec& hw = *request.rank.hardware;
  SimulationOptions ranks;
  ranks.ranks = s.ranks();
  ranks.bucket_bytes = request.bucket_bytes;
  ranks.partition_host_state = sharding == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED;
  ranks.collective_seconds = [&hw, nodes, accelerators](schedule::OpKind kind, int64_t bytes) {
    const double all_reduce = AllReduceSeconds(hw, nodes, accelerators, static_cast<double>(bytes));
    // A reduce-scatter or an all-gather is one of the all-reduce's two phases.
    return kind == schedule::OpKind::kAllReduce ? all_reduce : all_reduce / 2;
  };
  absl::StatusOr<SimulationResult> simulated = simulator.Simulate(plan, ranks);
  SimulationOptions free = ranks;
  free.record_timeline = false;
  free.collective_seconds = [](schedule::OpKind, int64_t) { return 0.0; };
  absl::StatusOr<SimulationResult> unconnected = simulator.Simulate(plan, free);
  // A plan no rank runs (hetero_dp's two replicas, say) is no rank plan.
  for (const absl::Status& status : {simulated.status(), unconnected.status()}) {
    if (status.code() == absl::StatusCode::kCancelled) return status;
    if (!status.ok()) {
      s.set_feasible(false);
      s.set_note(absl::StrCat("a rank cannot run this plan: ", status.message()));
      return s;
    }
  }
  const SimulationResult& with = *simulated;
  const SimulationResult& without = *unconnected;
  // A rank holds its accelerator's gradients until its buckets are summed.
  const int64_t budget = plan.accelerator_memory_budget_bytes();
  if (budget > 0 && with.prediction.accelerator_peak_bytes() > budget) {
    s.set_feasible(false);
    s.set_note(absl::StrCat("as a rank its accelerator peaks at ",
                            with.prediction.accelerator_peak_bytes(), " bytes, over its budget of ",
                            budget));
  }
  for (const tandem::v1::TimelineSpan& span : with.timeline.spans()) {
    const double seconds = span.end_seconds() - span.start_seconds();
    if (span.phase() == tandem::v1::TIMELINE_PHASE_ALL_GATHER) {
      s.set_gather_seconds(s.gather_seconds() + seconds);
    } else if (span.phase() == tandem::v1::TIMELINE_PHASE_ALL_REDUCE ||
               span.phase() == tandem::v1::TIMELINE_PHASE_REDUCE_SCATTER) {
      s.set_gradient_seconds(s.gradient_seconds() + seconds);
    }
  }
  const double step = with.prediction.iteration_seconds();
  const double alone = without.prediction.iteration_seconds();
  s.set_exposed_seconds(step - alone);
  s.set_update_saved_seconds(s.compute_seconds() - alone);
  s.set_step_seconds(step);
  return s;
}

// Replicated or partitioned, as asked or (AUTO) whichever fits and is faster,
// with the reason.
ScaleOutPlan Choose(tandem::v1::OptimizerSharding asked, int ranks, ScaleOutPlan rep,
                    ScaleOutPlan par) {
  ScaleOutPlan chosen;
  if (asked == tandem::v1::OPTIMIZER_SHARDING_REPLICATED || ranks == 1) {
    chosen = rep;
    chosen.set_reason(ranks == 1 ? "one rank: nothing to reduce" : "asked for");
  } else if (asked == tandem::v1::OPTIMIZER_SHARDING_PARTITIONED) {
    chosen = par;
    chosen.set_reason("asked for");
  } else if (!rep.feasible() && par.feasible()) {
    chosen = par;
    chosen.set_reason(absl::StrCat("replicated does not fit a rank (", rep.note(),
                                   "); partitioned keeps 1/", ranks,
                                   " of the host-updated layers' optimizer state"));
  } else if (rep.feasible() && par.feasible() && par.step_seconds() < rep.step_seconds()) {
    chosen = par;
    chosen.set_reason(absl::StrCat(
        "faster: a step of ", par.step_seconds(), " s against ", rep.step_seconds(),
        " s replicated (its reduce-scatters and all-gathers (", par.gather_seconds(),
        " s of them) leave ", par.exposed_seconds(), " s exposed against the all-reduces' ",
        rep.exposed_seconds(), " s; updating 1/", ranks,
        " of the host's weights, its step "
        "without them is ",
        par.compute_seconds() - par.update_saved_seconds(), " s against ",
        rep.compute_seconds() - rep.update_saved_seconds(), " s)"));
  } else {
    chosen = rep;
    chosen.set_reason(rep.feasible()
                          ? absl::StrCat("fits, and partitioning is not faster (a step of ",
                                         par.step_seconds(), " s against ", rep.step_seconds(),
                                         " s: its all-gathers take ", par.gather_seconds(),
                                         " s, and its collectives leave ", par.exposed_seconds(),
                                         " s exposed against ", rep.exposed_seconds(), " s)")
                          : "neither fits a rank");
  }
  return chosen;
}

}  // namespace

double AllReduceSeconds(const tandem::v1::HardwareSpec& hardware, int nodes, int accelerators,
                        double bytes) {
  const double within = 2 * RingPhase(hardware.accelerator_to_accelerator(), accelerators, bytes);
  const double across = 2 * RingPhase(hardware.network(), nodes, bytes / std::max(1, accelerators));
  return within + across;
}

namespace {

// A link the ring formula reads: a finite rate > 0 and a finite latency >= 0.
absl::Status CheckLink(const tandem::v1::HardwareSpec& hw, const tandem::v1::LinkSpec& link,
                       const char* field) {
  if (!(link.bandwidth_bytes_per_second() > 0) ||
      !std::isfinite(link.bandwidth_bytes_per_second())) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware.", field, ".bandwidth_bytes_per_second: ", hw.name(),
                     link.bandwidth_bytes_per_second() == 0 ? " says nothing of it"
                                                            : " gives no finite rate > 0"));
  }
  if (!(link.latency_seconds() >= 0) || !std::isfinite(link.latency_seconds())) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware.", field, ".latency_seconds: must be a finite number >= 0"));
  }
  return absl::OkStatus();
}

// What PlanScaleOut can plan: a bounded list of node counts, links its
// formula can read, and global batches the int32 field holds. `g`: the
// node's accelerators; `node_batch`: a node's batch.
absl::Status CheckScaleOutRequest(const ScaleOutRequest& request, int g, int node_batch) {
  const tandem::v1::HardwareSpec& hw = *request.rank.hardware;
  // Each entry is a plan of its own.
  constexpr size_t kMaxNodeCounts = 64;
  if (request.nodes.size() > kMaxNodeCounts) {
    return absl::InvalidArgumentError(absl::StrCat("nodes: at most ", kMaxNodeCounts,
                                                   " node counts, got ", request.nodes.size()));
  }
  if (g > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("hardware.accelerators: at most 1024 a node, got ", g));
  }
  if (g > 1) {
    TANDEM_RETURN_IF_ERROR(
        CheckLink(hw, hw.accelerator_to_accelerator(), "accelerator_to_accelerator"));
  }
  for (int n : request.nodes) {
    if (n < 1 || n > 65536) return absl::InvalidArgumentError("nodes: each must be in [1, 65536]");
    if (n > 1) TANDEM_RETURN_IF_ERROR(CheckLink(hw, hw.network(), "network"));
    if (int64_t{std::max(1, node_batch / g)} * g * n > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("nodes: ", n, " nodes of ", g, " accelerators at batch ", node_batch,
                       " a node is a global batch past 2^31 samples"));
    }
  }
  return absl::OkStatus();
}

// One rank's request for a node of `g` accelerators: its share of the node's
// batch, and of its host (each rank plans with 1/G of its cores, compute
// rates and memory bandwidth).
PlanRequest RankRequestOf(const ScaleOutRequest& request, int g, int node_batch) {
  PlanRequest rank = request.rank;
  rank.batch_size = std::max(1, node_batch / g);
  tandem::v1::ProcessorSpec* h = rank.hardware->mutable_host();
  h->set_threads(std::max(1, h->threads() / g));
  h->set_peak_matmul_flops_per_second(h->peak_matmul_flops_per_second() / g);
  h->set_peak_vector_flops_per_second(h->peak_vector_flops_per_second() / g);
  h->set_peak_bf16_matmul_flops_per_second(h->peak_bf16_matmul_flops_per_second() / g);
  h->set_peak_fp16_matmul_flops_per_second(h->peak_fp16_matmul_flops_per_second() / g);
  h->set_memory_bandwidth_bytes_per_second(h->memory_bandwidth_bytes_per_second() / g);
  if (rank.micro_batch_size > 0 && rank.batch_size % rank.micro_batch_size != 0) {
    rank.micro_batch_size = 0;
  }
  return rank;
}

// The rows of one request: per node count, replicated and partitioned each
// predicted with the faster of the rank's plans (with and without streamed
// optimizer state), and the sharding chosen between them.
class ScaleOutRows {
 public:
  ScaleOutRows(const ScaleOutRequest& request, int g, PlanRequest rank, const CostModel& cost)
      : request_(request),
        g_(g),
        rank_(std::move(rank)),
        simulator_(cost, rank_.stop),
        host_((request.rank.host_memory_bytes > 0 ? request.rank.host_memory_bytes
                                                  : request.rank.hardware->host().memory_bytes()) /
              g),
        state_bytes_(static_cast<double>(ParameterCount(rank_.profile)) *
                     (rank_.profile.optimizer_state_per_parameter() +
                      (request.gradient_bytes_per_element < 4 ? 1 : 0)) *
                     4.0) {}

  // The row for `nodes` nodes.
  absl::StatusOr<ScaleOutPlan> Row(int nodes) {
    const int ranks = nodes * g_;
    TANDEM_ASSIGN_OR_RETURN(ScaleOutPlan rep,
                            Sharded(host_, nodes, tandem::v1::OPTIMIZER_SHARDING_REPLICATED, true));
    // Partitioned, the host holds 1/ranks of the optimizer state: where the
    // two-place plan does not fit, it may keep more there.
    TANDEM_ASSIGN_OR_RETURN(const Plan* at_host, PlanFor(host_, false));
    const bool more = !at_host->feasible() && ranks > 1;
    const int64_t partitioned_host =
        more ? host_ + static_cast<int64_t>(state_bytes_ * (1.0 - 1.0 / ranks)) : host_;
    TANDEM_ASSIGN_OR_RETURN(
        ScaleOutPlan par,
        Sharded(partitioned_host, nodes, tandem::v1::OPTIMIZER_SHARDING_PARTITIONED, !more));
    ScaleOutPlan chosen = Choose(request_.sharding, ranks, std::move(rep), std::move(par));
    chosen.set_rank_batch_size(rank_.batch_size);
    chosen.set_global_batch_size(rank_.batch_size * ranks);
    if (chosen.step_seconds() > 0) {
      chosen.set_samples_per_second(chosen.global_batch_size() / chosen.step_seconds());
    }
    return chosen;
  }

 private:
  // The rank plan for `host_bytes` of host memory, streaming state or not,
  // solved once.
  absl::StatusOr<const Plan*> PlanFor(int64_t host_bytes, bool stream) {
    auto it = solved_.find({host_bytes, stream});
    if (it == solved_.end()) {
      TANDEM_ASSIGN_OR_RETURN(Plan p, RankPlan(rank_, host_bytes, stream));
      it = solved_.emplace(std::pair{host_bytes, stream}, std::move(p)).first;
    }
    return &it->second;
  }

  // `sharding`'s prediction on `nodes` nodes with the faster of the rank's
  // plans; with `stream` false, the two-place plan alone (a partitioned
  // rank's extra host room holds pieces of host-updated state, not a
  // streamed layer's whole state).
  absl::StatusOr<ScaleOutPlan> Sharded(int64_t host_bytes, int nodes,
                                       tandem::v1::OptimizerSharding sharding, bool stream) {
    TANDEM_ASSIGN_OR_RETURN(const Plan* two_place, PlanFor(host_bytes, false));
    TANDEM_ASSIGN_OR_RETURN(ScaleOutPlan best,
                            Predict(request_, simulator_, *two_place, nodes, g_, sharding));
    if (!stream || !rank_.stream_optimizer_state) return best;
    TANDEM_ASSIGN_OR_RETURN(const Plan* streaming, PlanFor(host_bytes, true));
    TANDEM_ASSIGN_OR_RETURN(ScaleOutPlan other,
                            Predict(request_, simulator_, *streaming, nodes, g_, sharding));
    return Faster(std::move(best), std::move(other));
  }

  const ScaleOutRequest& request_;
  const int g_;
  const PlanRequest rank_;
  const PlanSimulator simulator_;
  const int64_t host_;
  const double state_bytes_;
  std::map<std::pair<int64_t, bool>, Plan> solved_;
};

}  // namespace

absl::StatusOr<std::vector<ScaleOutPlan>> PlanScaleOut(const ScaleOutRequest& request) {
  if (!request.rank.hardware) {
    return absl::InvalidArgumentError("hardware: a multi-node plan needs a hardware spec");
  }
  const int g = std::max(1, request.rank.hardware->accelerators_size());
  const int node_batch =
      request.rank.batch_size > 0 ? request.rank.batch_size : request.rank.profile.batch_size();
  TANDEM_RETURN_IF_ERROR(CheckScaleOutRequest(request, g, node_batch));
  PlanRequest rank = RankRequestOf(request, g, node_batch);
  TANDEM_ASSIGN_OR_RETURN(const CostModel cost, CostModelOf(rank));
  ScaleOutRows rows(request, g, std::move(rank), cost);
  TANDEM_ASSIGN_OR_RETURN(const ScaleOutPlan one_node, rows.Row(1));
  std::vector<ScaleOutPlan> out;
  for (int n : request.nodes) {
    TANDEM_ASSIGN_OR_RETURN(ScaleOutPlan s, n == 1 ? one_node : rows.Row(n));
    if (one_node.samples_per_second() > 0) {
      s.set_scaling_efficiency(s.samples_per_second() / (n * one_node.samples_per_second()));
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace tandem::planner
