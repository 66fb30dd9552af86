#include "server/link_table.h"

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
  table_.Joined("a", {"a"});
  EXPECT_EQ(table_.pending(), 0) << "no link to itself";
  table_.Joined("b", {"a", "b"});
  table_.Joined("c", {"a", "b", "c"});
  EXPECT_EQ(table_.pending(), 6);
  EXPECT_EQ(table_.Claim("c"), (std::vector<std::string>{"a", "b"}));
}

TEST_F(LinkTableTest, OneWorkerProbesAtATimeUntilItReportsOrItsClaimLapses) {
  table_.Request({"a", "b", "c"});
  ASSERT_EQ(table_.pending(), 6);
  EXPECT_EQ(table_.Claim("a"), (std::vector<std::string>{"b", "c"}));
  EXPECT_TRUE(table_.Claim("b").empty()) << "a holds the claim";
  EXPECT_TRUE(table_.Claim("a").empty()) << "a is probing what it was given";
  table_.Record("a", {Measured("b", 1e9), Measured("c", 2e8)});
  EXPECT_EQ(table_.pending(), 4);
  EXPECT_EQ(table_.Claim("b"), (std::vector<std::string>{"a", "c"}));
  // b never reports: after the timeout another worker may go.
  now_ += LinkTable::kClaimTimeout - absl::Seconds(1);
  EXPECT_TRUE(table_.Claim("c").empty());
  now_ += absl::Seconds(2);
  EXPECT_EQ(table_.Claim("c"), (std::vector<std::string>{"a", "b"}));
  // And b's directions are still queued for later.
  EXPECT_EQ(table_.pending(), 4);
}

TEST_F(LinkTableTest, MeasurementsAgeAndAFailedProbeKeepsTheLastGoodFigures) {
  table_.Request({"a", "b"});
  ASSERT_FALSE(table_.Claim("a").empty());
  table_.Record("a", {Measured("b", 1e9)});
  auto link = table_.Get("a", "b");
  ASSERT_TRUE(link.has_value());
  EXPECT_EQ(link->from, "a");
  EXPECT_EQ(link->bytes_per_second, 1e9);
  EXPECT_EQ(link->measured_at, now_);
  EXPECT_FALSE(table_.Stale(*link));
  EXPECT_FALSE(table_.Get("b", "a").has_value()) << "each direction on its own";
  now_ += LinkTable::kStaleAfter + absl::Seconds(1);
  EXPECT_TRUE(table_.Stale(*table_.Get("a", "b")));

  table_.Request({"a", "b"});
  ASSERT_FALSE(table_.Claim("a").empty());
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
  ASSERT_FALSE(table_.Claim("c").empty());
  table_.Record("c", {Measured("a", 1e9)});
  ASSERT_FALSE(table_.Claim("a").empty());
  table_.Retain({"b", "c"});
  EXPECT_FALSE(table_.Get("c", "a").has_value());
  EXPECT_EQ(table_.pending(), 2) << "b → c and c → b (c reported only its link to a)";
  EXPECT_EQ(table_.Claim("b"), (std::vector<std::string>{"c"})) << "a's claim went with it";
  EXPECT_EQ(table_.Links().size(), 0u);
}

TEST_F(LinkTableTest, ASlowdownAJobObservedCountsUntilTheNextProbe) {
  table_.Record("a", {Measured("b", 1e9)});
  table_.Observe("a", "b", 5e6, "job-1");
  table_.Observe("b", "c", 1e6, "job-1");  // never probed
  EXPECT_EQ(table_.pending(), 2) << "both queued for a probe";
  const LinkLookup links = LinksFrom(&table_);
  WorkerRecord a, b, c;
  a.name = "a";
  b.name = "b";
  c.name = "c";
  EXPECT_DOUBLE_EQ(links(a, b).bytes_per_second, 5e6);
  EXPECT_DOUBLE_EQ(links(a, b).rtt_seconds, 1e-4) << "the probe's round trip";
  EXPECT_DOUBLE_EQ(links(b, c).bytes_per_second, 1e6);
  EXPECT_EQ(table_.Get("a", "b")->observed_in, "job-1");

  table_.Observe("a", "b", 2e9, "job-2");  // faster than the probe: the probe counts
  EXPECT_DOUBLE_EQ(links(a, b).bytes_per_second, 1e9);
  table_.ForgetObserved("b", "c");
  EXPECT_FALSE(table_.Get("b", "c").has_value()) << "nothing left but the observation";
  table_.Observe("a", "b", 5e6, "job-1");
  table_.Record("a", {Measured("b", 4e8)});
  EXPECT_DOUBLE_EQ(links(a, b).bytes_per_second, 4e8) << "a probe replaces the observation";
  EXPECT_EQ(table_.Get("a", "b")->observed_bytes_per_second, 0);
}

}  // namespace
}  // namespace shardline::server
