// A worker's link probes over a real LinkProbe service on loopback: each
// link is reported as it is measured, a report's answer names the next
// (the worker goes on without a heartbeat), targets handed over while a
// probe runs wait their turn instead of being dropped, and an unreachable
// peer is reported with its error.
#include "worker/grpc_link_probes.h"

#include <grpcpp/grpcpp.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/testing/loopback_server.h"
#include "worker/transport/link_probe_service.h"

namespace shardline::worker {
namespace {

shardline::v1::ProbeTarget Target(const std::string& worker, const std::string& address) {
  shardline::v1::ProbeTarget t;
  t.set_worker(worker);
  t.set_address(address);
  return t;
}

class GrpcLinkProbesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::shardline::testing::LoopbackServer started = ::shardline::testing::StartLoopbackServer({&service_});
    ASSERT_NE(started.server, nullptr);
    server_ = std::move(started.server);
    address_ = started.address();
  }
  void TearDown() override { server_->Shutdown(); }

  // Probes with small transfers, each growing to max_transfer_bytes
  // (none takes min_transfer_seconds, however starved the CPU); `next`
  // answers each report.
  std::unique_ptr<GrpcLinkProbes> Probes(
      std::function<std::vector<shardline::v1::ProbeTarget>(const std::string& measured)> next) {
    transport::LinkProbeOptions options;
    options.first_transfer_bytes = 64 << 10;
    options.max_transfer_bytes = 256 << 10;
    options.min_transfer_seconds = 60;
    options.chunk_bytes = 64 << 10;
    options.deadline = absl::Seconds(5);
    return std::make_unique<GrpcLinkProbes>(
        "10.0.0.9", grpc::InsecureChannelCredentials(),
        [this, next](const shardline::v1::ReportLinksRequest& r)
            -> absl::StatusOr<shardline::v1::ReportLinksResponse> {
          shardline::v1::ReportLinksResponse answer;
          absl::MutexLock lock(&mu_);
          reports_.push_back(r);
          if (r.links_size() == 1) {
            for (auto& t : next(r.links(0).to_worker())) *answer.add_probe_targets() = t;
          }
          return answer;
        },
        options);
  }

  std::vector<shardline::v1::ReportLinksRequest> AwaitReports(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&] { return reports_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return reports_;
  }

  transport::LinkProbeService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  absl::Mutex mu_;
  std::vector<shardline::v1::ReportLinksRequest> reports_ ABSL_GUARDED_BY(mu_);
};

TEST_F(GrpcLinkProbesTest, EachLinkIsReportedAsItEndsAndTheAnswerNamesTheNext) {
  auto probes = Probes([this](const std::string& measured) -> std::vector<shardline::v1::ProbeTarget> {
    if (measured == "b") return {Target("c", address_)};
    return {};
  });
  probes->Start("worker-1", {Target("b", address_)});
  const auto reports = AwaitReports(2);
  ASSERT_EQ(reports.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(reports[i].worker_id(), "worker-1");
    ASSERT_EQ(reports[i].links_size(), 1) << "one link a report";
    EXPECT_EQ(reports[i].links(0).error(), "");
    EXPECT_GT(reports[i].links(0).bytes_per_second(), 1e6) << "loopback moves more than a MB/s";
    EXPECT_GT(reports[i].links(0).rtt_seconds(), 0);
  }
  EXPECT_EQ(reports[0].links(0).to_worker(), "b");
  EXPECT_EQ(reports[1].links(0).to_worker(), "c") << "named by the first report's answer";
  probes->Stop();
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(reports_.size(), 2u) << "nothing more was asked for";
}

// A check of a link in doubt (run beside a job) is bounded by its
// target's max_transfer_bytes; a plain probe grows to the worker's own.
TEST_F(GrpcLinkProbesTest, ACheckTargetBoundsItsTransfers) {
  auto probes = Probes([](const std::string&) { return std::vector<shardline::v1::ProbeTarget>(); });
  shardline::v1::ProbeTarget check = Target("b", address_);
  check.set_max_transfer_bytes(32 << 10);
  probes->Start("worker-1", {check});
  auto reports = AwaitReports(1);
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].links(0).error(), "");
  EXPECT_GT(service_.largest_sink(), 0);
  EXPECT_LE(service_.largest_sink(), 32 << 10);
  probes->Start("worker-1", {Target("c", address_)});
  reports = AwaitReports(2);
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_EQ(service_.largest_sink(), 256 << 10) << "grows to the worker's own limit";
  probes->Stop();
}

TEST_F(GrpcLinkProbesTest, TargetsHandedOverWhileAProbeRunsWaitTheirTurnAndAnUnreachablePeerIsReported) {
  auto probes = Probes([](const std::string&) { return std::vector<shardline::v1::ProbeTarget>{}; });
  probes->Start("worker-1", {Target("b", address_)});
  probes->Start("worker-1", {Target("down", "127.0.0.1:1")});  // nothing listens on port 1
  probes->Start("worker-1", {Target("c", address_)});
  const auto reports = AwaitReports(3);
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].links(0).to_worker(), "b");
  EXPECT_EQ(reports[1].links(0).to_worker(), "down");
  EXPECT_NE(reports[1].links(0).error(), "") << "the error, not a figure";
  EXPECT_EQ(reports[1].links(0).bytes_per_second(), 0);
  EXPECT_EQ(reports[2].links(0).to_worker(), "c");
  EXPECT_EQ(reports[2].links(0).error(), "");
}

TEST_F(GrpcLinkProbesTest, StopEndsTheRoundAndNothingStartsAfterIt) {
  auto probes = Probes([this](const std::string&) { return std::vector<shardline::v1::ProbeTarget>{Target("b", address_)}; });
  probes->Start("worker-1", {Target("b", address_)});  // every answer names b again: only Stop ends it
  AwaitReports(2);
  probes->Stop();
  size_t after_stop;
  {
    absl::MutexLock lock(&mu_);
    after_stop = reports_.size();
  }
  probes->Start("worker-1", {Target("c", address_)});
  absl::SleepFor(absl::Milliseconds(200));
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(reports_.size(), after_stop) << "stopped: no round starts, no report goes out";
}

}  // namespace
}  // namespace shardline::worker
