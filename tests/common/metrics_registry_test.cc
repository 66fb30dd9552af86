// MetricsRegistry's exposition, to the byte, and MetricsHttpServer serving
// it over real HTTP on loopback.
#include "common/metrics_registry.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metrics_http_server.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(MetricsRegistryTest, ExposesEveryKindSortedWithHelpTypeAndEscapedLabels) {
  MetricsRegistry registry;
  registry.GetCounter("b_bytes_total", "bytes moved", {{"direction", "sent"}}).Add(1536);
  registry.GetCounter("b_bytes_total", "bytes moved", {{"direction", "sent"}}).Add(0.5);
  registry.GetCounter("b_bytes_total", "bytes moved", {{"direction", "sent"}}).Add(-7);  // ignored
  registry.GetGauge("a_jobs", "jobs by state", {{"state", "RUNNING"}}).Set(2);
  registry.GetGauge("a_jobs", "jobs by state", {{"state", "say \"hi\"\\\n"}}).Set(-1);
  Histogram& h = registry.GetHistogram("c_seconds", "step time\nin seconds", {0.1, 1}, {{"stage", "0"}});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.Observe(v);
  registry.GetHistogram("d_plain_seconds", "no labels", {1}).Observe(2);
  EXPECT_EQ(registry.Exposition(),
            "# HELP a_jobs jobs by state\n"
            "# TYPE a_jobs gauge\n"
            "a_jobs{state=\"RUNNING\"} 2\n"
            "a_jobs{state=\"say \\\"hi\\\"\\\\\\n\"} -1\n"
            "# HELP b_bytes_total bytes moved\n"
            "# TYPE b_bytes_total counter\n"
            "b_bytes_total{direction=\"sent\"} 1536.5\n"
            "# HELP c_seconds step time\\nin seconds\n"
            "# TYPE c_seconds histogram\n"
            "c_seconds_bucket{stage=\"0\",le=\"0.1\"} 2\n"
            "c_seconds_bucket{stage=\"0\",le=\"1\"} 3\n"
            "c_seconds_bucket{stage=\"0\",le=\"+Inf\"} 4\n"
            "c_seconds_sum{stage=\"0\"} 3.65\n"
            "c_seconds_count{stage=\"0\"} 4\n"
            "# HELP d_plain_seconds no labels\n"
            "# TYPE d_plain_seconds histogram\n"
            "d_plain_seconds_bucket{le=\"1\"} 0\n"
            "d_plain_seconds_bucket{le=\"+Inf\"} 1\n"
            "d_plain_seconds_sum 2\n"
            "d_plain_seconds_count 1\n");
}

TEST(MetricsRegistryTest, RemovingALabelsValueTakesExactlyTheSeriesThatHaveIt) {
  MetricsRegistry registry;
  registry.GetCounter("steps_total", "steps", {{"job_id", "job-1"}}).Add(3);
  registry.GetCounter("steps_total", "steps", {{"job_id", "job-12"}}).Add(4);  // a longer value
  registry.GetGauge("busy", "busy", {{"job_id", "job-1"}, {"stage", "0"}}).Set(0.5);
  registry.GetGauge("busy", "busy", {{"stage", "job-1"}, {"job_id", "job-2"}}).Set(0.25);  // another label
  registry.GetGauge("only_one", "a family left empty", {{"job_id", "job-1"}}).Set(1);
  registry.GetGauge("odd", "a value that quotes the pair", {{"note", "job_id=\"job-1\""}}).Set(2);
  EXPECT_EQ(registry.RemoveSeries("job_id", "job-1"), 3);
  EXPECT_EQ(registry.RemoveSeries("job_id", "job-1"), 0);
  EXPECT_EQ(registry.Exposition(),
            "# HELP busy busy\n"
            "# TYPE busy gauge\n"
            "busy{stage=\"job-1\",job_id=\"job-2\"} 0.25\n"
            "# HELP odd a value that quotes the pair\n"
            "# TYPE odd gauge\n"
            "odd{note=\"job_id=\\\"job-1\\\"\"} 2\n"
            "# HELP steps_total steps\n"
            "# TYPE steps_total counter\n"
            "steps_total{job_id=\"job-12\"} 4\n");
}

TEST(MetricsRegistryTest, RefreshesRunBeforeEachExpositionAndCountersAddUpAcrossThreads) {
  MetricsRegistry registry;
  int refreshes = 0;
  registry.AddRefresh([&] { registry.GetGauge("g", "refreshed").Set(++refreshes); });
  EXPECT_TRUE(absl::StrContains(registry.Exposition(), "\ng 1\n"));
  EXPECT_TRUE(absl::StrContains(registry.Exposition(), "\ng 2\n"));

  Counter& counter = registry.GetCounter("n_total", "adds");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) counter.Add();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(counter.value(), 40000);
}

// One HTTP/1.1 request to 127.0.0.1:`port`; the whole response.
std::string Request(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "cannot connect";
  }
  (void)!::write(fd, request.data(), request.size());
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

TEST(MetricsHttpServerTest, ServesTheExpositionAtMetricsAndNothingElse) {
  MetricsRegistry registry;
  registry.GetCounter("shardline_test_total", "a test counter").Add(3);
  auto server = MetricsHttpServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  const std::string ok = Request((*server)->port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) << ok;
  const std::string body = registry.Exposition();
  EXPECT_TRUE(absl::EndsWith(ok, "\r\n\r\n" + body)) << ok;
  EXPECT_TRUE(absl::StrContains(ok, absl::StrCat("Content-Length: ", body.size(), "\r\n"))) << ok;

  const std::string missing = Request((*server)->port(), "GET /etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(missing, "HTTP/1.1 404")) << missing;
  const std::string post = Request((*server)->port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(post, "HTTP/1.1 405")) << post;
  // It keeps serving after bad requests.
  EXPECT_TRUE(absl::StartsWith(Request((*server)->port(), "GET /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 200"));
}

TEST(MetricsHttpServerTest, RefusesAMalformedAddressAndATakenPort) {
  MetricsRegistry registry;
  for (const std::string bad : {"", "9100", "host", "127.0.0.1:http", "127.0.0.1:70000", "a,b:1", "[::1:0"}) {
    auto server = MetricsHttpServer::Start(bad, registry);
    ASSERT_FALSE(server.ok()) << bad;
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  auto first = MetricsHttpServer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok());
  auto second = MetricsHttpServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace shardline::common
