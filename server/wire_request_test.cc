#include "server/wire_request.h"

#include <string>

#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "tandem/v1/tandem_service.pb.h"

namespace tandem::server {
namespace {

using tandem::v1::SubmitJobRequest;

// The bytes a client that does not check UTF-8 would send.
std::string Wire(const google::protobuf::Message& message) {
  google::protobuf::LogSilencer quiet;  // serializing logs the bad string
  return message.SerializeAsString();
}

grpc::Status Parse(const std::string& bytes, google::protobuf::Message* out) {
  grpc::Slice slice(bytes);
  grpc::ByteBuffer raw(&slice, 1);
  google::protobuf::LogSilencer quiet;
  return ParseRequest(raw, out);
}

TEST(WireRequest, AValidRequestParses) {
  SubmitJobRequest request;
  request.set_request_id("r-1");
  request.mutable_spec()->set_display_name("caf\xc3\xa9");
  SubmitJobRequest parsed;
  ASSERT_TRUE(Parse(Wire(request), &parsed).ok());
  EXPECT_EQ(parsed.spec().display_name(), "caf\xc3\xa9");
}

TEST(WireRequest, InvalidUtf8IsInvalidArgumentNamingTheFieldPath) {
  struct Case {
    const char* name;
    std::function<void(SubmitJobRequest*)> set;
    const char* message;
  };
  const Case cases[] = {
      {"top level", [](SubmitJobRequest* r) { r->set_request_id("ab\xff"); },
       "request_id: is not valid UTF-8 (byte 0xff at offset 2)"},
      {"nested", [](SubmitJobRequest* r) { r->mutable_spec()->set_display_name("\xc0\xaf"); },
       "spec.display_name: is not valid UTF-8 (byte 0xc0 at offset 0)"},
      {"map value",
       [](SubmitJobRequest* r) {
         (*r->mutable_spec()->mutable_labels())["team"] = "x\xed\xa0\x80";
       },
       "spec.labels[\"team\"]: is not valid UTF-8 (byte 0xed at offset 1)"},
      {"map key", [](SubmitJobRequest* r) { (*r->mutable_spec()->mutable_labels())["\xfe"] = "v"; },
       "spec.labels (a key): is not valid UTF-8 (byte 0xfe at offset 0)"},
      {"deep",
       [](SubmitJobRequest* r) {
         r->mutable_spec()->mutable_data()->mutable_text()->set_path("a\x80");
       },
       "spec.data.text.path: is not valid UTF-8 (byte 0x80 at offset 1)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    SubmitJobRequest request;
    request.mutable_spec()->set_display_name("ok");
    c.set(&request);
    SubmitJobRequest parsed;
    const grpc::Status status = Parse(Wire(request), &parsed);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(status.error_message(), c.message);
  }
}

TEST(WireRequest, BytesThatAreNoMessageSaySo) {
  SubmitJobRequest parsed;
  const grpc::Status status = Parse(std::string("\x0a\xff\xff\xff\xff\x0f", 6), &parsed);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(status.error_message(),
            "the request is not a valid tandem.v1.SubmitJobRequest message (6 bytes)");
}

std::string BytesOf(grpc::ByteBuffer& raw) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(raw.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes;
}

TEST(WireRequest, TheResponseRoundTrips) {
  tandem::v1::SubmitJobResponse response;
  response.set_created(true);
  response.mutable_job()->set_id("job-000001");
  grpc::ByteBuffer raw;
  SerializeResponse(response, &raw);
  tandem::v1::SubmitJobResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(BytesOf(raw)));
  EXPECT_EQ(parsed.job().id(), "job-000001");
  EXPECT_TRUE(parsed.created());
}

// A stream serializes each message into the buffer that held the last one,
// and large messages go through gRPC's slice writer, not one inlined slice.
TEST(WireRequest, ALargeResponseReplacesTheBuffersLastMessage) {
  tandem::v1::SubmitJobResponse small;
  small.mutable_job()->set_id("job-000001");
  tandem::v1::SubmitJobResponse large;
  large.mutable_job()->set_id("job-000002");
  large.mutable_job()->set_reason(std::string(100000, 'x'));
  grpc::ByteBuffer raw;
  SerializeResponse(small, &raw);
  SerializeResponse(large, &raw);
  tandem::v1::SubmitJobResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(BytesOf(raw)));
  EXPECT_EQ(parsed.job().id(), "job-000002");
  EXPECT_EQ(parsed.job().reason().size(), 100000u);
  SerializeResponse(large, &raw);
  ASSERT_TRUE(parsed.ParseFromString(BytesOf(raw)));
  EXPECT_EQ(parsed.job().reason().size(), 100000u);
}

}  // namespace
}  // namespace tandem::server
