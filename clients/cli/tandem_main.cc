// tandem: the command-line client of tandemd, and `tandem train` to run a job
// in-process without a daemon. main only parses flags and dispatches.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/flags_usage.h"
#include "clients/cli/commands.h"
#include "google/protobuf/util/json_util.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "tandemd address (host:port).");
ABSL_FLAG(std::string, token, "", "Bearer token for a daemon started with --auth_token_file.");
ABSL_FLAG(std::string, output, "text", "Output format: text or json.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the roots tandemd's TLS certificate is checked against (a daemon started "
          "with --tls_cert; its own certificate when self-signed); empty: plaintext.");

namespace tandem::cli {
namespace {

struct Command {
  const char* usage;
  const char* help;
  absl::StatusOr<int> (*run)(const Args&);
};

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"submit",
       {"submit FILE [--watch]",
        "Submit a job file (YAML or JSON). With --watch, follow it; exit 0 if it succeeds, 1 if it "
        "fails, 3 if cancelled.",
        RunSubmit}},
      {"jobs", {"jobs [--state=S]", "List jobs, newest first.", RunJobs}},
      {"status", {"status ID", "Show one job.", RunStatus}},
      {"watch",
       {"watch ID [--from=N]", "Follow a job's events live (exit code as submit --watch).",
        RunWatch}},
      {"cancel",
       {"cancel ID", "Cancel a job (queued: now; running: at the next step).", RunCancel}},
      {"node",
       {"node [--refresh]",
        "Show the daemon's devices, memory, jobs and node profile (--refresh: measure it again).",
        RunNode}},
      {"plan",
       {"plan FILE",
        "Plan a job file's model: every strategy compared on this machine, a --hardware spec or a "
        "--profile; exit 3 when the chosen strategy does not fit.",
        RunPlan}},
      {"profile",
       {"profile FILE", "Profile a job file's model layer by layer on this machine.", RunProfile}},
      {"train", {"train FILE", "Run a job file in this process, without a daemon.", RunTrain}},
  };
  return *commands;
}

std::string UsageText() {
  std::string text =
      "submit and watch training jobs on tandemd, plan and profile models.\n\n"
      "Usage: tandem [--server=HOST:PORT] [--token=T] [--tls_ca=PEM] [--output=text|json] "
      "COMMAND ARGS...\n\n"
      "Commands:\n";
  for (const auto& [name, command] : Commands()) {
    absl::StrAppend(&text, "  ", absl::StrFormat("%-24s", command.usage), command.help, "\n");
  }
  return text;
}

Globals globals;

}  // namespace

const Globals& GetGlobals() { return globals; }

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

}  // namespace tandem::cli

int main(int argc, char** argv) {
  const std::string usage = tandem::cli::UsageText();
  tandem::InstallFlagsUsage(usage.c_str());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::string tls_root_certs;
  if (const std::string ca = absl::GetFlag(FLAGS_tls_ca); !ca.empty()) {
    std::ifstream in(ca, std::ios::binary);
    tls_root_certs.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in || tls_root_certs.empty()) {
      std::fprintf(stderr, "tandem: --tls_ca: cannot read '%s'\n", ca.c_str());
      return 2;
    }
  }
  tandem::cli::globals = {absl::GetFlag(FLAGS_server), absl::GetFlag(FLAGS_token),
                          std::move(tls_root_certs), absl::GetFlag(FLAGS_output)};
  if (tandem::cli::globals.output != "text" && tandem::cli::globals.output != "json") {
    std::fprintf(stderr, "tandem: --output must be text or json, got '%s'\n",
                 tandem::cli::globals.output.c_str());
    return 2;
  }
  if (positional.size() < 2) {
    std::fprintf(stderr, "%s", usage.c_str());
    return 2;
  }
  const std::string name = positional[1];
  const auto& commands = tandem::cli::Commands();
  auto it = commands.find(name);
  if (it == commands.end()) {
    std::fprintf(stderr, "tandem: unknown command '%s'\n\n%s", name.c_str(), usage.c_str());
    return 2;
  }
  const std::vector<std::string> args(positional.begin() + 2, positional.end());
  absl::StatusOr<int> code = it->second.run(args);
  if (!code.ok()) {
    // Code and message; never the payloads (the usage mark among them).
    std::fprintf(stderr, "tandem %s: %s: %s\n", name.c_str(),
                 absl::StatusCodeToString(code.status().code()).c_str(),
                 std::string(code.status().message()).c_str());
    return tandem::cli::IsUsageError(code.status()) ? 2 : 1;
  }
  return *code;
}
