// `tandem node`: the daemon's devices, memory and jobs.
#include <cstdio>

#include "clients/cli/commands.h"
#include "clients/cli/rpc_client.h"

namespace tandem::cli {

absl::StatusOr<int> RunNode(const Args& args) {
  if (!args.empty()) return absl::InvalidArgumentError("usage: tandem node");
  RpcClient client({.server = GetGlobals().server, .token = GetGlobals().token});
  tandem::v1::NodeInfo node;
  auto context = client.UnaryContext();
  const grpc::Status status =
      client.stub().GetNode(context.get(), tandem::v1::GetNodeRequest(), &node);
  if (!status.ok()) return ToAbsl(status, GetGlobals().server);
  std::printf("%s\n", ToJson(node).c_str());
  return 0;
}

}  // namespace tandem::cli
