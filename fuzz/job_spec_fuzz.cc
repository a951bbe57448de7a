// Fuzz target: job files and the checks behind SubmitJob. The input is read as a
// job file (YAML, or JSON when it starts with '{') and, separately, as the
// binary JobSpec a gRPC client sends; whatever parses is validated and
// resolved. Beyond "no crash, no sanitizer report": whatever resolves also
// validates, and resolving is a fixed point (a resolved spec validates and
// resolves to itself), which the daemon relies on when it re-reads a stored job
// after a restart.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "spec/job_spec.h"

namespace {

void Check(bool ok, const char* what, const tandem::v1::JobSpec& spec) {
  if (ok) return;
  std::fprintf(stderr, "job_spec_fuzz: %s\n%s\n", what, spec.DebugString().c_str());
  std::abort();
}

void ValidateAndResolve(const tandem::v1::JobSpec& spec) {
  const bool valid = tandem::ValidateJobSpec(spec).ok();
  for (bool has_accelerator : {false, true}) {
    absl::StatusOr<tandem::v1::JobSpec> resolved = tandem::ResolveJobSpec(spec, has_accelerator);
    // Resolving checks more (a GPU strategy needs an accelerator), never less.
    Check(valid || !resolved.ok(), "ResolveJobSpec accepts what ValidateJobSpec refuses", spec);
    if (!resolved.ok()) continue;
    Check(tandem::ValidateJobSpec(*resolved).ok(), "a resolved spec does not validate", *resolved);
    absl::StatusOr<tandem::v1::JobSpec> again = tandem::ResolveJobSpec(*resolved, has_accelerator);
    Check(again.ok() && google::protobuf::util::MessageDifferencer::Equals(*again, *resolved),
          "resolving a resolved spec changes it", *resolved);
    Check(tandem::MaxBatch(*resolved) >= 1, "MaxBatch of a resolved spec is below 1", *resolved);
    for (int64_t samples : {int64_t{0}, int64_t{1}, int64_t{60000}, int64_t{1} << 40}) {
      Check(tandem::TotalSteps(*resolved, samples) >= 0, "TotalSteps is negative", *resolved);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Protobuf logs every string field that is not UTF-8; the fuzzer makes many.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tandem::v1::JobSpec> parsed = tandem::ParseJobSpec(text, "fuzz.yaml");
  if (parsed.ok()) {
    ValidateAndResolve(*parsed);
  } else if (parsed.status().message().empty()) {
    std::fprintf(stderr, "job_spec_fuzz: a parse error without a message\n");
    std::abort();
  }
  tandem::v1::JobSpec wire;
  if (wire.ParseFromString(text)) ValidateAndResolve(wire);
  return 0;
}
