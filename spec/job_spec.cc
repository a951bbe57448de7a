#include "spec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/json_quote.h"
#include "base/status_macros.h"
#include "base/work_counters.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace tandem {
namespace {

using tandem::v1::JobSpec;

absl::Status FieldError(const std::string& field, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", message));
}

template <typename T>
absl::Status InRange(const std::string& field, T value, T lo, T hi) {
  if (!(value >= lo && value <= hi)) {
    return FieldError(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", value));
  }
  return absl::OkStatus();
}

// A plain YAML scalar as JSON: numbers, true/false and null keep their type.
std::string PlainScalarToJson(const std::string& v) {
  const std::string lower = absl::AsciiStrToLower(v);
  if (lower == "true" || lower == "false") return lower;
  if (lower == "null" || v == "~" || v.empty()) return "null";
  double d;
  if (absl::SimpleAtod(v, &d) && std::isfinite(d) && !absl::StartsWith(lower, "0x") &&
      lower.find_first_not_of("0123456789+-.e") == std::string::npos) {
    return v;
  }
  return JsonQuote(v);
}

// Nesting a job file never needs: the deepest field path is under ten.
constexpr int kMaxYamlDepth = 64;
// What a job file may expand to through aliases: the 4 MiB it may be, and some.
constexpr size_t kMaxYamlExpansion = size_t{16} << 20;

// `node` as JSON. An alias inside the node it names (`a: &x {b: *x}`) is a
// cycle, and aliases of aliases expand exponentially: both are refused, by
// depth and by size, rather than recursing until the stack runs out (found by
// job_spec_fuzz).
absl::Status AppendJson(const YAML::Node& node, std::string* out, int depth = 0) {
  if (depth > kMaxYamlDepth) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nested more than ", kMaxYamlDepth, " levels deep (an alias inside what it names?)"));
  }
  if (out->size() > kMaxYamlExpansion) {
    return absl::InvalidArgumentError(
        absl::StrCat("expands to more than ", kMaxYamlExpansion >> 20, " MiB through aliases"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      *out += "null";
      return absl::OkStatus();
    case YAML::NodeType::Scalar:
      // Quoted scalars carry the "!" tag: they stay strings.
      *out += node.Tag() == "!" ? JsonQuote(node.Scalar()) : PlainScalarToJson(node.Scalar());
      return absl::OkStatus();
    case YAML::NodeType::Sequence: {
      *out += "[";
      bool first = true;
      for (const YAML::Node& item : node) {
        if (!first) *out += ",";
        first = false;
        TANDEM_RETURN_IF_ERROR(AppendJson(item, out, depth + 1));
      }
      *out += "]";
      return absl::OkStatus();
    }
    case YAML::NodeType::Map: {
      *out += "{";
      bool first = true;
      for (const auto& kv : node) {
        if (!first) *out += ",";
        first = false;
        *out += JsonQuote(kv.first.as<std::string>());
        *out += ":";
        TANDEM_RETURN_IF_ERROR(AppendJson(kv.second, out, depth + 1));
      }
      *out += "}";
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> YamlToJson(const std::string& yaml, const std::string& filename) {
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(filename, ": a job file must be a mapping"));
    }
    std::string json;
    if (const absl::Status s = AppendJson(root, &json); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(filename, ": ", s.message()));
    }
    return json;
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ":", e.mark.line + 1, ":", e.mark.column + 1, ": ", e.msg));
  }
}

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& text, const std::string& filename) {
  const std::string trimmed(absl::StripLeadingAsciiWhitespace(text));
  std::string json;
  if (absl::EndsWith(filename, ".json") || absl::StartsWith(trimmed, "{")) {
    json = text;
  } else {
    TANDEM_ASSIGN_OR_RETURN(json, YamlToJson(text, filename));
  }
  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(filename, ": not a valid JobSpec: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot open job file '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  if (ss.str().size() > (4 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": job files are at most 4 MiB"));
  }
  return ParseJobSpec(ss.str(), path);
}

namespace {

// The sections of ValidateJobSpec, checked in this order.
// A spec is stored twice in its job record (as given and resolved) and sent in
// GetJob replies under clients' default 4 MiB message limit.
constexpr size_t kMaxSpecBytes = size_t{1} << 20;

// The top-level field that makes a spec too large, for the error.
std::string LargestField(const JobSpec& spec) {
  const google::protobuf::Reflection* reflection = spec.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(spec, &fields);
  std::string largest = "spec";
  size_t most = 0;
  for (const google::protobuf::FieldDescriptor* f : fields) {
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE || f->is_repeated())
      continue;
    const size_t bytes = reflection->GetMessage(spec, f).ByteSizeLong();
    if (bytes > most) {
      most = bytes;
      largest = f->name();
    }
  }
  return largest;
}

absl::Status ValidateHeader(const JobSpec& spec) {
  if (spec.ByteSizeLong() > kMaxSpecBytes) {
    return FieldError(
        LargestField(spec),
        absl::StrCat("the spec is ", spec.ByteSizeLong(), " bytes serialized, at most ",
                     kMaxSpecBytes, " are accepted (a forced placement.plan needs no timeline)"));
  }
  if (spec.display_name().size() > 128) {
    return FieldError("display_name",
                      absl::StrCat("at most 128 characters, got ", spec.display_name().size()));
  }
  if (spec.labels_size() > 32) return FieldError("labels", "at most 32 entries");
  for (const auto& [k, v] : spec.labels()) {
    if (k.empty() || k.size() > 128)
      return FieldError("labels", "keys must have 1 to 128 characters");
    if (v.size() > 128)
      return FieldError(absl::StrCat("labels[", k, "]"), "at most 128 characters");
  }
  if (spec.model().model_case() == tandem::v1::ModelSpec::MODEL_NOT_SET) {
    return FieldError("model", "is required: set one of mlp, cnn, resnet, gpt, layers");
  }
  if (spec.data().source_case() == tandem::v1::DatasetSpec::SOURCE_NOT_SET) {
    return FieldError("data", "is required: set one of idx, text, synthetic");
  }
  return absl::OkStatus();
}

absl::Status ValidateOptimizer(const tandem::v1::OptimizerSpec& o) {
  if (!tandem::v1::OptimizerKind_IsValid(o.kind())) {
    return FieldError("optimizer.kind", absl::StrCat("unknown value ", o.kind()));
  }
  if (!tandem::v1::LearningRateSchedule_IsValid(o.schedule())) {
    return FieldError("optimizer.schedule", absl::StrCat("unknown value ", o.schedule()));
  }
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.learning_rate", o.learning_rate(), 0.0f, 10.0f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.momentum", o.momentum(), 0.0f, 0.999999f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.beta1", o.beta1(), 0.0f, 0.999999f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.beta2", o.beta2(), 0.0f, 0.999999f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.epsilon", o.epsilon(), 0.0f, 1.0f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.weight_decay", o.weight_decay(), 0.0f, 10.0f));
  TANDEM_RETURN_IF_ERROR(InRange("optimizer.max_grad_norm", o.max_grad_norm(), 0.0f, 1e9f));
  TANDEM_RETURN_IF_ERROR(
      InRange<int64_t>("optimizer.warmup_steps", o.warmup_steps(), 0, 1000000000));
  TANDEM_RETURN_IF_ERROR(
      InRange("optimizer.min_learning_rate", o.min_learning_rate(), 0.0f, 10.0f));
  return absl::OkStatus();
}

absl::Status ValidateTraining(const tandem::v1::TrainingSpec& t) {
  if (t.batch_size() == 0)
    return FieldError("training.batch_size", "is required (samples per step)");
  TANDEM_RETURN_IF_ERROR(InRange("training.batch_size", t.batch_size(), 1, 65536));
  switch (t.duration_case()) {
    case tandem::v1::TrainingSpec::kSteps:
      TANDEM_RETURN_IF_ERROR(InRange<int64_t>("training.steps", t.steps(), 1, 1000000000));
      break;
    case tandem::v1::TrainingSpec::kEpochs:
      TANDEM_RETURN_IF_ERROR(InRange("training.epochs", t.epochs(), 1, 100000));
      break;
    case tandem::v1::TrainingSpec::DURATION_NOT_SET:
      return FieldError("training", "set steps or epochs");
  }
  TANDEM_RETURN_IF_ERROR(
      InRange<int64_t>("training.eval_interval_steps", t.eval_interval_steps(), 0, 1000000000));
  TANDEM_RETURN_IF_ERROR(InRange<int64_t>("training.checkpoint_interval_steps",
                                          t.checkpoint_interval_steps(), 0, 1000000000));
  TANDEM_RETURN_IF_ERROR(
      InRange<int64_t>("training.log_interval_steps", t.log_interval_steps(), 0, 1000000000));
  TANDEM_RETURN_IF_ERROR(InRange("training.eval_batch_size", t.eval_batch_size(), 0, 65536));
  TANDEM_RETURN_IF_ERROR(InRange("training.threads", t.threads(), 0, 1024));
  const tandem::v1::LossScaling& ls = t.loss_scaling();
  if (ls.initial_scale() != 0) {
    TANDEM_RETURN_IF_ERROR(
        InRange("training.loss_scaling.initial_scale", ls.initial_scale(), 0x1p-24, 0x1p64));
  }
  TANDEM_RETURN_IF_ERROR(InRange<int64_t>("training.loss_scaling.growth_interval_steps",
                                          ls.growth_interval_steps(), 0, 1000000000));
  TANDEM_RETURN_IF_ERROR(InRange("training.loss_scaling.max_consecutive_skips",
                                 ls.max_consecutive_skips(), 0, 1000000));
  return absl::OkStatus();
}

absl::Status ValidatePipeline(const tandem::v1::PlacementSpec& p,
                              const tandem::v1::TrainingSpec& t) {
  const tandem::v1::PipelineSpec& pipe = p.pipeline();
  TANDEM_RETURN_IF_ERROR(
      InRange("placement.pipeline.stages", pipe.stages(), 0, kMaxPipelineStages));
  if (!tandem::v1::PipelineSchedule_IsValid(pipe.schedule())) {
    return FieldError("placement.pipeline.schedule",
                      absl::StrCat("unknown value ", pipe.schedule()));
  }
  TANDEM_RETURN_IF_ERROR(
      InRange("placement.pipeline.micro_batches", pipe.micro_batches(), 0, 65536));
  if (pipe.micro_batches() > 0 && t.batch_size() % pipe.micro_batches() != 0) {
    return FieldError("placement.pipeline.micro_batches",
                      absl::StrCat(pipe.micro_batches(), " does not divide training.batch_size ",
                                   t.batch_size()));
  }
  if (pipe.auto_stages() && pipe.stages() > 1) {
    return FieldError("placement.pipeline.auto_stages",
                      absl::StrCat("tandemd chooses the stages, and placement.pipeline.stages ",
                                   "asks for ", pipe.stages(), "; set one of them"));
  }
  if (pipe.vertical_sync() && pipe.schedule() != tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM) {
    return FieldError("placement.pipeline.vertical_sync",
                      "only PipeDream (placement.pipeline.schedule: PIPELINE_SCHEDULE_PIPEDREAM) "
                      "has stale weights to synchronise");
  }
  if (pipe.continuous() &&
      (pipe.schedule() != tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM || pipe.vertical_sync())) {
    return FieldError("placement.pipeline.continuous",
                      "only PipeDream (placement.pipeline.schedule: PIPELINE_SCHEDULE_PIPEDREAM) "
                      "without vertical_sync runs without draining between steps (GPipe and "
                      "1F1B update once per step, after the drain)");
  }
  if (pipe.stages() > 1 && pipe.micro_batches() > 0 && p.micro_batch_size() > 0 &&
      p.micro_batch_size() * pipe.micro_batches() != t.batch_size()) {
    return FieldError(
        "placement.pipeline.micro_batches",
        absl::StrCat(pipe.micro_batches(), " micro-batches of placement.", "micro_batch_size ",
                     p.micro_batch_size(), " are not training.batch_size ", t.batch_size()));
  }
  return absl::OkStatus();
}

absl::Status ValidatePlacement(const tandem::v1::PlacementSpec& p,
                               const tandem::v1::TrainingSpec& t) {
  if (!tandem::v1::Strategy_IsValid(p.strategy())) {
    return FieldError("placement.strategy", absl::StrCat("unknown value ", p.strategy()));
  }
  if (!tandem::v1::AcceleratorKind_IsValid(p.accelerator())) {
    return FieldError("placement.accelerator", absl::StrCat("unknown value ", p.accelerator()));
  }
  TANDEM_RETURN_IF_ERROR(InRange("placement.micro_batch_size", p.micro_batch_size(), 0, 65536));
  if (p.micro_batch_size() > 0 && t.batch_size() % p.micro_batch_size() != 0) {
    return FieldError("placement.micro_batch_size",
                      absl::StrCat(p.micro_batch_size(), " does not divide training.batch_size ",
                                   t.batch_size()));
  }
  TANDEM_RETURN_IF_ERROR(InRange("placement.replan_threshold", p.replan_threshold(), -1.0, 10.0));
  return ValidatePipeline(p, t);
}

absl::Status ValidateResources(const tandem::v1::ResourceSpec& r) {
  constexpr int64_t kMaxBytes = int64_t{1} << 50;
  TANDEM_RETURN_IF_ERROR(InRange<int64_t>("resources.accelerator_memory_bytes",
                                          r.accelerator_memory_bytes(), 0, kMaxBytes));
  TANDEM_RETURN_IF_ERROR(
      InRange<int64_t>("resources.host_memory_bytes", r.host_memory_bytes(), 0, kMaxBytes));
  TANDEM_RETURN_IF_ERROR(InRange("resources.emulated_link_bytes_per_second",
                                 r.emulated_link_bytes_per_second(), 0.0, 1e15));
  return absl::OkStatus();
}

absl::Status ValidateUpdates(const tandem::v1::UpdateSpec& u, const tandem::v1::TrainingSpec& t) {
  switch (u.rule_case()) {
    case tandem::v1::UpdateSpec::kHogwild:
      return InRange("updates.hogwild.workers", u.hogwild().workers(), 0, 64);
    case tandem::v1::UpdateSpec::kEasgd: {
      const auto& e = u.easgd();
      TANDEM_RETURN_IF_ERROR(InRange("updates.easgd.replicas", e.replicas(), 0, 64));
      if (e.has_alpha() && !(e.alpha() > 0 && e.alpha() < 1)) {
        return FieldError("updates.easgd.alpha",
                          absl::StrCat("must be in (0, 1) (the elasticity), got ", e.alpha()));
      }
      if (e.has_period())
        TANDEM_RETURN_IF_ERROR(InRange("updates.easgd.period", e.period(), 1, 1 << 20));
      return absl::OkStatus();
    }
    case tandem::v1::UpdateSpec::kSwa: {
      const auto& w = u.swa();
      TANDEM_RETURN_IF_ERROR(
          InRange<int64_t>("updates.swa.start_step", w.start_step(), 0, 1000000000));
      if (w.has_period()) {
        TANDEM_RETURN_IF_ERROR(InRange<int64_t>("updates.swa.period", w.period(), 1, 1000000000));
      }
      if (t.duration_case() == tandem::v1::TrainingSpec::kSteps && w.start_step() > t.steps()) {
        return FieldError(
            "updates.swa.start_step",
            absl::StrCat(w.start_step(), " is after the run's last step (training.steps ",
                         t.steps(), "): nothing would be averaged"));
      }
      return absl::OkStatus();
    }
    case tandem::v1::UpdateSpec::kParameterServer: {
      const auto& ps = u.parameter_server();
      if (ps.has_staleness()) {
        TANDEM_RETURN_IF_ERROR(
            InRange("updates.parameter_server.staleness", ps.staleness(), 0, 1024));
      }
      TANDEM_RETURN_IF_ERROR(InRange("updates.parameter_server.workers", ps.workers(), 0, 64));
      return InRange("updates.parameter_server.shards", ps.shards(), 0, 256);
    }
    case tandem::v1::UpdateSpec::kSynchronous:
    case tandem::v1::UpdateSpec::RULE_NOT_SET:
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Fills the rule's defaults; Hogwild and the parameter server run CPU workers.
absl::Status ResolveUpdates(JobSpec& r) {
  auto* u = r.mutable_updates();
  const bool cpu_workers = u->has_hogwild() || u->has_parameter_server();
  switch (u->rule_case()) {
    case tandem::v1::UpdateSpec::kHogwild:
      if (u->hogwild().workers() == 0) u->mutable_hogwild()->set_workers(2);
      break;
    case tandem::v1::UpdateSpec::kEasgd: {
      // Its replicas step on their own, and their results come back for
      // earlier batches: a skipped fp16 step would never reach the scaler.
      if (r.precision() == tandem::v1::PRECISION_FP16) {
        return FieldError("updates.easgd",
                          "its replicas do not run fp16 (loss scaling across replicas is not "
                          "built); set precision to BF16 or FP32");
      }
      auto* e = u->mutable_easgd();
      if (e->replicas() == 0) e->set_replicas(2);
      if (!e->has_alpha()) e->set_alpha(0.1f);
      if (!e->has_period()) e->set_period(4);
      break;
    }
    case tandem::v1::UpdateSpec::kSwa:
      // start_step 0 (75% of the run) is filled by the trainer, which knows
      // the run's length when it is given in epochs.
      if (!u->swa().has_period()) u->mutable_swa()->set_period(1);
      break;
    case tandem::v1::UpdateSpec::kParameterServer: {
      auto* ps = u->mutable_parameter_server();
      if (!ps->has_staleness()) ps->set_staleness(2);
      if (ps->workers() == 0) ps->set_workers(2);
      if (ps->shards() == 0) ps->set_shards(4);
      break;
    }
    case tandem::v1::UpdateSpec::kSynchronous:
      break;
    case tandem::v1::UpdateSpec::RULE_NOT_SET:
      u->mutable_synchronous();
      break;
  }
  if (!cpu_workers) return absl::OkStatus();
  auto* p = r.mutable_placement();
  const std::string rule = u->has_hogwild() ? "updates.hogwild" : "updates.parameter_server";
  if (p->strategy() == tandem::v1::STRATEGY_UNSPECIFIED ||
      p->strategy() == tandem::v1::STRATEGY_AUTO) {
    p->set_strategy(tandem::v1::STRATEGY_CPU_ONLY);
  } else if (p->strategy() != tandem::v1::STRATEGY_CPU_ONLY) {
    return FieldError(rule,
                      absl::StrCat("its workers run on the CPU engine; placement.strategy ",
                                   tandem::v1::Strategy_Name(p->strategy()),
                                   " cannot run them (use STRATEGY_CPU_ONLY or leave it out)"));
  }
  if (r.precision() == tandem::v1::PRECISION_BF16 || r.precision() == tandem::v1::PRECISION_FP16) {
    return FieldError(rule, "its workers run in fp32; set precision to FP32 or AUTO");
  }
  // Auto would be bf16 on a CPU that computes it natively; these workers
  // compute in fp32.
  r.set_precision(tandem::v1::PRECISION_FP32);
  return absl::OkStatus();
}

// A pipeline (placement.pipeline.stages > 1): each stage keeps its layers'
// weights, gradients, optimizer state and activations on its own
// accelerator, and the whole batch updates synchronously once per step.
absl::Status ResolvePipeline(JobSpec& r) {
  auto* p = r.mutable_placement();
  auto* pipe = p->mutable_pipeline();
  const bool choose = pipe->auto_stages();
  if (pipe->stages() <= 1 && !choose) return absl::OkStatus();
  // What a pipeline needs, checked alike when tandemd is to choose the stages.
  const std::string field = choose ? "placement.pipeline.auto_stages" : "placement.pipeline.stages";
  if (p->accelerator() == tandem::v1::ACCELERATOR_KIND_NONE) {
    return FieldError(field, "a pipeline runs on accelerators, and placement.accelerator is NONE");
  }
  // With auto_stages the one-accelerator candidate runs placement.strategy;
  // the stages are gpu_only whatever it is.
  if (!choose && (p->strategy() == tandem::v1::STRATEGY_UNSPECIFIED ||
                  p->strategy() == tandem::v1::STRATEGY_AUTO)) {
    p->set_strategy(tandem::v1::STRATEGY_GPU_ONLY);
  } else if (!choose && p->strategy() != tandem::v1::STRATEGY_GPU_ONLY) {
    return FieldError(
        field, absl::StrCat(
                   "each stage keeps its layers' state on its accelerator (STRATEGY_GPU_ONLY); "
                   "placement.strategy ",
                   tandem::v1::Strategy_Name(p->strategy()),
                   " within pipeline stages is not built (use STRATEGY_GPU_ONLY or leave it out)"));
  }
  if (p->delayed_parameter_update()) {
    return FieldError("placement.delayed_parameter_update",
                      "a pipeline updates on its stages' accelerators; there is no CPU update to "
                      "delay");
  }
  // bf16 on request: its stages' peaks stay within the plan plus the margin
  // (node/pipeline_test). fp16's loss scaling would need every stage's
  // overflow check before any stage updates, which is not built. Auto stays
  // fp32, so a pipeline asked for without a precision trains as before.
  if (r.precision() == tandem::v1::PRECISION_FP16) {
    return FieldError("precision",
                      absl::StrCat("a pipeline (", field,
                                   ") runs in fp32 or bf16: fp16's loss scaling across stages is "
                                   "not built; set precision to BF16, FP32 or AUTO"));
  }
  if (r.precision() != tandem::v1::PRECISION_BF16) r.set_precision(tandem::v1::PRECISION_FP32);
  if (!r.updates().has_synchronous() && !r.updates().has_swa()) {
    return FieldError(field,
                      "a pipeline updates synchronously once per step; set updates to synchronous "
                      "(or swa)");
  }
  if (choose) return absl::OkStatus();  // the rest once the stages are chosen
  const int batch = r.training().batch_size();
  if (pipe->micro_batches() == 0) {
    if (p->micro_batch_size() > 0) {
      pipe->set_micro_batches(batch / p->micro_batch_size());
    } else {
      // The planner's default for a bare `tandem plan --pipeline_devices`
      // (PipelineMicroBatch, planner/planner.cc) is the same rule.
      int m = std::min(batch, 4 * pipe->stages());
      while (batch % m != 0) --m;
      pipe->set_micro_batches(m);
    }
  }
  if (p->micro_batch_size() == 0) p->set_micro_batch_size(batch / pipe->micro_batches());
  if (pipe->schedule() == tandem::v1::PIPELINE_SCHEDULE_UNSPECIFIED) {
    pipe->set_schedule(tandem::v1::PIPELINE_SCHEDULE_ONE_F_ONE_B);
  }
  if (pipe->schedule() == tandem::v1::PIPELINE_SCHEDULE_PIPEDREAM &&
      r.optimizer().max_grad_norm() > 0) {
    return FieldError("placement.pipeline.schedule",
                      "PipeDream updates each stage on its own; gradient clipping "
                      "(optimizer.max_grad_norm) needs the whole model's norm first");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ResolvePipelineStages(JobSpec& resolved, int stages, int micro_batches) {
  auto* pipe = resolved.mutable_placement()->mutable_pipeline();
  pipe->set_auto_stages(false);
  if (stages <= 1) {
    pipe->set_stages(0);
    return absl::OkStatus();
  }
  pipe->set_stages(stages);
  if (micro_batches > 0) {
    pipe->set_micro_batches(micro_batches);
    resolved.mutable_placement()->set_micro_batch_size(0);
  }
  // placement.strategy was the one-accelerator candidate's: stages are gpu_only.
  resolved.mutable_placement()->set_strategy(tandem::v1::STRATEGY_GPU_ONLY);
  return ResolvePipeline(resolved);
}

absl::Status ValidateDistributed(const tandem::v1::DistributedSpec& d) {
  TANDEM_RETURN_IF_ERROR(InRange("distributed.replicas", d.replicas(), 0, kMaxReplicas));
  if (!tandem::v1::CollectiveBackend_IsValid(d.backend())) {
    return FieldError("distributed.backend", absl::StrCat("unknown value ", d.backend()));
  }
  if (!tandem::v1::OptimizerSharding_IsValid(d.sharding())) {
    return FieldError("distributed.sharding", absl::StrCat("unknown value ", d.sharding()));
  }
  TANDEM_RETURN_IF_ERROR(
      InRange("distributed.bucket_bytes", d.bucket_bytes(), int64_t{0}, int64_t{1} << 30));
  // A rank's wait on the coordinator's rendezvous table is one RendezvousGet
  // call, which waits an hour at most (server/cluster/ranks.cc).
  TANDEM_RETURN_IF_ERROR(InRange("distributed.rendezvous_timeout_seconds",
                                 d.rendezvous_timeout_seconds(), 0.0, 3600.0));
  TANDEM_RETURN_IF_ERROR(InRange("distributed.collective_timeout_seconds",
                                 d.collective_timeout_seconds(), 0.0, 86400.0));
  TANDEM_RETURN_IF_ERROR(
      InRange("distributed.fault_wait_seconds", d.fault_wait_seconds(), 0.0, 86400.0));
  if (d.nodes_size() > kMaxReplicas) {
    return FieldError("distributed.nodes", absl::StrCat("at most ", kMaxReplicas, " entries"));
  }
  for (int i = 0; i < d.nodes_size(); ++i) {
    if (d.nodes(i).empty() || d.nodes(i).size() > 256) {
      return FieldError(absl::StrCat("distributed.nodes[", i, "]"),
                        "must be a HOST:PORT of 1 to 256 characters");
    }
  }
  return absl::OkStatus();
}

// What ranks with an accelerator can run in this version: the emulated
// accelerator, each rank's plan on its own node, gradients over Gloo (the
// accelerator's staged through host memory).
absl::Status CheckDeviceRanks(const JobSpec& r) {
  const auto kind = r.placement().accelerator();
  if (kind == tandem::v1::ACCELERATOR_KIND_CUDA) {
    return FieldError("distributed.replicas",
                      "ranks on CUDA GPUs sum their device gradients through NCCL, which this "
                      "version compiles but has not run on a GPU; set placement.accelerator to "
                      "EMULATED or NONE");
  }
  if (kind != tandem::v1::ACCELERATOR_KIND_NONE &&
      r.placement().strategy() == tandem::v1::STRATEGY_HETERO_DP) {
    return FieldError("placement.strategy",
                      "hetero_dp already splits each batch between a node's host and its "
                      "accelerator; a data-parallel rank runs one of the other strategies");
  }
  if (r.placement().pipeline().stages() > 1 || r.placement().pipeline().auto_stages()) {
    return FieldError("distributed.replicas",
                      "a pipeline (placement.pipeline.stages > 1 or auto_stages) runs on one "
                      "node's accelerators; data-parallel pipelines are not built");
  }
  if (r.distributed().backend() == tandem::v1::COLLECTIVE_BACKEND_NCCL) {
    return FieldError("distributed.backend",
                      "NCCL reduces CUDA device memory, and these ranks' gradients are in host "
                      "memory or on an emulated accelerator (use GLOO or AUTO)");
  }
  return absl::OkStatus();
}

// A data-parallel job: one rank per node, each on its CPU engine or running
// its plan on its node's (emulated) accelerator, over Gloo (docs/distributed.md).
absl::Status ResolveDistributed(JobSpec& r) {
  auto* d = r.mutable_distributed();
  if (d->replicas() == 0) d->set_replicas(1);
  if (d->replicas() == 1) {
    if (d->nodes_size() > 0) {
      return FieldError("distributed.nodes", "names nodes for a job of one replica");
    }
    return absl::OkStatus();
  }
  if (d->nodes_size() > 0 && d->nodes_size() != d->replicas() - 1) {
    return FieldError("distributed.nodes",
                      absl::StrCat(d->nodes_size(), " nodes for ranks 1..", d->replicas() - 1,
                                   " (rank 0 is the daemon that accepts the job): name ",
                                   d->replicas() - 1, " or none"));
  }
  TANDEM_RETURN_IF_ERROR(CheckDeviceRanks(r));
  d->set_backend(tandem::v1::COLLECTIVE_BACKEND_GLOO);
  if (!r.updates().has_synchronous()) {
    return FieldError("distributed.replicas",
                      "data-parallel ranks update synchronously; set updates to synchronous");
  }
  if (r.training().batch_size() < d->replicas()) {
    return FieldError("distributed.replicas",
                      absl::StrCat(d->replicas(), " ranks need a training.batch_size of at least ",
                                   d->replicas(), " (it is ", r.training().batch_size(), ")"));
  }
  if (d->bucket_bytes() == 0) d->set_bucket_bytes(int64_t{25} << 20);
  if (d->rendezvous_timeout_seconds() == 0) d->set_rendezvous_timeout_seconds(60);
  if (d->collective_timeout_seconds() == 0) d->set_collective_timeout_seconds(60);
  if (d->fault_wait_seconds() == 0) d->set_fault_wait_seconds(120);
  // Ranks with an accelerator partition the state their plans keep on the
  // host (ZeRO-Offload on many GPUs); the CPU engine's ranks all of it.
  if (d->sharding() == tandem::v1::OPTIMIZER_SHARDING_AUTO) {
    const bool stateful =
        r.optimizer().kind() != tandem::v1::OPTIMIZER_KIND_SGD || r.optimizer().momentum() != 0;
    d->set_sharding(stateful ? tandem::v1::OPTIMIZER_SHARDING_PARTITIONED
                             : tandem::v1::OPTIMIZER_SHARDING_REPLICATED);
  }
  return absl::OkStatus();
}

namespace {

// training.loss_scaling: PRECISION_FP16 jobs alone, defaults filled in.
absl::Status ResolveLossScaling(JobSpec& r) {
  if (r.precision() != tandem::v1::PRECISION_FP16) {
    if (r.training().has_loss_scaling()) {
      return FieldError("training.loss_scaling",
                        "scales the loss of PRECISION_FP16 jobs alone (bf16 and fp32 keep "
                        "fp32's range); leave it out or set precision to FP16");
    }
    return absl::OkStatus();
  }
  if (r.distributed().replicas() > 1) {
    return FieldError("precision",
                      "data-parallel ranks do not run fp16 (loss scaling across ranks is not "
                      "built); set precision to BF16 or FP32");
  }
  auto* ls = r.mutable_training()->mutable_loss_scaling();
  if (ls->initial_scale() == 0) ls->set_initial_scale(65536);
  if (ls->growth_interval_steps() == 0) ls->set_growth_interval_steps(2000);
  if (ls->max_consecutive_skips() == 0) ls->set_max_consecutive_skips(100);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateJobSpec(const JobSpec& spec) {
  TANDEM_RETURN_IF_ERROR(ValidateHeader(spec));
  TANDEM_RETURN_IF_ERROR(ValidateOptimizer(spec.optimizer()));
  TANDEM_RETURN_IF_ERROR(ValidateTraining(spec.training()));
  TANDEM_RETURN_IF_ERROR(ValidatePlacement(spec.placement(), spec.training()));
  TANDEM_RETURN_IF_ERROR(ValidateResources(spec.resources()));
  TANDEM_RETURN_IF_ERROR(InRange("priority", spec.priority(), -1000, 1000));
  if (!tandem::v1::Precision_IsValid(spec.precision())) {
    return FieldError("precision", absl::StrCat("unknown value ", spec.precision()));
  }
  TANDEM_RETURN_IF_ERROR(ValidateDistributed(spec.distributed()));
  return ValidateUpdates(spec.updates(), spec.training());
}

absl::StatusOr<JobSpec> ResolveJobSpec(const JobSpec& spec, bool has_accelerator) {
  work_counters::Count(work_counters::spec_resolutions);
  TANDEM_RETURN_IF_ERROR(ValidateJobSpec(spec));
  JobSpec r = spec;
  auto* o = r.mutable_optimizer();
  if (o->kind() == tandem::v1::OPTIMIZER_KIND_UNSPECIFIED)
    o->set_kind(tandem::v1::OPTIMIZER_KIND_ADAM);
  const bool sgd = o->kind() == tandem::v1::OPTIMIZER_KIND_SGD;
  if (o->learning_rate() == 0) o->set_learning_rate(sgd ? 1e-2f : 1e-3f);
  if (!sgd) {
    if (o->beta1() == 0) o->set_beta1(0.9f);
    if (o->beta2() == 0) o->set_beta2(0.999f);
    if (o->epsilon() == 0) o->set_epsilon(1e-8f);
  }
  if (!o->has_weight_decay()) {
    o->set_weight_decay(o->kind() == tandem::v1::OPTIMIZER_KIND_ADAMW ? 0.01f : 0.0f);
  }
  if (o->schedule() == tandem::v1::LEARNING_RATE_SCHEDULE_UNSPECIFIED) {
    o->set_schedule(tandem::v1::LEARNING_RATE_SCHEDULE_CONSTANT);
  }
  auto* t = r.mutable_training();
  if (t->checkpoint_interval_steps() == 0 && !t->checkpoint_disabled()) {
    t->set_checkpoint_interval_steps(500);
  }
  if (t->log_interval_steps() == 0) t->set_log_interval_steps(1);
  if (t->eval_batch_size() == 0) t->set_eval_batch_size(t->batch_size());
  if (!r.data().has_shuffle()) r.mutable_data()->set_shuffle(true);
  if (r.data().has_text() && !r.data().text().has_test_fraction()) {
    r.mutable_data()->mutable_text()->set_test_fraction(0.1f);
  }
  auto* p = r.mutable_placement();
  if (p->accelerator() == tandem::v1::ACCELERATOR_KIND_UNSPECIFIED) {
    p->set_accelerator(has_accelerator ? tandem::v1::ACCELERATOR_KIND_CUDA
                                       : tandem::v1::ACCELERATOR_KIND_NONE);
  }
  if (p->replan_threshold() == 0) p->set_replan_threshold(kDefaultReplanThreshold);
  TANDEM_RETURN_IF_ERROR(ResolveUpdates(r));
  TANDEM_RETURN_IF_ERROR(ResolvePipeline(r));
  TANDEM_RETURN_IF_ERROR(ResolveDistributed(r));
  TANDEM_RETURN_IF_ERROR(ResolveLossScaling(r));
  const bool accelerated = p->accelerator() != tandem::v1::ACCELERATOR_KIND_NONE;
  if (p->strategy() == tandem::v1::STRATEGY_UNSPECIFIED) {
    p->set_strategy(accelerated ? tandem::v1::STRATEGY_REUSE_DISTANCE
                                : tandem::v1::STRATEGY_CPU_ONLY);
  }
  if (!accelerated && p->strategy() != tandem::v1::STRATEGY_CPU_ONLY &&
      p->strategy() != tandem::v1::STRATEGY_AUTO) {
    return FieldError("placement.strategy",
                      absl::StrCat(tandem::v1::Strategy_Name(p->strategy()),
                                   " needs an accelerator, and placement.accelerator is NONE"));
  }
  return r;
}

int64_t MaxBatch(const JobSpec& resolved) {
  return std::max(resolved.training().batch_size(), resolved.training().eval_batch_size());
}

int64_t TotalSteps(const JobSpec& resolved, int64_t samples) {
  const auto& t = resolved.training();
  if (t.duration_case() == tandem::v1::TrainingSpec::kSteps) return t.steps();
  const int64_t per_epoch = (samples + t.batch_size() - 1) / t.batch_size();
  return per_epoch * t.epochs();
}

}  // namespace tandem
