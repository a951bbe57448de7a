// The CLI's connection to tandemd: a channel to --server, the bearer token on
// every call, and a deadline on every unary call. Not thread-safe; one per command.
#ifndef TANDEM_CLIENTS_CLI_RPC_CLIENT_H_
#define TANDEM_CLIENTS_CLI_RPC_CLIENT_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "tandem/v1/tandem_service.grpc.pb.h"

namespace tandem::cli {

struct ClientOptions {
  // host:port of tandemd.
  std::string server = "127.0.0.1:50051";
  // Bearer token; empty sends none.
  std::string token;
  // PEM roots to check tandemd's TLS certificate against (a daemon started
  // with --tls_cert); empty: a plaintext channel.
  std::string tls_root_certs;
  // Deadline of each unary call.
  absl::Duration deadline = absl::Seconds(30);
};

class RpcClient {
 public:
  explicit RpcClient(ClientOptions options);

  tandem::v1::Tandem::Stub& stub() { return *stub_; }
  // A context with the token and the unary deadline applied (`deadline`, when
  // given, instead: PlanModel solves for longer).
  std::unique_ptr<grpc::ClientContext> UnaryContext(
      std::optional<absl::Duration> deadline = std::nullopt) const;
  // A context with the token and no deadline, for server streams.
  std::unique_ptr<grpc::ClientContext> StreamContext() const;

 private:
  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tandem::v1::Tandem::Stub> stub_;
};

// gRPC status to absl::Status, keeping code and message; names the server when
// it could not be reached.
absl::Status ToAbsl(const grpc::Status& status, const std::string& server);

}  // namespace tandem::cli

#endif  // TANDEM_CLIENTS_CLI_RPC_CLIENT_H_
