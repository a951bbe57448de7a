// The tandem CLI's commands. Each takes its positional arguments and returns the
// process exit code (0 success; for `--watch`, the job's outcome), or an error
// that main prints. Global flags (--server, --token, --output) are read through
// Globals().
#ifndef TANDEM_CLIENTS_CLI_COMMANDS_H_
#define TANDEM_CLIENTS_CLI_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "clients/cli/rpc_client.h"
#include "google/protobuf/message.h"
#include "tandem/v1/job.pb.h"

namespace tandem::cli {

struct Globals {
  std::string server;
  std::string token;
  // --tls_ca's PEM roots (empty: plaintext).
  std::string tls_root_certs;
  // "text" or "json".
  std::string output;
  bool json() const { return output == "json"; }
};
const Globals& GetGlobals();
// The global flags' connection (--server, --token, --tls_ca).
ClientOptions GlobalClientOptions();

using Args = std::vector<std::string>;

// Bad usage (wrong arguments, a bad flag value): main exits 2 for it, where a
// request that fails exits 1 (README.md, "Exit codes").
absl::Status UsageError(absl::string_view message);
bool IsUsageError(const absl::Status& status);

absl::StatusOr<int> RunTrain(const Args& args);
absl::StatusOr<int> RunNode(const Args& args);
absl::StatusOr<int> RunSubmit(const Args& args);
absl::StatusOr<int> RunJobs(const Args& args);
absl::StatusOr<int> RunStatus(const Args& args);
absl::StatusOr<int> RunWatch(const Args& args);
absl::StatusOr<int> RunCancel(const Args& args);
absl::StatusOr<int> RunProfile(const Args& args);
absl::StatusOr<int> RunPlan(const Args& args);

// Writes a job's measured timeline as Chrome trace JSON to `path`, and the
// plan's predicted one to `path`.predicted.json; FAILED_PRECONDITION when the
// job has no measured timeline.
absl::Status WriteJobTraces(const tandem::v1::Job& job, const std::string& path);

// A message as pretty JSON (the protobuf JSON mapping, field names as in .proto).
std::string ToJson(const google::protobuf::Message& message);

}  // namespace tandem::cli

#endif  // TANDEM_CLIENTS_CLI_COMMANDS_H_
