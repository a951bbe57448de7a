// Bearer-token authentication of RPCs (--auth_token_file). Every tandem.v1 RPC
// checks the "authorization: Bearer <token>" metadata; the token comparison runs
// in time independent of where the tokens differ. Health checks never need a
// token. Thread-safe (immutable after construction).
#ifndef TANDEM_SERVER_AUTH_H_
#define TANDEM_SERVER_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace tandem::server {

class Authenticator {
 public:
  // No authentication.
  Authenticator() = default;
  // Reads the token (surrounding whitespace trimmed) from `path`; refuses
  // tokens shorter than 16 characters.
  static absl::StatusOr<Authenticator> FromFile(const std::string& path);
  static Authenticator WithToken(std::string token);

  bool enabled() const { return !token_.empty(); }
  // OK, or UNAUTHENTICATED saying what is missing or wrong.
  grpc::Status Check(const grpc::ServerContextBase& context) const;
  // The same check on a raw "authorization" header value.
  grpc::Status CheckHeader(const std::string& authorization, bool present) const;

 private:
  std::string token_;
};

// Compares in time that depends only on the lengths, not on the contents.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_AUTH_H_
