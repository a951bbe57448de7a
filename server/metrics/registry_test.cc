// The registry's exposition text, checked line by line, and served over HTTP.
#include "server/metrics/registry.h"

#include <thread>

#include "gtest/gtest.h"
#include "httplib.h"
#include "server/metrics/http_exporter.h"

namespace tandem::metrics {
namespace {

TEST(RegistryTest, ExpositionFormat) {
  Registry registry;
  auto& requests = BuildCounter().Name("tandem_rpc_requests_total").Help("RPCs.\nBy method.").Register(registry);
  requests.Add({{"method", "SubmitJob"}, {"code", "OK"}}).Increment(3);
  auto& loss = BuildGauge().Name("tandem_job_loss").Help("Loss.").Register(registry);
  loss.Add({{"job_id", "job-1"}}).Set(0.25);
  loss.Add({{"job_id", "we\"ird\\"}}).Set(-1);
  auto& latency = BuildHistogram()
                      .Name("tandem_rpc_duration_seconds")
                      .Help("Latency.")
                      .Buckets({0.001, 0.01})
                      .Register(registry);
  auto& h = latency.Add({{"method", "GetJob"}});
  h.Observe(0.0005);
  h.Observe(0.005);
  h.Observe(1);
  const std::string text = registry.Serialize();
  EXPECT_NE(text.find("# HELP tandem_rpc_requests_total RPCs.\\nBy method.\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE tandem_rpc_requests_total counter\n"), std::string::npos);
  EXPECT_NE(text.find("tandem_rpc_requests_total{code=\"OK\",method=\"SubmitJob\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_job_loss{job_id=\"job-1\"} 0.25\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_job_loss{job_id=\"we\\\"ird\\\\\"} -1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"0.001\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("tandem_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"0.01\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("tandem_rpc_duration_seconds_bucket{method=\"GetJob\",le=\"+Inf\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("tandem_rpc_duration_seconds_count{method=\"GetJob\"} 3\n"), std::string::npos);
  // Families sort by name.
  EXPECT_LT(text.find("tandem_job_loss"), text.find("tandem_rpc_duration_seconds"));
}

TEST(RegistryTest, CountersOnlyGoUpAndRemoveDropsTheSeries) {
  Registry registry;
  auto& family = BuildCounter().Name("x_total").Help("x").Register(registry);
  Counter& c = family.Add({{"a", "b"}});
  c.Increment(2);
  c.Increment(-5);
  EXPECT_EQ(c.Value(), 2);
  family.Remove({{"a", "b"}});
  EXPECT_EQ(registry.Serialize().find("x_total{"), std::string::npos);
}

TEST(RegistryTest, ConcurrentUpdatesAreNotLost) {
  Registry registry;
  Gauge& g = BuildGauge().Name("g").Help("g").Register(registry).Add({});
  Histogram& h = BuildHistogram().Name("h").Help("h").Buckets({1}).Register(registry).Add({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        g.Increment(0.5);
        h.Observe(0.5);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(g.Value(), 20000);
  EXPECT_EQ(h.Collect().count, 40000u);
  EXPECT_EQ(h.Collect().sum, 20000);
}

TEST(RegistryTest, AssignMirrorsAHistogramKeptElsewhere) {
  Registry registry;
  Histogram& h = BuildHistogram().Name("m_seconds").Help("m").Buckets({0.1, 1}).Register(registry).Add({});
  h.Observe(5);
  h.Assign({2, 3, 7}, 4.5);
  const Histogram::Snapshot s = h.Collect();
  EXPECT_EQ(s.cumulative, (std::vector<uint64_t>{2, 3, 7}));
  EXPECT_EQ(s.count, 7u);
  EXPECT_EQ(s.sum, 4.5);
  h.Assign({1, 2}, 9);  // wrong length: ignored
  EXPECT_EQ(h.Collect().count, 7u);
  EXPECT_NE(registry.Serialize().find("m_seconds_bucket{le=\"1\"} 3\n"), std::string::npos)
      << registry.Serialize();
}

TEST(HttpExporterTest, ServesMetricsOverHttp) {
  Registry registry;
  BuildGauge().Name("tandem_up").Help("up").Register(registry).Add({}).Set(1);
  int scrapes = 0;
  HttpExporter exporter(&registry, [&] { ++scrapes; });
  absl::StatusOr<int> port = exporter.Start("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  httplib::Client client("127.0.0.1", *port);
  auto response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_NE(response->body.find("tandem_up 1\n"), std::string::npos);
  EXPECT_NE(response->get_header_value("Content-Type").find("version=0.0.4"), std::string::npos);
  EXPECT_EQ(scrapes, 1);
  exporter.Stop();
}

}  // namespace
}  // namespace tandem::metrics
