#include "server/link_table.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/grid_cost.h"

namespace shardline::server {
namespace {

class LinkTableTest : public ::testing::Test {
 protected:
  absl::Time now_ = absl::FromUnixSeconds(1000);
  LinkTable table_{[this] { return now_; }};

  static LinkRecord Measured(const std::string& to, double bytes_per_second) {
    LinkRecord link;
    link.to = to;
    link.bytes_per_second = bytes_per_second;
    link.rtt_seconds = 1e-4;
    return link;
  }
};

TEST_F(LinkTableTest, AJoiningWorkerQueuesBothDirectionsToEveryPeer) {
  table_.Joined("a", "ha", {"a"});
  EXPECT_EQ(table_.pending(), 0) << "no link to itself";
  table_.Joined("b", "hb", {"a", "b"});
  table_.Joined("c", "hc", {"a", "b", "c"});
  EXPECT_EQ(table_.pending(), 6);
  EXPECT_EQ(table_.QueuedFrom("c"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(table_.Claim("c"), std::nullopt) << "the one probe that may leave a group is a's, to b";
  EXPECT_EQ(table_.Claim("a"), "b");
}

TEST_F(LinkTableTest, UntilGroupsAreKnownOneProbeRunsAtATimeUntilItReportsOrItsClaimLapses) {
  table_.Request({"a", "b", "c", "d"});
  ASSERT_EQ(table_.pending(), 12);
  EXPECT_EQ(table_.Claim("a"), "b");
  EXPECT_EQ(table_.probing(), 1);
  EXPECT_FALSE(table_.Claim("a").has_value()) << "a probes one link at a time";
  EXPECT_FALSE(table_.Claim("c").has_value()) << "nothing is known: a's probe may leave a group, c's to d too";
  table_.Record("a", {Measured("b", 1e9)});
  EXPECT_EQ(table_.pending(), 11);
  EXPECT_FALSE(table_.Claim("a").has_value()) << "b's reverse probe goes first: it may show a and b one group";
  EXPECT_EQ(table_.Claim("b"), "a");
  // b never reports (it died): its claim holds until the timeout.
  now_ += LinkTable::kClaimTimeout - absl::Seconds(1);
  EXPECT_FALSE(table_.Claim("a", {"b"}).has_value());
  now_ += absl::Seconds(2);
  EXPECT_EQ(table_.probing(), 0);
  EXPECT_EQ(table_.Claim("a", {"b"}), "c");
  EXPECT_EQ(table_.pending(), 11) << "b's direction is still queued for later";
  // a restarts and registers again: the probe it claimed is not running.
  table_.Joined("a", "a", {});
  EXPECT_EQ(table_.probing(), 0);
  EXPECT_EQ(table_.Claim("a", {"b"}), "c");
}

TEST_F(LinkTableTest, ProbesInsideAGroupRunAtOnceOnDistinctHostsUpToTheCap) {
  // a, b, c and d: one fabric (each pair measured fast both ways), but
  // a and e share a host.
  for (const std::string n : {"a", "b", "c", "d"}) table_.Joined(n, "h" + n, {});
  table_.Joined("e", "ha", {});
  for (const std::string from : {"a", "b", "c", "d"}) {
    std::vector<LinkRecord> links;
    for (const std::string to : {"a", "b", "c", "d"}) {
      if (to != from) links.push_back(Measured(to, 1e9));
    }
    table_.Record(from, links);
  }
  table_.Request({"a", "b", "c", "d"});
  EXPECT_EQ(table_.Claim("a"), "b");
  EXPECT_EQ(table_.Claim("b"), std::nullopt) << "b's host is in a's probe";
  EXPECT_EQ(table_.Claim("c"), "d") << "c and d: other hosts, the same group";
  EXPECT_EQ(table_.probing(), 2);
  table_.Record("a", {Measured("b", 1e9)});
  table_.Record("c", {Measured("d", 1e9)});
  table_.SetConcurrentProbes(1);
  EXPECT_EQ(table_.Claim("b"), "a");
  EXPECT_EQ(table_.Claim("c"), std::nullopt) << "at most one at once now";
  table_.Record("b", {Measured("a", 1e9)});
  // e is on a's host: in its group from the start (the groups are of
  // hosts), and a probe from e holds a's host too.
  table_.SetConcurrentProbes(4);
  table_.Joined("e", "ha", {"c"});
  EXPECT_EQ(table_.Claim("e"), "c") << "inside the group, though nothing of e is measured";
  EXPECT_EQ(table_.Claim("a"), std::nullopt) << "e's host is a's";
  EXPECT_EQ(table_.Claim("b"), "d") << "not a (its host is e's), nor c (in e's probe)";
}

TEST_F(LinkTableTest, PeersBusyWithAJobOrDrainedAreNotProbed) {
  table_.Request({"a", "b", "c"});
  EXPECT_EQ(table_.Claim("a", {"b"}), "c");
  table_.Record("a", {Measured("c", 1e9)});
  EXPECT_EQ(table_.Claim("c", {"b"}), "a");
  table_.Record("c", {Measured("a", 1e9)});
  EXPECT_EQ(table_.Claim("a", {"b"}), std::nullopt);
  EXPECT_EQ(table_.Claim("c", {"b"}), std::nullopt);
  EXPECT_EQ(table_.pending(), 4) << "every direction to and from b waits";
  EXPECT_EQ(table_.Claim("a"), "b");
}

TEST_F(LinkTableTest, ALinkMeasuredBesideAnotherThatBothTurnOutToLeaveTheirGroupsIsProbedAgainAlone) {
  // Two racks, a and b, seen at first through slow links only: a1-b1-a2-b2-a3-b3
  // look like one group, so a1 -> b2 and a3 -> b1 run at once across the
  // one uplink, each measuring half of it.
  const std::vector<std::string> names = {"a1", "a2", "a3", "b1", "b2", "b3"};
  for (const std::string& n : names) table_.Joined(n, "h" + n, {});
  const std::vector<std::pair<std::string, std::string>> chain = {
      {"a1", "b1"}, {"b1", "a2"}, {"a2", "b2"}, {"b2", "a3"}, {"a3", "b3"}};
  for (const auto& [x, y] : chain) {
    table_.Record(x, {Measured(y, 2.5e7)});
    table_.Record(y, {Measured(x, 2.5e7)});
  }
  table_.Joined("a1", "ha1", {"b2"});
  table_.Joined("a3", "ha3", {"b1"});
  ASSERT_EQ(table_.Claim("a1"), "b2");
  ASSERT_EQ(table_.Claim("a3"), "b1") << "inside one group, as far as anything shows";
  table_.Record("a1", {Measured("b2", 1.25e7)});
  table_.Record("a3", {Measured("b1", 1.25e7)});
  EXPECT_EQ(table_.pending(), 2) << "b2 -> a1 and b1 -> a3 only: nothing contradicts the group yet";
  // Rack a's own link shows a1 and a2 far faster than the chain: the
  // groups split, and both shared measurements cross between them.
  table_.Record("a1", {Measured("a2", 1e9)});
  table_.Record("a2", {Measured("a1", 1e9)});
  EXPECT_EQ(table_.QueuedFrom("a1"), (std::vector<std::string>{"b2"}));
  EXPECT_EQ(table_.QueuedFrom("a3"), (std::vector<std::string>{"b1"}));
  EXPECT_EQ(table_.Claim("b2"), std::nullopt) << "a measurement to take again alone goes first";
  ASSERT_EQ(table_.Claim("a1"), "b2");
  EXPECT_EQ(table_.Claim("a3"), std::nullopt) << "alone: nothing beside it";
  EXPECT_EQ(table_.Claim("b1"), std::nullopt);
  table_.Record("a1", {Measured("b2", 2.5e7)});
  ASSERT_EQ(table_.Claim("a3"), "b1");
  table_.Record("a3", {Measured("b1", 2.5e7)});
  EXPECT_EQ(table_.Get("a1", "b2")->bytes_per_second, 2.5e7);
  EXPECT_EQ(table_.Get("a3", "b1")->bytes_per_second, 2.5e7);
  EXPECT_EQ(table_.pending(), 2) << "nothing taken again twice";
}

TEST_F(LinkTableTest, MeasurementsAgeAndAFailedProbeKeepsTheLastGoodFigures) {
  table_.Request({"a", "b"});
  ASSERT_EQ(table_.Claim("a"), "b");
  table_.Record("a", {Measured("b", 1e9)});
  EXPECT_FALSE(table_.Get("b", "a").has_value()) << "each direction on its own";
  ASSERT_EQ(table_.Claim("b"), "a");
  table_.Record("b", {Measured("a", 1e9)});
  auto link = table_.Get("a", "b");
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->from, "a");
  EXPECT_EQ(link->bytes_per_second, 1e9);
  EXPECT_EQ(link->measured_at, now_);
  EXPECT_FALSE(table_.Stale(*link));
  now_ += LinkTable::kStaleAfter + absl::Seconds(1);
  EXPECT_TRUE(table_.Stale(*table_.Get("a", "b")));

  table_.Request({"a", "b"});
  ASSERT_EQ(table_.Claim("a"), "b");
  LinkRecord failed;
  failed.to = "b";
  failed.error = "UNAVAILABLE: connection refused";
  table_.Record("a", {failed});
  link = table_.Get("a", "b");
  EXPECT_EQ(link->bytes_per_second, 1e9) << "the last good figure stays";
  EXPECT_EQ(link->error, failed.error);
  // A later success clears the error.
  table_.Record("a", {Measured("b", 5e8)});
  EXPECT_EQ(table_.Get("a", "b")->error, "");
  EXPECT_EQ(table_.Get("a", "b")->bytes_per_second, 5e8);
}

TEST_F(LinkTableTest, ForgottenWorkersTakeTheirLinksProbesAndClaimAlong) {
  table_.Request({"a", "b", "c"});
  ASSERT_EQ(table_.Claim("a"), "b");
  table_.Record("a", {Measured("b", 1e9)});
  ASSERT_EQ(table_.Claim("b"), "a");
  table_.Retain({"b", "c"});
  EXPECT_FALSE(table_.Get("a", "b").has_value());
  EXPECT_EQ(table_.pending(), 2) << "b → c and c → b";
  EXPECT_EQ(table_.probing(), 0) << "b's claim of its link to a went with a";
  EXPECT_EQ(table_.Claim("b"), "c");
  EXPECT_EQ(table_.Links().size(), 0u);
}

TEST_F(LinkTableTest, ASlowdownAJobObservedCountsUntilTheNextProbe) {
  table_.Record("a", {Measured("b", 1e9)});
  table_.Observe("a", "b", 5e6, "job-1");
  table_.Observe("b", "c", 1e6, "job-1");  // never probed
  EXPECT_EQ(table_.pending(), 2) << "both queued for a probe";
  const LinkLookup planning = LinksFrom(&table_);
  // A fresh lookup at each look: one keeps what it read first.
  auto links = [&](const WorkerRecord& from, const WorkerRecord& to) { return LinksFrom(&table_)(from, to); };
  WorkerRecord a, b, c;
  a.name = "a";
  b.name = "b";
  c.name = "c";
  EXPECT_DOUBLE_EQ(planning(a, b).bytes_per_second, 5e6);
  EXPECT_DOUBLE_EQ(links(a, b).rtt_seconds, 1e-4) << "the probe's round trip";
  EXPECT_DOUBLE_EQ(links(b, c).bytes_per_second, 1e6);
  EXPECT_EQ(table_.Get("a", "b")->observed_in, "job-1");

  table_.Observe("a", "b", 2e9, "job-2");  // faster than the probe: the probe counts
  EXPECT_DOUBLE_EQ(links(a, b).bytes_per_second, 1e9);
  EXPECT_DOUBLE_EQ(planning(a, b).bytes_per_second, 5e6) << "one planning's view: the table read once";
  table_.ForgetObserved("b", "c");
  EXPECT_FALSE(table_.Get("b", "c").has_value()) << "nothing left but the observation";
  table_.Observe("a", "b", 5e6, "job-1");
  table_.Record("a", {Measured("b", 4e8)});
  EXPECT_DOUBLE_EQ(links(a, b).bytes_per_second, 4e8) << "a probe replaces the observation";
  EXPECT_EQ(table_.Get("a", "b")->observed_bytes_per_second, 0);
}

TEST_F(LinkTableTest, AWorkerWithSlowedLinksToTwoPeersHasAllItsLinksPlannedSlowUntilEachIsProbedAgain) {
  table_.Joined("a", "ha", {});
  table_.Joined("b", "hb", {"a"});
  table_.Joined("c", "hc", {"a", "b"});
  table_.Joined("c2", "hc", {"a", "b", "c"});  // c's host
  table_.Joined("d", "hd", {"a", "b", "c", "c2"});
  const std::vector<std::string> all = {"a", "b", "c", "c2", "d"};
  for (const std::string& from : all) {
    std::vector<LinkRecord> links;
    for (const std::string& to : all) {
      if (from != to) links.push_back(Measured(to, 1e8));
    }
    table_.Record(from, links);
  }
  ASSERT_EQ(table_.pending(), 0);
  auto worker = [](const std::string& name, const std::string& host) {
    WorkerRecord w;
    w.name = name;
    w.capabilities.set_listen_address(host + ":1");
    return w;
  };
  const WorkerRecord a = worker("a", "ha"), b = worker("b", "hb"), c = worker("c", "hc"), c2 = worker("c2", "hc"),
                     d = worker("d", "hd");
  auto links = [&](const WorkerRecord& from, const WorkerRecord& to) { return LinksFrom(&table_)(from, to); };

  // c's links to a slow, both ways: whose link it is, nothing tells.
  now_ += absl::Seconds(1);
  EXPECT_TRUE(table_.Observe("a", "c", 1e5, "job-1").empty());
  EXPECT_TRUE(table_.Observe("c", "a", 3e5, "job-1").empty());
  EXPECT_FALSE(table_.Suspected("a").has_value());
  EXPECT_FALSE(table_.Suspected("c").has_value());
  EXPECT_DOUBLE_EQ(links(b, c).bytes_per_second, 1e8);
  // Then its link from b too: c's own.
  EXPECT_EQ(table_.Observe("b", "c", 2e5, "job-2"), std::vector<std::string>{"c"});
  ASSERT_TRUE(table_.Suspected("c").has_value());
  EXPECT_DOUBLE_EQ(table_.Suspected("c")->bytes_per_second, 3e5) << "the fastest of its slowed links";
  EXPECT_EQ(table_.Suspected("c")->job_id, "job-2");
  EXPECT_FALSE(table_.Suspected("a").has_value());
  EXPECT_FALSE(table_.Suspected("b").has_value());
  EXPECT_TRUE(table_.Observe("a", "c", 1e5, "job-2").empty()) << "observed already: nothing new";
  EXPECT_EQ(table_.pending(), 8) << "both ways between c and each other worker";
  EXPECT_DOUBLE_EQ(links(a, c).bytes_per_second, 1e5) << "its own observation";
  EXPECT_DOUBLE_EQ(links(c, d).bytes_per_second, 3e5) << "never seen slow: capped";
  EXPECT_DOUBLE_EQ(links(d, c).bytes_per_second, 3e5);
  EXPECT_DOUBLE_EQ(links(c, c2).bytes_per_second, 1e8) << "within its host: memory, not its wire";
  EXPECT_DOUBLE_EQ(links(a, d).bytes_per_second, 1e8);

  // Probed again one link at a time: each is as probed; the last ends it.
  now_ += absl::Seconds(1);
  table_.Record("c", {Measured("d", 6e5)});
  EXPECT_DOUBLE_EQ(links(c, d).bytes_per_second, 6e5) << "probed since";
  EXPECT_DOUBLE_EQ(links(d, c).bytes_per_second, 3e5) << "not probed since";
  for (const std::string peer : {"a", "b", "c2"}) {
    table_.Record("c", {Measured(peer, 6e5)});
    table_.Record(peer, {Measured("c", 6e5)});
  }
  EXPECT_TRUE(table_.Suspected("c").has_value()) << "d -> c not probed yet";
  table_.Record("d", {Measured("c", 6e5)});
  EXPECT_FALSE(table_.Suspected("c").has_value());
  EXPECT_EQ(table_.pending(), 0);

  // Frames into it at their pace again end it too; a forgotten worker's goes.
  table_.Observe("a", "b", 1e5, "job-3");
  table_.Observe("d", "b", 1e5, "job-3");
  ASSERT_TRUE(table_.Suspected("b").has_value());
  table_.ForgetObserved("d", "b");
  EXPECT_FALSE(table_.Suspected("b").has_value());
  table_.Observe("b", "d", 1e5, "job-3");
  table_.Observe("b", "a", 1e5, "job-3");
  ASSERT_TRUE(table_.Suspected("b").has_value());
  table_.Retain({"a", "c", "c2", "d"});
  EXPECT_FALSE(table_.Suspected("b").has_value());
}

// A cluster probed in rounds: every worker asks for a probe each round, in
// name order, and every probe claimed ends with the round. Names starting
// with the same letter share a rack: `inside` within it; between racks the
// probes crossing at once share the uplink's `across`. Each worker is a
// host of its own unless `host_of` says otherwise; workers on one host
// measure `same_host`. What the workers measure is written back as they
// would.
struct ProbeRun {
  int rounds = 0;
  int most_at_once = 0;
};

ProbeRun ProbeEverything(LinkTable& table, absl::Time& now, const std::vector<std::string>& names, double inside,
                         double across, std::function<std::string(const std::string&)> host_of = nullptr,
                         double same_host = 0) {
  if (host_of == nullptr) host_of = [](const std::string& n) { return "host-" + n; };
  std::vector<std::string> joined;
  for (const std::string& n : names) {
    table.Joined(n, host_of(n), joined);
    joined.push_back(n);
  }
  ProbeRun run;
  while (table.pending() > 0 && run.rounds < 10000) {
    std::vector<std::pair<std::string, std::string>> probes;
    for (const std::string& n : names) {
      if (std::optional<std::string> peer = table.Claim(n)) probes.emplace_back(n, *peer);
    }
    int crossing = 0;
    for (const auto& [from, to] : probes) crossing += from[0] != to[0];
    for (const auto& [from, to] : probes) {
      LinkRecord link;
      link.to = to;
      link.bytes_per_second = host_of(from) == host_of(to) ? same_host : from[0] == to[0] ? inside : across / crossing;
      table.Record(from, {link});
    }
    run.most_at_once = std::max(run.most_at_once, static_cast<int>(probes.size()));
    now += absl::Seconds(1);
    ++run.rounds;
  }
  return run;
}

std::vector<std::string> Names(const std::string& racks, int each) {
  std::vector<std::string> names;
  for (char rack : racks) {
    for (int i = 0; i < each; ++i) names.push_back(std::string(1, rack) + std::to_string(10 + i));
  }
  return names;
}

// A probe over three times slower than the one before it is a slowed link
// as a job's observation is: with an observed one to another peer, its end
// is suspected (and the probe's figure counts among its slowed links);
// a probe as fast as before, or the first of a link, is not.
TEST_F(LinkTableTest, AProbeThatFindsALinkSlowedCountsTowardsSuspectingItsEnds) {
  for (const char* from : {"a", "b", "c", "d"}) {
    std::vector<LinkRecord> links;
    for (const char* to : {"a", "b", "c", "d"}) {
      if (std::string(from) != to) links.push_back(Measured(to, 1e8));
    }
    table_.Record(from, links);
  }
  EXPECT_TRUE(table_.Observe("a", "b", 1e5, "job-1").empty()) << "one slowed link: which end, nothing tells";
  table_.Record("a", {Measured("c", 5e7)});  // half as fast: not slowed
  EXPECT_EQ(table_.Get("a", "c")->slowed_from, 0);
  EXPECT_FALSE(table_.Suspected("a").has_value());
  table_.Record("e", {Measured("b", 1e4)});  // a first probe: nothing to compare
  EXPECT_FALSE(table_.Suspected("b").has_value());
  table_.Record("d", {Measured("c", 1e5)});  // slowed, but d and c have nothing else slow
  EXPECT_DOUBLE_EQ(table_.Get("d", "c")->slowed_from, 1e8);
  EXPECT_FALSE(table_.Suspected("d").has_value());
  EXPECT_FALSE(table_.Suspected("c").has_value());
  table_.Record("d", {Measured("c", 1e8)});  // as fast as ever again
  EXPECT_EQ(table_.Get("d", "c")->slowed_from, 0);
  now_ += absl::Seconds(1);
  table_.Record("c", {Measured("b", 2e5)});  // 500 times slower than before
  ASSERT_TRUE(table_.Suspected("b").has_value()) << "slowed from a and probed slow from c";
  EXPECT_DOUBLE_EQ(table_.Suspected("b")->bytes_per_second, 2e5) << "the fastest of its slowed links";
  EXPECT_EQ(table_.Suspected("b")->job_id, "job-1") << "the job that saw the other";
  EXPECT_FALSE(table_.Suspected("a").has_value());
  EXPECT_FALSE(table_.Suspected("c").has_value()) << "c -> b is b's doing";
  EXPECT_EQ(table_.Get("c", "b")->slowed_from, 0) << "explained by b: no evidence against c";
  // b's own probes (its suspicion queued them all) find it slow: they end
  // the suspicion, they do not start it again.
  for (const char* peer : {"a", "c", "d", "e"}) {
    table_.Record("b", {Measured(peer, 2e5)});
    table_.Record(peer, {Measured("b", 2e5)});
  }
  EXPECT_FALSE(table_.Suspected("b").has_value());
  EXPECT_EQ(table_.Get("b", "d")->slowed_from, 0);
}

TEST_F(LinkTableTest, AFabricIsProbedManyAtOnceOnceAChainOfProbesShowsItOneGroup) {
  const std::vector<std::string> names = Names("a", 16);
  const ProbeRun run = ProbeEverything(table_, now_, names, 1e9, 0);
  const int directions = 16 * 15;
  EXPECT_EQ(static_cast<int>(table_.Links().size()), directions);
  for (const LinkRecord& l : table_.Links()) EXPECT_EQ(l.bytes_per_second, 1e9) << l.from << " -> " << l.to;
  EXPECT_EQ(run.most_at_once, 8) << "every host in a probe";
  // A chain of 2 × 15 probes one at a time, then 8 at once.
  EXPECT_LT(run.rounds, directions / 3) << "one at a time it takes " << directions;
}

TEST_F(LinkTableTest, HostsOfSeveralWorkersOnOneFabricAreOneGroupThoughTheirOwnLinksAreFaster) {
  // 4 hosts of 4 workers: memory at 5 GB/s inside a host, 1 GB/s between
  // (under a quarter of it: as workers, each host would be a group apart).
  const std::vector<std::string> names = Names("a", 16);
  auto host_of = [&](const std::string& n) { return "h" + std::to_string((std::stoi(n.substr(1)) - 10) / 4); };
  const ProbeRun run = ProbeEverything(table_, now_, names, 1e9, 0, host_of, 5e9);
  ASSERT_EQ(table_.Links().size(), 16u * 15u);
  for (const LinkRecord& l : table_.Links()) {
    EXPECT_EQ(l.bytes_per_second, host_of(l.from) == host_of(l.to) ? 5e9 : 1e9) << l.from << " -> " << l.to;
  }
  EXPECT_EQ(run.most_at_once, 4) << "a probe on every host: inside each, or two between hosts";
  // The 192 directions between hosts two at a time, the 48 inside beside them.
  EXPECT_LT(run.rounds, 130);
}

TEST_F(LinkTableTest, RacksAreProbedInsideAtOnceAndAcrossTheUplinkOneAtATimeAndEveryFigureIsTheWiresOwn) {
  const std::vector<std::string> names = Names("ab", 6);
  const ProbeRun run = ProbeEverything(table_, now_, names, 1e9, 2.5e7);
  ASSERT_EQ(table_.Links().size(), 12u * 11u);
  for (const LinkRecord& l : table_.Links()) {
    EXPECT_EQ(l.bytes_per_second, l.from[0] == l.to[0] ? 1e9 : 2.5e7) << l.from << " -> " << l.to;
  }
  EXPECT_GT(run.most_at_once, 1);
  EXPECT_LT(run.rounds, 12 * 11) << "the 72 directions across one at a time, the 60 inside beside them";
}

TEST_F(LinkTableTest, ThreeRacksKeepEveryFigureTheWiresOwnToo) {
  // Racks of uneven sizes: no order of probes may leave a shared
  // measurement behind.
  std::vector<std::string> names = Names("a", 5);
  for (const std::string& n : Names("b", 2)) names.push_back(n);
  for (const std::string& n : Names("c", 4)) names.push_back(n);
  ProbeEverything(table_, now_, names, 1e9, 2.5e7);
  ASSERT_EQ(table_.Links().size(), 11u * 10u);
  for (const LinkRecord& l : table_.Links()) {
    EXPECT_EQ(l.bytes_per_second, l.from[0] == l.to[0] ? 1e9 : 2.5e7) << l.from << " -> " << l.to;
  }
}

}  // namespace
}  // namespace shardline::server
