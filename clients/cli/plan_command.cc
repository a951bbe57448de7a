// `tandem plan FILE`: the best plan for a job file's model, and how every
// strategy compares, on this machine, on a machine described by a hardware
// spec, or from a measured profile; in this process through the same entry
// point as the PlanModel RPC, or on the daemon with --on_server.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "clients/cli/commands.h"
#include "clients/cli/rpc_client.h"
#include "node/placement.h"
#include "planner/plan_report.h"
#include "planner/spec_files.h"
#include "spec/job_spec.h"

ABSL_FLAG(std::string, hardware, "",
          "tandem plan: plan for the machine this HardwareSpec file describes (text or JSON, e.g. "
          "planner/hardware/h100_sxm_node.textproto) instead of this one.");
ABSL_FLAG(std::string, profile, "",
          "tandem plan: plan from this measured Profile file (`tandem profile --output=json`).");
ABSL_FLAG(std::string, accelerator_memory, "",
          "tandem plan: accelerator memory to plan under, in bytes, or with a unit (\"6GiB\", "
          "\"512MiB\", \"8GB\"); empty = the job's resources.accelerator_memory_bytes, else the "
          "accelerator's capacity.");
ABSL_FLAG(std::string, gpu_memory, "",
          "tandem plan: deprecated, the old name of --accelerator_memory.");
ABSL_FLAG(std::string, compare, "all",
          "tandem plan: strategies to compare: \"all\", or a comma-separated list of gpu_only, "
          "cpu_only, zero_offload, reuse_distance, hetero_dp, auto.");
ABSL_FLAG(std::string, nodes, "",
          "tandem plan: data parallelism over these node counts of --hardware, e.g. 1,2,4,8,64: "
          "per-rank plans, step time and scaling efficiency (docs/distributed.md).");
ABSL_FLAG(int, pipeline_devices, 0,
          "tandem plan: also split the model into a pipeline over this many accelerators.");
ABSL_FLAG(bool, pipeline_auto, false,
          "tandem plan, without --pipeline_devices: also plan pipelines over 2, 4, 8... of the "
          "hardware's accelerators, and answer the fastest of those and the one-accelerator "
          "plan.");
ABSL_FLAG(std::string, precision, "",
          "tandem plan: plan in this precision (auto, fp32, bf16, fp16) instead of the job "
          "file's precision.");
ABSL_FLAG(bool, on_server, false,
          "tandem plan: ask the daemon at --server (which plans for its own node) instead of "
          "planning in this process.");

namespace tandem::cli {
namespace {

absl::StatusOr<int64_t> ParseBytes(const std::string& flag, const std::string& given) {
  std::string text(absl::StripAsciiWhitespace(given));
  static const std::pair<const char*, double> kUnits[] = {
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3},     {"MB", 1e6},        {"GB", 1e9},           {"TB", 1e12},
      {"B", 1.0}};
  double scale = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (absl::EndsWithIgnoreCase(text, suffix)) {
      text = std::string(absl::StripAsciiWhitespace(text.substr(0, text.size() - strlen(suffix))));
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || value <= 0 || value * scale > 1e18) {
    return UsageError(absl::StrCat(
        "--", flag, ": expected a positive size such as 6GiB or 8e9, got '", given, "'"));
  }
  return static_cast<int64_t>(value * scale);
}

absl::StatusOr<std::vector<tandem::v1::Strategy>> ParseCompare(const std::string& text) {
  std::vector<tandem::v1::Strategy> out;
  if (text == "all" || text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string name =
        absl::StrCat("STRATEGY_", absl::AsciiStrToUpper(absl::StripAsciiWhitespace(part)));
    tandem::v1::Strategy s;
    if (!tandem::v1::Strategy_Parse(name, &s) || s == tandem::v1::STRATEGY_UNSPECIFIED) {
      return UsageError(absl::StrCat(
          "--compare: unknown strategy '", part,
          "'; use gpu_only, cpu_only, zero_offload, reuse_distance, hetero_dp or auto"));
    }
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<tandem::v1::Precision> ParsePrecision(const std::string& text) {
  tandem::v1::Precision p;
  const std::string name = absl::StrCat("PRECISION_", absl::AsciiStrToUpper(text));
  if (!tandem::v1::Precision_Parse(name, &p)) {
    return UsageError(
        absl::StrCat("--precision: unknown precision '", text, "'; use auto, fp32, bf16 or fp16"));
  }
  return p;
}

// --nodes into request.nodes; a multi-node plan needs --hardware.
absl::Status AddNodes(tandem::v1::PlanModelRequest& request) {
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',', absl::SkipWhitespace())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > 65536) {
      return UsageError(absl::StrCat("--nodes: \"", part, "\" is not a node count in [1, 65536]"));
    }
    request.add_nodes(n);
  }
  if (request.nodes_size() > 0 &&
      request.cost_source_case() != tandem::v1::PlanModelRequest::kHardware) {
    return UsageError("--nodes: plans other machines: give --hardware=SPEC");
  }

  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> RunPlan(const Args& args) {
  if (args.size() != 1) return UsageError("usage: tandem plan FILE");
  absl::StatusOr<tandem::v1::JobSpec> spec = LoadJobSpecFile(args[0]);
  if (!spec.ok()) return spec.status();

  tandem::v1::PlanModelRequest request;
  *request.mutable_spec() = *spec;
  if (const std::string precision = absl::GetFlag(FLAGS_precision); !precision.empty()) {
    absl::StatusOr<tandem::v1::Precision> p = ParsePrecision(precision);
    if (!p.ok()) return p.status();
    request.mutable_spec()->set_precision(*p);
  }
  const std::string hardware = absl::GetFlag(FLAGS_hardware);
  const std::string profile = absl::GetFlag(FLAGS_profile);
  if (!hardware.empty() && !profile.empty()) {
    return UsageError("--hardware and --profile: give one cost source, not both");
  }
  if (!hardware.empty()) {
    absl::StatusOr<tandem::v1::HardwareSpec> hw = planner::LoadHardwareSpec(hardware);
    if (!hw.ok()) return hw.status();
    *request.mutable_hardware() = *std::move(hw);
  }
  if (!profile.empty()) {
    absl::StatusOr<tandem::v1::Profile> p = planner::LoadProfile(profile);
    if (!p.ok()) return p.status();
    *request.mutable_profile() = *std::move(p);
  }
  std::string memory_flag = "accelerator_memory";
  std::string memory = absl::GetFlag(FLAGS_accelerator_memory);
  if (memory.empty() && !absl::GetFlag(FLAGS_gpu_memory).empty()) {
    std::fprintf(stderr, "tandem: --gpu_memory is deprecated; use --accelerator_memory\n");
    memory_flag = "gpu_memory";
    memory = absl::GetFlag(FLAGS_gpu_memory);
  }
  if (!memory.empty()) {
    absl::StatusOr<int64_t> bytes = ParseBytes(memory_flag, memory);
    if (!bytes.ok()) return bytes.status();
    request.set_accelerator_memory_bytes(*bytes);
  }
  absl::StatusOr<std::vector<tandem::v1::Strategy>> compare =
      ParseCompare(absl::GetFlag(FLAGS_compare));
  if (!compare.ok()) return compare.status();
  for (tandem::v1::Strategy s : *compare) request.add_compare(s);
  if (absl::GetFlag(FLAGS_pipeline_devices) < 0) {
    return UsageError("--pipeline_devices: must be >= 0");
  }
  request.set_pipeline_devices(absl::GetFlag(FLAGS_pipeline_devices));
  request.set_pipeline_auto(absl::GetFlag(FLAGS_pipeline_auto));
  if (absl::Status nodes = AddNodes(request); !nodes.ok()) return nodes;
  tandem::v1::PlanModelResponse response;
  if (absl::GetFlag(FLAGS_on_server)) {
    RpcClient client(GlobalClientOptions());
    // A solve may queue on the daemon's planning lane and take minutes (as
    // the Python client's plan_timeout_seconds).
    auto context = client.UnaryContext(absl::Seconds(300));
    const grpc::Status status = client.stub().PlanModel(context.get(), request, &response);
    if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  } else {
    // This machine is measured only when it is the cost source.
    node::NodeOffer offer;
    if (request.cost_source_case() == tandem::v1::PlanModelRequest::COST_SOURCE_NOT_SET) {
      offer = node::DetectNodeOffer(0);
    }
    // Planned here, this machine has as many emulated accelerators as asked for.
    offer.emulated_accelerators =
        std::max({1, request.pipeline_devices(), request.spec().placement().pipeline().stages()});
    absl::StatusOr<tandem::v1::PlanModelResponse> answer = node::PlanModel(request, offer);
    if (!answer.ok()) return answer.status();
    response = *std::move(answer);
  }
  if (GetGlobals().json()) {
    std::printf("%s\n", ToJson(response).c_str());
  } else {
    std::printf("%s", planner::RenderPlanReport(response).c_str());
  }
  return response.plan().feasible() ? 0 : 3;
}

}  // namespace tandem::cli
