#include "planner/spec_files.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::planner {
namespace {

// Keeps the first parse error with its position.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (error_.empty())
      error_ = absl::StrCat("line ", line + 1, ", column ", column + 1, ": ", message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string error_;
};

absl::Status LoadMessage(const std::string& path, const char* what,
                         google::protobuf::Message* message) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " file \"", path, "\": cannot be read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  if (absl::EndsWith(path, ".json")) {
    google::protobuf::util::JsonParseOptions options;
    const auto status = google::protobuf::util::JsonStringToMessage(text, message, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " file \"", path, "\": ", status.message().as_string()));
    }
    return absl::OkStatus();
  }
  if (absl::EndsWith(path, ".textproto") || absl::EndsWith(path, ".txtpb") ||
      absl::EndsWith(path, ".pbtxt")) {
    google::protobuf::TextFormat::Parser parser;
    FirstError errors;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, message)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " file \"", path, "\": ", errors.error()));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " file \"", path, "\": unknown extension; use .textproto or .json"));
}

}  // namespace

absl::StatusOr<tandem::v1::HardwareSpec> LoadHardwareSpec(const std::string& path) {
  tandem::v1::HardwareSpec spec;
  if (absl::Status s = LoadMessage(path, "hardware spec", &spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<tandem::v1::Profile> LoadProfile(const std::string& path) {
  tandem::v1::Profile profile;
  if (absl::Status s = LoadMessage(path, "profile", &profile); !s.ok()) return s;
  return profile;
}

}  // namespace tandem::planner
