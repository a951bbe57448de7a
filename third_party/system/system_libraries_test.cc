// Links every Debian library Tandem builds against and exercises one call of
// each, so a missing or mismatched package fails here with its name rather than
// deep inside a feature.
#include <sqlite3.h>
#include <zlib.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "oneapi/dnnl/dnnl.hpp"
#include "yaml-cpp/yaml.h"

namespace {

TEST(SystemLibrariesTest, Protobuf321) { EXPECT_EQ(GOOGLE_PROTOBUF_VERSION / 1000, 3021); }

TEST(SystemLibrariesTest, Grpc151) { EXPECT_EQ(grpc::Version().substr(0, 4), "1.51"); }

TEST(SystemLibrariesTest, Abseil) { EXPECT_EQ(absl::StrCat("a", 1), "a1"); }

TEST(SystemLibrariesTest, OneDnnRunsAMatmul) {
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  dnnl::memory::desc a({2, 3}, dt::f32, tag::ab), b({3, 2}, dt::f32, tag::ab),
      c({2, 2}, dt::f32, tag::ab);
  float av[] = {1, 2, 3, 4, 5, 6}, bv[] = {1, 0, 0, 1, 1, 1}, cv[4] = {};
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
  dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, dnnl::memory(a, engine, av)},
                                    {DNNL_ARG_WEIGHTS, dnnl::memory(b, engine, bv)},
                                    {DNNL_ARG_DST, dnnl::memory(c, engine, cv)}});
  stream.wait();
  EXPECT_FLOAT_EQ(cv[0], 4);
  EXPECT_FLOAT_EQ(cv[3], 11);
}

TEST(SystemLibrariesTest, Sqlite) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  EXPECT_EQ(
      sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nullptr, nullptr, nullptr),
      SQLITE_OK);
  sqlite3_close(db);
}

TEST(SystemLibrariesTest, YamlCpp) {
  YAML::Node node = YAML::Load("a: [1, 2]");
  EXPECT_EQ(node["a"][1].as<int>(), 2);
}

TEST(SystemLibrariesTest, Zlib) { EXPECT_NE(std::string(zlibVersion()), ""); }

}  // namespace
