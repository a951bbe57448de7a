#include "server/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace tandem::server {

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

absl::StatusOr<Authenticator> Authenticator::FromFile(const std::string& path) {
  std::ifstream f(path);
  if (!f)
    return absl::InvalidArgumentError(absl::StrCat("--auth_token_file: cannot read '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string token(absl::StripAsciiWhitespace(ss.str()));
  if (token.size() < 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_token_file: '", path, "' must hold a token of at least 16 characters"));
  }
  return WithToken(std::move(token));
}

Authenticator Authenticator::WithToken(std::string token) {
  Authenticator a;
  a.token_ = std::move(token);
  return a;
}

grpc::Status Authenticator::CheckHeader(const std::string& authorization, bool present) const {
  if (!enabled()) return grpc::Status::OK;
  if (!present) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing 'authorization: Bearer <token>' metadata");
  }
  constexpr char kPrefix[] = "Bearer ";
  if (authorization.compare(0, sizeof(kPrefix) - 1, kPrefix) != 0) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "the authorization metadata must be 'Bearer <token>'");
  }
  if (!ConstantTimeEquals(authorization.substr(sizeof(kPrefix) - 1), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid token");
  }
  return grpc::Status::OK;
}

grpc::Status Authenticator::Check(const grpc::ServerContextBase& context) const {
  if (!enabled()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return CheckHeader("", false);
  return CheckHeader(std::string(it->second.data(), it->second.size()), true);
}

}  // namespace tandem::server
