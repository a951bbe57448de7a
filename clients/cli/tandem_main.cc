// tandem: the command-line client of tandemd, and `tandem train` to run a job
// in-process without a daemon. Each command is a function; main only dispatches.
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/cli/rpc_client.h"
#include "runtime/base/build_info.h"
#include "runtime/base/flags_usage.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "tandemd address (host:port).");
ABSL_FLAG(std::string, token, "", "Bearer token for a daemon started with --auth_token_file.");
ABSL_FLAG(std::string, output, "text", "Output format: text or json.");

namespace tandem::cli {
namespace {

struct Command {
  const char* usage;
  const char* help;
  std::function<absl::Status(const std::vector<std::string>& args)> run;
};

RpcClient MakeClient() {
  ClientOptions options;
  options.server = absl::GetFlag(FLAGS_server);
  options.token = absl::GetFlag(FLAGS_token);
  return RpcClient(options);
}

absl::Status RunNode(const std::vector<std::string>&) {
  RpcClient client = MakeClient();
  tandem::v1::NodeInfo node;
  auto context = client.UnaryContext();
  grpc::Status status = client.stub().GetNode(context.get(), tandem::v1::GetNodeRequest(), &node);
  if (!status.ok()) return ToAbsl(status, absl::GetFlag(FLAGS_server));
  std::printf("%s\n", node.DebugString().c_str());
  return absl::OkStatus();
}

const std::map<std::string, Command>& Commands() {
  static const auto* commands = new std::map<std::string, Command>{
      {"node", {"node", "Show the daemon's devices, memory and jobs.", RunNode}},
  };
  return *commands;
}

std::string UsageText() {
  std::string text =
      "submit and watch training jobs on tandemd, plan and profile models.\n\n"
      "Usage: tandem [--server=HOST:PORT] [--token=T] [--output=text|json] COMMAND ARGS...\n\n"
      "Commands:\n";
  for (const auto& [name, command] : Commands()) {
    absl::StrAppend(&text, "  ", absl::StrFormat("%-22s", command.usage), command.help, "\n");
  }
  return text;
}

}  // namespace
}  // namespace tandem::cli

int main(int argc, char** argv) {
  const std::string usage = tandem::cli::UsageText();
  tandem::InstallFlagsUsage(usage.c_str());
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
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
  std::vector<std::string> args(positional.begin() + 2, positional.end());
  absl::Status status = it->second.run(args);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem %s: %s\n", name.c_str(), status.ToString().c_str());
    return 1;
  }
  return 0;
}
