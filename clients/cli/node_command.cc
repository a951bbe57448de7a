// `tandem node [--refresh]`: the daemon's devices, memory, jobs and node
// profile; with --refresh the daemon measures its node profile again first.
#include <cstdio>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "clients/cli/commands.h"
#include "clients/cli/rpc_client.h"

ABSL_DECLARE_FLAG(bool, refresh);

namespace tandem::cli {

absl::StatusOr<int> RunNode(const Args& args) {
  if (!args.empty()) return UsageError("usage: tandem node [--refresh]");
  RpcClient client(GlobalClientOptions());
  tandem::v1::NodeInfo node;
  tandem::v1::GetNodeRequest request;
  request.set_refresh_profile(absl::GetFlag(FLAGS_refresh));
  if (request.refresh_profile()) {
    std::fprintf(stderr, "tandem: measuring the node profile again (a few seconds)\n");
  }
  auto context = client.UnaryContext();
  const grpc::Status status = client.stub().GetNode(context.get(), request, &node);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  std::printf("%s\n", ToJson(node).c_str());
  return 0;
}

}  // namespace tandem::cli
