#include "server/worker_registry.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
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

// What probes may use, kept between heartbeats and rebuilt at each change
// of a worker's state.
TEST(WorkerRegistryTest, AvailabilityFollowsEveryChangeOfAWorkersState) {
  absl::Time now = absl::FromUnixSeconds(0);
  WorkerRegistry registry(absl::Seconds(3), [&] { return now; });
  using Names = std::set<std::string>;
  auto caps = Caps();
  const std::string a = *registry.Register("a", caps);
  caps.set_listen_address("y:2");
  const std::string b = *registry.Register("b", caps);
  std::shared_ptr<const WorkerAvailability> seen = registry.Availability();
  EXPECT_EQ(seen->address, (std::map<std::string, std::string>{{"a", "x:1"}, {"b", "y:2"}}));
  EXPECT_TRUE(seen->busy.empty() && seen->absent.empty() && seen->unavailable.empty());
  ASSERT_TRUE(registry.Heartbeat(a).ok());
  registry.NoteAchievedRate(a, 1);
  EXPECT_EQ(registry.Availability(), seen) << "nothing changed: the same, not rebuilt";

  registry.SetJob(a, "job-1");
  seen = registry.Availability();
  EXPECT_EQ(seen->busy, Names{"a"});
  EXPECT_EQ(seen->unavailable, Names{"a"});
  ASSERT_TRUE(registry.SetDrained("b", true).ok());
  seen = registry.Availability();
  EXPECT_EQ(seen->absent, Names{"b"});
  EXPECT_EQ(seen->unavailable, (Names{"a", "b"}));
  registry.SetJob(a, "");
  ASSERT_TRUE(registry.SetDrained("b", false).ok());
  seen = registry.Availability();
  EXPECT_TRUE(seen->busy.empty() && seen->absent.empty() && seen->unavailable.empty());

  ASSERT_TRUE(registry.Leave(b).ok());
  seen = registry.Availability();
  EXPECT_EQ(seen->absent, Names{"b"});
  EXPECT_EQ(seen->address.count("b"), 0u) << "lost: no address";
  now += absl::Seconds(4);
  ASSERT_EQ(registry.ExpireLeases().size(), 1u);
  EXPECT_EQ(registry.Availability()->absent, (Names{"a", "b"})) << "a's lease lapsed";
  const std::string c = *registry.Register("c", Caps());
  EXPECT_EQ(registry.Availability()->address.count("c"), 1u);
  ASSERT_EQ(registry.ExpireSilent({c}, absl::ZeroDuration()).size(), 0u) << "it registered just now";
  now += absl::Seconds(1);
  ASSERT_EQ(registry.ExpireSilent({c}, absl::ZeroDuration()).size(), 1u);
  EXPECT_EQ(registry.Availability()->absent, (Names{"a", "b", "c"}));
  EXPECT_EQ(registry.forgotten(), 0u);
  now += WorkerRegistry::kLostRetention + absl::Seconds(1);
  registry.ExpireLeases();
  EXPECT_TRUE(registry.Availability()->absent.empty()) << "forgotten";
  EXPECT_EQ(registry.forgotten(), 3u);
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

// Rates that recover: an idle worker whose jobs' reports said it was much
// slower than its probe is asked to measure again (after kComputeProbeIdle
// idle, then not within its wait); a fresh probe as fast as its
// registration's sets those reports aside, a slow one leaves them; reports
// that contradict a fresh probe double the wait, agreeing ones reset it.
TEST(WorkerRegistryTest, AnIdleWorkerSlowerThanItsProbeMeasuresAgainAndAFastProbeSetsItsReportsAside) {
  absl::Time now = absl::FromUnixSeconds(0);
  WorkerRegistry registry(absl::Hours(10), [&] { return now; });
  shardline::v1::WorkerCapabilities caps = Caps();
  caps.set_gemm_flops(1e10);
  const std::string a = *registry.Register("a", caps), b = *registry.Register("b", caps),
                    c = *registry.Register("c", caps);
  for (const std::string& id : {a, b, c}) registry.SetJob(id, "job-1");
  auto report = [&](const std::string& id, double flops) {
    for (int i = 0; i < 20; ++i) registry.NoteAchievedRate(id, flops);
  };
  report(a, 5e9);
  report(b, 5e9);
  report(c, 1e9);  // its machine got busy: a fifth of the others' ratio
  EXPECT_FALSE(registry.AskComputeProbe(c)) << "busy";
  registry.SetJob(c, "");
  now += kComputeProbeIdle - absl::Seconds(1);
  EXPECT_FALSE(registry.AskComputeProbe(c)) << "not idle long enough";
  EXPECT_FALSE(registry.AskComputeProbe(a)) << "busy, and as fast as its probe says";
  now += absl::Seconds(1);
  ASSERT_TRUE(registry.AskComputeProbe(c));
  EXPECT_FALSE(registry.AskComputeProbe(c)) << "asked once a wait";
  EXPECT_FALSE(registry.NoteComputeProbe(a, 1e10)) << "a busy worker's probe reads its job's load";

  // Still busy: the probe reads low, the reports stand.
  EXPECT_FALSE(registry.NoteComputeProbe(c, 0.6e10));
  EXPECT_DOUBLE_EQ(registry.Idle()[0].planning_flops, 1e9);
  now += kComputeProbeWait;
  ASSERT_TRUE(registry.AskComputeProbe(c)) << "asked again after its wait";

  // As fast as when it registered: planned on its probe again.
  EXPECT_TRUE(registry.NoteComputeProbe(c, 0.8e10));
  WorkerRecord fresh = *registry.Get(c);
  EXPECT_EQ(fresh.achieved_reports, 0);
  EXPECT_DOUBLE_EQ(fresh.capabilities.gemm_flops(), 1e10) << "its registration's rate stays its probe";
  EXPECT_DOUBLE_EQ(registry.Idle()[0].planning_flops, 5e9) << "the others' ratio times its probe";
  now += kComputeProbeWait;
  EXPECT_FALSE(registry.AskComputeProbe(c)) << "no reports to doubt";

  // Its next job reports it slow again: the probe misled, the wait doubles.
  registry.SetJob(c, "job-2");
  report(c, 1e9);
  EXPECT_EQ(registry.Get(c)->compute_probe_wait, 2 * kComputeProbeWait);
  registry.SetJob(c, "");
  now += kComputeProbeIdle;
  ASSERT_TRUE(registry.AskComputeProbe(c));
  now += 2 * kComputeProbeWait - absl::Seconds(1);
  EXPECT_FALSE(registry.AskComputeProbe(c)) << "within the doubled wait";
  now += absl::Seconds(1);
  ASSERT_TRUE(registry.AskComputeProbe(c));
  ASSERT_TRUE(registry.NoteComputeProbe(c, 1e10));
  // This time its reports agree: the wait is back to its first.
  registry.SetJob(c, "job-3");
  report(c, 5e9);
  EXPECT_EQ(registry.Get(c)->compute_probe_wait, kComputeProbeWait);
  EXPECT_FALSE(registry.Get(c)->compute_rebased);

  // Drained or lost workers are not asked.
  report(c, 1e9);
  registry.SetJob(c, "");
  now += kComputeProbeMaxWait;
  ASSERT_TRUE(registry.SetDrained("c", true).ok());
  EXPECT_FALSE(registry.AskComputeProbe(c));
  ASSERT_TRUE(registry.SetDrained("c", false).ok());
  ASSERT_TRUE(registry.Leave(c).ok());
  EXPECT_FALSE(registry.AskComputeProbe(c));
  EXPECT_FALSE(registry.NoteComputeProbe(c, 1e10));
  EXPECT_FALSE(registry.AskComputeProbe("worker-404"));
}

}  // namespace
}  // namespace shardline::server
