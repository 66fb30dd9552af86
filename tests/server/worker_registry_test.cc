#include "server/worker_registry.h"

#include <cmath>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace shardline::server {
namespace {

shardline::v1::WorkerCapabilities Caps() {
  shardline::v1::WorkerCapabilities caps;
  caps.set_listen_address("x:1");
  caps.set_gemm_flops(1);
  caps.set_memory_bytes(1);
  return caps;
}

TEST(WorkerRegistryTest, LeasesLapseWithoutHeartbeats) {
  absl::Time now = absl::FromUnixSeconds(0);
  WorkerRegistry registry(absl::Seconds(3), [&] { return now; });
  const shardline::v1::WorkerCapabilities caps = Caps();
  const std::string a = *registry.Register("a", caps), b = *registry.Register("b", caps);
  now += absl::Seconds(2);
  ASSERT_TRUE(registry.Heartbeat(a).ok());
  now += absl::Seconds(2);
  const auto lost = registry.ExpireLeases();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].id, b);
  EXPECT_EQ(registry.Heartbeat(b).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry.ExpireLeases().empty()) << "reported once";
  EXPECT_TRUE(registry.Register("b", caps).ok()) << "a lost worker's name can be used again";
  EXPECT_EQ(registry.Register("a", caps).status().code(), absl::StatusCode::kAlreadyExists);
}

// The hostile-client probe: lost workers were never removed.
TEST(WorkerRegistryTest, LostWorkersAreForgottenAfterTheRetention) {
  absl::Time now = absl::FromUnixSeconds(0);
  WorkerRegistry registry(absl::Seconds(3), [&] { return now; });
  const std::string a = *registry.Register("a", Caps());
  ASSERT_TRUE(registry.Leave(a).ok());
  now += WorkerRegistry::kLostRetention - absl::Seconds(1);
  registry.ExpireLeases();
  ASSERT_EQ(registry.List().size(), 1u) << "still shown a while";
  EXPECT_TRUE(registry.List()[0].lost);
  now += absl::Seconds(2);
  registry.ExpireLeases();
  EXPECT_TRUE(registry.List().empty());
  EXPECT_EQ(registry.Get(a).status().code(), absl::StatusCode::kNotFound);
}

TEST(WorkerRegistryTest, AFullRegistryMakesRoomFromTheLostOnly) {
  absl::Time now = absl::FromUnixSeconds(0);
  WorkerRegistry registry(absl::Hours(1), [&] { return now; });
  std::string first;
  for (size_t i = 0; i < WorkerRegistry::kMaxWorkers; ++i) {
    auto id = registry.Register("w" + std::to_string(i), Caps());
    ASSERT_TRUE(id.ok()) << id.status();
    if (i == 0) first = *id;
  }
  auto refused = registry.Register("one-too-many", Caps());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(registry.Leave(first).ok());
  EXPECT_TRUE(registry.Register("one-too-many", Caps()).ok()) << "the lost record made room";
  EXPECT_EQ(registry.List().size(), WorkerRegistry::kMaxWorkers);
}

TEST(WorkerRegistryTest, ABadNameIsQuotedInPart) {
  WorkerRegistry registry(absl::Seconds(3));
  auto refused = registry.Register(std::string(1 << 20, '!'), Caps());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_LT(refused.status().message().size(), 200u);
}

TEST(WorkerRegistryTest, AbsurdRatesAreRefused) {
  WorkerRegistry registry(absl::Seconds(3));
  for (double spread : {-0.1, 10.5, std::nan("")}) {
    auto caps = Caps();
    caps.set_gemm_flops_spread(spread);
    EXPECT_EQ(registry.Register("w", caps).status().code(), absl::StatusCode::kInvalidArgument) << spread;
  }
  auto infinite = Caps();
  infinite.set_gemm_flops(std::numeric_limits<double>::infinity());
  EXPECT_EQ(registry.Register("w", infinite).status().code(), absl::StatusCode::kInvalidArgument);
  auto fine = Caps();
  fine.set_gemm_flops_spread(0.2);
  EXPECT_TRUE(registry.Register("w", fine).ok());
}

// Achieved rates: a moving average of the reports, absurd ones dropped,
// planned with from the kMinAchievedReports-th on.
TEST(WorkerRegistryTest, AchievedRatesAverageTheReportsAndDropAbsurdOnes) {
  WorkerRegistry registry(absl::Seconds(3));
  auto caps = Caps();
  caps.set_gemm_flops(100);
  const std::string w = *registry.Register("w", caps);
  for (double absurd : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 100.0 * 100 + 1}) {
    registry.NoteAchievedRate(w, absurd);
  }
  registry.NoteAchievedRate("nobody", 50);
  EXPECT_EQ(registry.Get(w)->achieved_reports, 0);
  EXPECT_EQ(registry.Idle()[0].planning_flops, 100) << "the GEMM rate until reports come";
  registry.NoteAchievedRate(w, 50);
  registry.NoteAchievedRate(w, 40);
  EXPECT_NEAR(registry.Get(w)->achieved_flops, 0.8 * 50 + 0.2 * 40, 1e-12);
  EXPECT_EQ(registry.Idle()[0].planning_flops, 100) << "two reports are not yet enough";
  registry.NoteAchievedRate(w, 40);
  EXPECT_NEAR(registry.Idle()[0].planning_flops, 0.8 * 48 + 0.2 * 40, 1e-12);
}

// Equal probes whose achieved rates differ by less than kRateDisagreement
// (which layers each ran) are planned equal, at the achieved scale; one
// whose reports fall far below its probe is planned at what it achieved.
TEST(WorkerRegistryTest, PlanningRatesKeepEqualProbesEqualUnlessTheReportsDisagree) {
  WorkerRegistry registry(absl::Seconds(3));
  auto caps = Caps();
  caps.set_gemm_flops(100);
  const std::string a = *registry.Register("a", caps), b = *registry.Register("b", caps),
                    c = *registry.Register("c", caps);
  for (int i = 0; i < 3; ++i) {
    registry.NoteAchievedRate(a, 50);
    registry.NoteAchievedRate(b, 44);
    registry.NoteAchievedRate(c, 20);
  }
  const std::vector<WorkerRecord> idle = registry.Idle();
  ASSERT_EQ(idle.size(), 3u);
  EXPECT_DOUBLE_EQ(idle[0].planning_flops, 44);  // 100 × the median ratio, 0.44
  EXPECT_DOUBLE_EQ(idle[1].planning_flops, 44);
  EXPECT_DOUBLE_EQ(idle[2].planning_flops, 20) << "c's reports disagree with its probe";
}

}  // namespace
}  // namespace shardline::server
