// Pins the versions of the Debian libraries whose generated code and ABI we
// depend on (protoc's output must match libprotobuf, grpc_cpp_plugin's
// libgrpc++), so a mismatched package fails here with its name rather than
// deep inside a feature. Whether each library works is the business of the
// tests of the features that use it (oneDNN: every layer's test; SQLite: the
// job store's; yaml-cpp: the job-file loader's; zlib: the IDX reader's).
#include <string>

#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace {

TEST(SystemLibrariesTest, Protobuf321) { EXPECT_EQ(GOOGLE_PROTOBUF_VERSION / 1000, 3021); }

TEST(SystemLibrariesTest, Grpc151) { EXPECT_EQ(grpc::Version().substr(0, 4), "1.51"); }

}  // namespace
