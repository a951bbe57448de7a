#include "clients/cli/rpc_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tandem::cli {

RpcClient::RpcClient(ClientOptions options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options_.tls_root_certs.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options_.tls_root_certs;
    credentials = grpc::SslCredentials(ssl);
  }
  channel_ = grpc::CreateCustomChannel(options_.server, credentials, args);
  stub_ = tandem::v1::Tandem::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> RpcClient::StreamContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", "Bearer " + options_.token);
  }
  return context;
}

std::unique_ptr<grpc::ClientContext> RpcClient::UnaryContext(
    std::optional<absl::Duration> deadline) const {
  auto context = StreamContext();
  context->set_deadline(std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(deadline.value_or(options_.deadline)));
  return context;
}

absl::Status ToAbsl(const grpc::Status& status, const std::string& server) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.error_code());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::Status(
        code, absl::StrCat("cannot reach tandemd at ", server, ": ", status.error_message()));
  }
  return absl::Status(code, status.error_message());
}

}  // namespace tandem::cli
