// LinkTable's links in doubt and their checks (link_table.h): what puts a
// link in doubt, which checks may run beside a job, and what a link found
// back ends.
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/link_table.h"

namespace shardline::server {
namespace {

class LinkChecksTest : public ::testing::Test {
 protected:
  // a, b, c, d, each on a host of its own, every direction probed at 100 MB/s.
  void SetUp() override {
    for (const std::string n : {"a", "b", "c", "d"}) table_.Joined(n, "h" + n, {});
    for (const std::string from : {"a", "b", "c", "d"}) {
      std::vector<LinkRecord> links;
      for (const std::string to : {"a", "b", "c", "d"}) {
        if (to != from) links.push_back(Measured(to, 1e8));
      }
      table_.Record(from, links);
    }
  }
  static LinkRecord Measured(const std::string& to, double bytes_per_second) {
    LinkRecord link;
    link.to = to;
    link.bytes_per_second = bytes_per_second;
    return link;
  }
  double FastBefore(const std::string& from, const std::string& to) { return table_.Get(from, to)->fast_before; }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  LinkTable table_{[this] { return now_; }};
};

TEST_F(LinkChecksTest, ALinkSlowerThanBeforeIsInDoubtUntilFoundBackOrItsJobSeesItBack) {
  EXPECT_EQ(FastBefore("a", "b"), 0);
  table_.Record("a", {Measured("b", 5e7)});
  EXPECT_EQ(FastBefore("a", "b"), 0) << "half as fast: within the probes' 3x";
  table_.Record("a", {Measured("b", 1e7)});
  EXPECT_EQ(FastBefore("a", "b"), 5e7) << "over 3x slower than its probe before";
  table_.Record("a", {Measured("b", 2e6)});
  EXPECT_EQ(FastBefore("a", "b"), 5e7) << "still slow: the figure before it slowed is kept";
  table_.Record("a", {Measured("b", 2e7)});
  EXPECT_EQ(FastBefore("a", "b"), 0) << "within 3x of it again";
  EXPECT_EQ(table_.recoveries(), 1u);
  const std::vector<LinkRecovery> back = table_.RecoveredSince(0);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].number, 1u);
  EXPECT_EQ(back[0].from, "a");
  EXPECT_EQ(back[0].to, "b");
  EXPECT_EQ(back[0].what, "a -> b carries 160 Mbit/s again (16 Mbit/s while slow, 400 before)");
  EXPECT_TRUE(table_.RecoveredSince(1).empty());

  // A job's streams: the pace they had before, or the probe's if faster.
  table_.Observe("c", "d", 1e6, "job-1", 2e8);
  EXPECT_EQ(FastBefore("c", "d"), 2e8);
  table_.Observe("d", "c", 1e6, "job-1", 5e7);
  EXPECT_EQ(FastBefore("d", "c"), 1e8);
  table_.ForgetObserved("c", "d");
  EXPECT_EQ(FastBefore("c", "d"), 0) << "its job's frames arrive at their pace again";
  EXPECT_EQ(table_.recoveries(), 1u) << "the job on it saw it: nothing to weigh";
}

// The last kRecoveriesKept are told one by one; older ones are counted.
TEST_F(LinkChecksTest, TheLinksFoundBackAreKeptInOrderTheOldestCounted) {
  table_.Record("a", {Measured("b", 5e7)});
  const uint64_t n = LinkTable::kRecoveriesKept + 44;
  for (uint64_t i = 0; i < n; ++i) {
    table_.Record("a", {Measured("b", 1e6)});
    table_.Record("a", {Measured("b", 5e7)});
  }
  ASSERT_EQ(table_.recoveries(), n);
  uint64_t forgotten = 0;
  std::vector<LinkRecovery> back = table_.RecoveredSince(0, &forgotten);
  EXPECT_EQ(back.size(), LinkTable::kRecoveriesKept);
  EXPECT_EQ(forgotten, 44u);
  EXPECT_EQ(back.front().number, 45u);
  back = table_.RecoveredSince(n - 10, &forgotten);
  ASSERT_EQ(back.size(), 10u);
  EXPECT_EQ(forgotten, 0u);
  for (uint64_t i = 0; i < back.size(); ++i) EXPECT_EQ(back[i].number, n - 9 + i);
  EXPECT_TRUE(table_.RecoveredSince(n, &forgotten).empty());
  EXPECT_EQ(forgotten, 0u);
}

// A worker that joined while jobs run: its links never measured are
// checked from a busy end only towards a peer that is not busy (two busy
// ends' jobs would share the transfer), and from an idle one towards busy
// peers; with every worker busy nothing is handed out.
TEST_F(LinkChecksTest, ALinkNeverMeasuredIsCheckedWithExactlyOneEndBusy) {
  table_.Joined("e", "he", {"a", "b", "c", "d", "e"});
  const std::set<std::string> all = {"a", "b", "c", "d", "e"};
  for (const std::string& w : all) EXPECT_FALSE(table_.ClaimCheck(w, all).has_value()) << w << ": all busy";
  EXPECT_FALSE(table_.ClaimCheck("a", {"a", "b", "c", "d"}, {"e"}).has_value()) << "e absent: none idle";
  EXPECT_TRUE(table_.CheckDue("a")) << "due: only who is busy keeps it from running";
  std::optional<std::string> peer = table_.ClaimCheck("a", {"a", "b", "c", "d"});
  EXPECT_EQ(peer, "e") << "a busy, e idle";
  table_.Record("a", {Measured("e", 1e8)});
  peer = table_.ClaimCheck("e", {"e"});
  ASSERT_TRUE(peer.has_value()) << "e busy, its peers idle";
  table_.Record("e", {Measured(*peer, 1e8)});
  const std::optional<std::string> next = table_.ClaimCheck("e", {"a", "b", "c", "d"});
  ASSERT_TRUE(next.has_value()) << "e idle, its peers busy";
  EXPECT_NE(*next, *peer) << "measured now";
}

TEST_F(LinkChecksTest, ALinkWithinOneHostIsMemoryNeverInDoubtNorChecked) {
  table_.Joined("e", "ha", {});  // on a's host
  table_.Record("a", {Measured("e", 1e9)});
  table_.Record("a", {Measured("e", 1e8)});  // the host got busy
  EXPECT_EQ(FastBefore("a", "e"), 0);
  table_.Observe("e", "a", 1e6, "job-1", 1e9);
  EXPECT_EQ(FastBefore("e", "a"), 0);
  table_.Joined("f", "ha", {"a", "b", "f"});  // joins on a's host: its links to a are memory
  now_ += LinkTable::kCheckEvery;
  EXPECT_EQ(table_.ClaimCheck("f", {"a", "b"}), "b") << "its link to b, on another host, is checked";
  table_.Record("f", {Measured("b", 1e8)});
  EXPECT_FALSE(table_.ClaimCheck("f", {"a", "b"}).has_value()) << "f -> a: assumed, not checked";
  EXPECT_FALSE(table_.ClaimCheck("a", {"a", "b"}).has_value()) << "a -> f, e <-> a: within one host";
}

TEST_F(LinkChecksTest, ChecksRunWithOneEndBusyOnHostsInNoOtherProbeOneAtATime) {
  table_.Record("a", {Measured("b", 1e6), Measured("c", 1e6), Measured("d", 1e6)});
  table_.Record("b", {Measured("c", 1e6)});
  EXPECT_FALSE(table_.ClaimCheck("a", {"b", "c", "d"}).has_value()) << "not due before kCheckEvery";
  now_ += LinkTable::kCheckEvery;
  EXPECT_FALSE(table_.ClaimCheck("b", {"b", "c"}).has_value()) << "both ends busy: two jobs' wires";
  EXPECT_FALSE(table_.ClaimCheck("a", {"b", "c", "d"}, {"b", "c", "d"}).has_value()) << "peers lost or drained";
  const std::optional<std::string> first = table_.ClaimCheck("a", {"b", "c", "d"}, {"c"});
  EXPECT_EQ(first, "b") << "a is idle, b busy: checked (c is lost)";
  EXPECT_FALSE(table_.ClaimCheck("a", {"b", "c", "d"}).has_value()) << "a checks one link at a time";
  EXPECT_FALSE(table_.ClaimCheck("b", {"a"}).has_value()) << "b's host is in a's check";
  EXPECT_EQ(table_.probing(), 1);
  EXPECT_TRUE(table_.HostProbing("b")) << "no GEMM probe beside it";
  table_.Record("a", {Measured("b", 1e6)});
  EXPECT_EQ(table_.ClaimCheck("a", {"b", "c", "d"}), "c");
  table_.Record("a", {Measured("c", 1e6)});
  EXPECT_EQ(table_.ClaimCheck("a", {"b", "c", "d"}), "d");
  table_.Record("a", {Measured("d", 1e6)});
  EXPECT_FALSE(table_.ClaimCheck("a", {"b", "c", "d"}).has_value()) << "each waits twice as long now";
  now_ += 2 * LinkTable::kCheckEvery;  // a's are due again; a -> d alone shares no host with b -> c
  EXPECT_EQ(table_.ClaimCheck("b", {"c"}), "c") << "b idle, c busy";
  LinkRecord failed;
  failed.to = "c";
  failed.error = "RESOURCE_EXHAUSTED: c already serves 2 link probes";
  table_.Record("b", {failed});
  EXPECT_FALSE(table_.ClaimCheck("b", {"c"}).has_value()) << "a check that failed waits as one that found it slow";
  EXPECT_EQ(table_.Get("b", "c")->bytes_per_second, 1e6) << "its figures kept";
  now_ += 2 * LinkTable::kCheckEvery;
  EXPECT_EQ(table_.ClaimCheck("b", {"c"}), "c");
  table_.SetConcurrentProbes(1);
  EXPECT_FALSE(table_.ClaimCheck("a", {"b", "c", "d"}).has_value()) << "within the cap";
  table_.SetConcurrentProbes(2);
  EXPECT_EQ(table_.ClaimCheck("a", {"b", "c", "d"}), "d");
}

TEST_F(LinkChecksTest, ALinkFoundBackEndsItsEndsSuspicionAndTheirOtherChecksAreDueAtOnce) {
  // a's own link slowed: a job saw a -> b and c -> a slow.
  table_.Observe("a", "b", 1e6, "job-1", 1e8);
  ASSERT_EQ(table_.Observe("c", "a", 1e6, "job-1", 1e8), std::vector<std::string>{"a"});
  now_ += LinkTable::kCheckEvery;
  EXPECT_EQ(table_.ClaimCheck("a", {"b", "c", "d"}), "b");
  table_.Record("a", {Measured("b", 1e6)});  // next in 2 kCheckEvery
  now_ += LinkTable::kCheckEvery;
  EXPECT_EQ(table_.ClaimCheck("c", {"b", "c", "d"}), "a") << "c is busy, a idle: c checks its link into a";
  table_.Record("c", {Measured("a", 1e6)});  // next in 2 kCheckEvery
  EXPECT_TRUE(table_.Suspected("a").has_value());
  now_ += LinkTable::kCheckEvery;
  EXPECT_FALSE(table_.ClaimCheck("c", {"b", "c", "d"}).has_value()) << "c -> a is not due yet";
  EXPECT_EQ(table_.ClaimCheck("a", {"b", "c", "d"}), "b");
  table_.Record("a", {Measured("b", 9e7)});
  EXPECT_FALSE(table_.Suspected("a").has_value()) << "its link carries its pace again";
  EXPECT_EQ(table_.recoveries(), 1u);
  EXPECT_EQ(table_.ClaimCheck("c", {"b", "c", "d"}), "a") << "due at once, not after its doubled wait";
  table_.Record("c", {Measured("a", 9e7)});
  EXPECT_EQ(table_.recoveries(), 2u);
  EXPECT_EQ(table_.Get("c", "a")->bytes_per_second, 9e7) << "the check's figure is the link's";
}

TEST_F(LinkChecksTest, ACheckIsALowerBoundProbedAgainOnceBothEndsAreIdle) {
  table_.Record("a", {Measured("b", 1e6)});  // in doubt
  EXPECT_FALSE(table_.Get("a", "b")->checked) << "a probe's figure";
  now_ += LinkTable::kCheckEvery;
  ASSERT_EQ(table_.ClaimCheck("a", {"b"}), "b");
  table_.Record("a", {Measured("b", 2e6)});  // beside b's job: still slow
  EXPECT_TRUE(table_.Get("a", "b")->checked);
  EXPECT_EQ(table_.QueuedFrom("a"), std::vector<std::string>{"b"}) << "a probe to replace the check's figure";
  EXPECT_FALSE(table_.Claim("a", {"b"}).has_value()) << "b is busy: a plain probe waits";
  now_ += 2 * LinkTable::kCheckEvery;
  ASSERT_EQ(table_.ClaimCheck("a", {"b"}), "b") << "checked as before meanwhile";
  LinkRecord failed;
  failed.to = "b";
  failed.error = "DEADLINE_EXCEEDED";
  table_.Record("a", {failed});
  EXPECT_TRUE(table_.Get("a", "b")->checked) << "the figure kept is the check's";
  EXPECT_EQ(table_.QueuedFrom("a"), std::vector<std::string>{"b"}) << "still waiting for its probe";

  now_ += 4 * LinkTable::kCheckEvery;
  ASSERT_EQ(table_.ClaimCheck("a", {"b"}), "b");
  table_.Record("a", {Measured("b", 4e7)});  // found back, at least
  EXPECT_EQ(table_.recoveries(), 1u);
  EXPECT_TRUE(table_.Get("a", "b")->checked);
  EXPECT_EQ(table_.Claim("a", {}), "b") << "both ends idle: probed";
  table_.Record("a", {Measured("b", 9e7)});
  EXPECT_FALSE(table_.Get("a", "b")->checked);
  EXPECT_EQ(table_.Get("a", "b")->bytes_per_second, 9e7) << "the probe's figure replaces the check's";
  EXPECT_TRUE(table_.QueuedFrom("a").empty());
  EXPECT_EQ(table_.recoveries(), 1u) << "found back once";
}

}  // namespace
}  // namespace shardline::server
