// Shared wires in the prediction: LinkGroups finds racks from pairwise
// measurements alone, and EstimateGrid gives transfers that cross between
// two groups their part of the one wire: two replicas' hops across one
// uplink take as long as one hop of their bytes, two stages' all-reduces
// across it as long as both in turn.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "server/grid_cost.h"
#include "server/link_groups.h"

namespace shardline::server {
namespace {

WorkerRecord Worker(const std::string& name) {
  WorkerRecord w;
  w.id = "id-" + name;
  w.name = name;
  w.capabilities.set_gemm_flops(1e11);
  w.capabilities.set_memory_bytes(int64_t{8} << 30);
  w.capabilities.set_listen_address(name + ".example:7401");
  return w;
}

// Names starting with the same letter share a rack; `across` between racks.
double Rate(const std::string& a, const std::string& b, double inside, double across) {
  return a[0] == b[0] ? inside : across;
}

LinkLookup Racks(double inside, double across) {
  return [=](const WorkerRecord& a, const WorkerRecord& b) {
    LinkEstimate e;
    e.measured = true;
    e.bytes_per_second = a.name == b.name ? 1e30 : Rate(a.name, b.name, inside, across);
    return e;
  };
}

std::vector<int> GroupsOf(const std::vector<WorkerRecord>& workers, double inside, double across) {
  const LinkGroups groups(workers, [&](size_t a, size_t b) {
    return Rate(workers[a].name, workers[b].name, inside, across);
  });
  std::vector<int> out;
  for (size_t i = 0; i < workers.size(); ++i) out.push_back(groups.group(i));
  return out;
}

TEST(LinkGroupsTest, RacksBehindASlowUplinkAreGroupsAndAFabricIsOne) {
  const std::vector<WorkerRecord> w = {Worker("a1"), Worker("b1"), Worker("a2"), Worker("b2"), Worker("a1")};
  const std::vector<int> racks = GroupsOf(w, 1e9, 6e6);
  EXPECT_EQ(racks[0], racks[2]);
  EXPECT_EQ(racks[1], racks[3]);
  EXPECT_NE(racks[0], racks[1]);
  EXPECT_EQ(racks[4], racks[0]) << "one worker at two positions is one node";
  const std::vector<int> fabric = GroupsOf(w, 1e9, 0.5e9);
  for (int g : fabric) EXPECT_EQ(g, fabric[0]) << "links within 4× of each other share nothing";
}

shardline::v1::JobSpec Spec(int d) {
  auto spec = common::ParseJobSpec(absl::StrCat(R"({"name": "g",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 8},
    "data": {"kind": "text_bytes", "path": "/x"},
    "train": {"steps": 10, "global_batch": 32, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001}},
    "parallel": {"pipeline_stages": 2, "data_parallel": )",
                                                d, R"(, "placement": "in_order"}})"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Replica r's stage 0 in rack a, its stage 1 in rack b: each replica's hop
// crosses the uplink. Two replicas' hops carry half the bytes each (half
// the sequences per micro-batch) and share the uplink: each takes as long
// as the one replica's hop of both halves.
TEST(SharedLinksTest, TwoReplicasHopsAcrossOneUplinkShareIt) {
  const LinkLookup links = Racks(1e9, 3e6);
  auto one = EstimateGrid(Spec(1), {Worker("a1"), Worker("b1")}, links);
  auto two = EstimateGrid(Spec(2), {Worker("a1"), Worker("b1"), Worker("a2"), Worker("b2")}, links);
  ASSERT_TRUE(one.ok() && two.ok()) << one.status() << two.status();
  EXPECT_NEAR(two->positions[0].hop_seconds, one->positions[0].hop_seconds, 1e-9);
  EXPECT_NEAR(two->positions[2].hop_seconds, one->positions[0].hop_seconds, 1e-9);
  EXPECT_TRUE(absl::StrContains(two->critical_path, "its link's share with 2 hops")) << two->critical_path;
}

// Replicas on either side of the uplink: stage 0's all-reduce (a1 ↔ b1)
// and stage 1's (a2 ↔ b2) both cross it, so each takes the two stages'
// bytes over it; inside a rack nothing is shared.
TEST(SharedLinksTest, TwoStagesAllReducesAcrossOneUplinkTakeTheirSum) {
  const LinkLookup links = Racks(1e9, 6e6);
  const auto spec = Spec(2);
  auto across = EstimateGrid(spec, {Worker("a1"), Worker("a2"), Worker("b1"), Worker("b2")}, links);
  ASSERT_TRUE(across.ok()) << across.status();
  const double bytes = ReduceBytesPerStep(across->plan.stages[0].parameters, 2) +
                       ReduceBytesPerStep(across->plan.stages[1].parameters, 2);
  for (const PositionCost& pc : across->positions) EXPECT_NEAR(pc.reduce_seconds, bytes / 6e6, 1e-3 * bytes / 6e6);
  auto inside = EstimateGrid(spec, {Worker("a1"), Worker("b1"), Worker("a2"), Worker("b2")}, links);
  ASSERT_TRUE(inside.ok());
  EXPECT_NEAR(inside->positions[0].reduce_seconds, ReduceBytesPerStep(inside->plan.stages[0].parameters, 2) / 1e9,
              1e-6);
}

}  // namespace
}  // namespace shardline::server
