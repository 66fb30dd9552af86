// The placement search on synthetic clusters: workers with made-up rates,
// memory and addresses, links from a lookup the test writes.
#include "server/grid_search.h"
#include "server/grid_placement.h"

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

shardline::v1::JobSpec Spec(int p, int d, int t, int layers = 8) {
  auto spec = common::ParseJobSpec(absl::StrCat(R"({"name": "g",
    "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": )",
                                                layers, R"(},
    "data": {"kind": "text_bytes", "path": "/x"},
    "train": {"steps": 10, "global_batch": 32, "micro_batches": 8, "seed": 1,
              "optimizer": {"kind": "adamw", "lr": 0.001}},
    "parallel": {"pipeline_stages": )",
                                                p, R"(, "data_parallel": )", d, R"(, "tensor_parallel": )", t, "}}"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

WorkerRecord Worker(const std::string& name, double flops = 1e11, int64_t memory = 8 * kGiB) {
  WorkerRecord w;
  w.id = "id-" + name;
  w.name = name;
  w.capabilities.set_gemm_flops(flops);
  w.capabilities.set_memory_bytes(memory);
  w.capabilities.set_listen_address(name + ".example:7401");  // a host each
  return w;
}

// Workers whose names start with the same letter share a fast switch;
// between letters `across` bytes/s.
LinkLookup Racks(double inside, double across) {
  return [=](const WorkerRecord& a, const WorkerRecord& b) {
    LinkEstimate e;
    e.measured = true;
    e.rtt_seconds = 1e-4;
    e.bytes_per_second = a.name == b.name ? 1e30 : a.name[0] == b.name[0] ? inside : across;
    return e;
  };
}

std::vector<std::string> Names(const std::vector<WorkerRecord>& grid) {
  std::vector<std::string> names;
  for (const WorkerRecord& w : grid) names.push_back(w.name);
  return names;
}

// Two replicas of a two-way tensor group on two racks, registered
// interleaved: the plain choice puts each tensor group across the slow
// link; the search puts each within a rack and the all-reduce across.
TEST(GridSearchTest, TensorGroupsGoOnFastLinksAndTheSlowLinkBetweenReplicas) {
  const auto spec = Spec(1, 2, 2);
  const std::vector<WorkerRecord> idle = {Worker("a1"), Worker("b1"), Worker("a2"), Worker("b2")};
  const LinkLookup links = Racks(10e9, 50e6);
  auto grid = ChooseGrid(spec, idle, {}, links);
  ASSERT_TRUE(grid.ok()) << grid.status();
  const auto names = Names(*grid);
  EXPECT_EQ(names[0][0], names[1][0]) << "replica 0's tensor group on one rack: " << names[0] << ", " << names[1];
  EXPECT_EQ(names[2][0], names[3][0]) << "replica 1's tensor group on one rack: " << names[2] << ", " << names[3];
  auto chosen = EstimateGrid(spec, *grid, links);
  auto plain = EstimateGrid(spec, idle, links);
  ASSERT_TRUE(chosen.ok() && plain.ok());
  EXPECT_LT(chosen->step_seconds, 0.75 * plain->step_seconds) << plain->critical_path;
  EXPECT_TRUE(absl::StrContains(plain->critical_path, "tensor collectives")) << plain->critical_path;
}

// A search reuses a grid's link groups across swaps of two positions: the
// estimate is the one built from scratch, whichever two positions swap
// (hops and all-reduces across racks, tensor groups within and across).
TEST(GridSearchTest, LinkGroupsSwappedWithTheirPositionsEstimateAsBuiltOnes) {
  const auto spec = Spec(2, 2, 2);
  std::vector<WorkerRecord> grid = {Worker("a1"), Worker("b1"), Worker("c1"), Worker("a2"),
                                    Worker("b2"), Worker("c2"), Worker("a3"), Worker("b3")};
  const LinkLookup links = Racks(10e9, 50e6);
  LinkGroups groups = GroupsOf(grid, links);
  int compared = 0;
  for (size_t i = 0; i < grid.size(); ++i) {
    for (size_t j = i + 1; j < grid.size(); ++j) {
      std::swap(grid[i], grid[j]);
      groups.Swap(i, j);
      auto reused = EstimateGrid(spec, grid, links, {}, false, &groups);
      auto built = EstimateGrid(spec, grid, links);
      ASSERT_TRUE(reused.ok() && built.ok()) << built.status();
      EXPECT_EQ(reused->step_seconds, built->step_seconds) << i << " <-> " << j;
      EXPECT_EQ(reused->reduce_seconds, built->reduce_seconds) << i << " <-> " << j;
      EXPECT_EQ(reused->critical_path, built->critical_path) << i << " <-> " << j;
      ++compared;  // left swapped: the next pair swaps within a shuffled grid
    }
  }
  EXPECT_EQ(compared, 28);
}

// A two-stage pipeline from three workers, one of them behind a slow link:
// the spare takes its place.
TEST(GridSearchTest, AWorkerBehindASlowLinkIsLeftOutWhenASpareCanTakeItsPlace) {
  const auto spec = Spec(2, 1, 1);
  const std::vector<WorkerRecord> idle = {Worker("a1"), Worker("b1"), Worker("a2")};
  const LinkLookup links = Racks(10e9, 1e6);
  auto grid = ChooseGrid(spec, idle, {}, links);
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_EQ(std::set<std::string>({(*grid)[0].name, (*grid)[1].name}), (std::set<std::string>{"a1", "a2"}));
  // Without a spare the hop is what sets the pace, and the plan says so.
  auto forced = EstimateGrid(spec, {idle[0], idle[1]}, links);
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_TRUE(absl::StartsWith(forced->critical_path, "hop from stage 0 to 1 of replica 0 (a1 ↔ b1, 1.0 MB/s"))
      << forced->critical_path;
  EXPECT_GT(forced->positions[0].hop_seconds, 0);
  EXPECT_EQ(forced->positions[1].hop_seconds, 0) << "the last stage has no next";
}

// A slower worker gets fewer layers, wherever the search puts it; equal
// workers with nothing measured keep the plain order (registration).
TEST(GridSearchTest, ASlowerWorkerGetsFewerLayersAndEqualOnesKeepTheirOrder) {
  const auto spec = Spec(2, 1, 1, 12);
  auto grid = ChooseGrid(spec, {Worker("slow", 5e10), Worker("fast", 1e11)}, {}, LinksFrom(nullptr));
  ASSERT_TRUE(grid.ok()) << grid.status();
  auto cost = EstimateGrid(spec, *grid, LinksFrom(nullptr));
  ASSERT_TRUE(cost.ok()) << cost.status();
  for (const StagePlan& stage : cost->plan.stages) {
    const int units = stage.unit_end - stage.unit_begin;
    if (stage.worker == "slow") {
      EXPECT_LT(units, 14 - units) << "the slow worker holds " << units << " of 14 units";
    }
  }
  auto equal = ChooseGrid(Spec(2, 2, 1), {Worker("w0"), Worker("w1"), Worker("w2"), Worker("w3")}, {},
                          LinksFrom(nullptr));
  ASSERT_TRUE(equal.ok());
  EXPECT_EQ(Names(*equal), (std::vector<std::string>{"w0", "w1", "w2", "w3"}));
}

// Five rates mixed through registration order, four workers each, for 4
// stages × 4 replicas: every stage of the plain choice holds a slow
// worker, and no single move changes that. The search starts from the
// workers sorted by rate, a stage's replicas alike, the slowest four left
// out (bench_planner measures it on larger clusters).
TEST(GridSearchTest, MixedRatesGiveEachStageReplicasOfOneRate) {
  const auto spec = Spec(4, 4, 1, 16);
  std::vector<WorkerRecord> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(Worker(absl::StrCat("w", i), 1e11 * (1 + i % 5)));
  auto grid = ChooseGrid(spec, idle, {}, LinksFrom(nullptr));
  ASSERT_TRUE(grid.ok()) << grid.status();
  for (int s = 0; s < 4; ++s) {
    std::set<double> rates;
    for (int r = 0; r < 4; ++r) rates.insert((*grid)[r * 4 + s].capabilities.gemm_flops());
    EXPECT_EQ(rates.size(), 1u) << "stage " << s << ": " << absl::StrJoin(Names(*grid), " ");
    EXPECT_GT(*rates.begin(), 1e11) << "stage " << s << " holds one of the slowest";
  }
  auto chosen = EstimateGrid(spec, *grid, LinksFrom(nullptr));
  auto plain = EstimateGrid(spec, {idle.begin(), idle.begin() + 16}, LinksFrom(nullptr));
  ASSERT_TRUE(chosen.ok() && plain.ok());
  EXPECT_LT(chosen->step_seconds, 0.8 * plain->step_seconds) << plain->critical_path;
}

// The same with tensor groups: six hosts of two workers, rates by host
// (fast, slow, slow, fast, fast, fast) for 2 stages × 2 replicas × 2 ranks.
// The plain choice gives each stage a slow host; a single move splits a
// tensor group across hosts. The start by rate takes the four fast hosts,
// each a tensor group.
TEST(GridSearchTest, MixedRatesAmongHostsKeepTensorGroupsOnOneHost) {
  const auto spec = Spec(2, 2, 2, 16);
  const std::vector<double> host_rate = {3e11, 1e11, 1e11, 3e11, 3e11, 3e11};
  std::vector<WorkerRecord> idle;
  for (int h = 0; h < 6; ++h) {
    for (int k = 0; k < 2; ++k) {
      WorkerRecord w = Worker(absl::StrCat("h", h, "w", k), host_rate[h]);
      w.capabilities.set_listen_address(absl::StrCat("h", h, ".example:740", k));
      idle.push_back(w);
    }
  }
  auto grid = ChooseGrid(spec, idle, {}, LinksFrom(nullptr));
  ASSERT_TRUE(grid.ok()) << grid.status();
  for (int g = 0; g < 4; ++g) {
    const WorkerRecord& a = (*grid)[2 * g];
    const WorkerRecord& b = (*grid)[2 * g + 1];
    EXPECT_EQ(HostOf(a), HostOf(b)) << "tensor group " << g << ": " << absl::StrJoin(Names(*grid), " ");
    EXPECT_EQ(a.capabilities.gemm_flops(), 3e11) << "tensor group " << g << ": " << absl::StrJoin(Names(*grid), " ");
  }
  auto chosen = EstimateGrid(spec, *grid, LinksFrom(nullptr));
  auto plain = EstimateGrid(spec, {idle.begin(), idle.begin() + 8}, LinksFrom(nullptr));
  ASSERT_TRUE(chosen.ok() && plain.ok());
  EXPECT_LT(chosen->step_seconds, 0.6 * plain->step_seconds) << plain->critical_path;
}

// parallel.placement "in_order", the baseline: the first idle workers in
// registration order, the slow link and the slow worker where they fall,
// the cut even; its prediction counts what that costs.
TEST(GridSearchTest, InOrderPlacementTakesRegistrationOrderAndAnEvenCut) {
  auto spec = Spec(2, 1, 1, 12);
  const std::vector<WorkerRecord> idle = {Worker("a1", 5e10), Worker("b1"), Worker("a2")};
  const LinkLookup links = Racks(10e9, 1e6);
  auto planned = ChooseGrid(spec, idle, {}, links);
  spec.mutable_parallel()->set_placement("in_order");
  auto in_order = ChooseGrid(spec, idle, {}, links);
  ASSERT_TRUE(planned.ok() && in_order.ok());
  EXPECT_EQ(Names(*in_order), (std::vector<std::string>{"a1", "b1"}));
  EXPECT_NE(Names(*planned), Names(*in_order));
  auto naive = EstimateGrid(spec, *in_order, links);
  ASSERT_TRUE(naive.ok()) << naive.status();
  const StagePlan& slow = naive->plan.stages[0];
  EXPECT_EQ(slow.worker, "a1");
  // The even cut: a1 at half speed holds its share all the same, so its
  // stage's compute is about twice the other's.
  EXPECT_GT(slow.compute_seconds, 1.6 * naive->plan.stages[1].compute_seconds);
  spec.mutable_parallel()->set_placement("planned");
  auto best = EstimateGrid(spec, *planned, links);
  ASSERT_TRUE(best.ok());
  EXPECT_LT(best->step_seconds, 0.75 * naive->step_seconds) << naive->critical_path;
}

// The critical path names the worker that paces a stage: its slowest
// replica's, not its first.
TEST(GridSearchTest, TheCriticalPathNamesTheSlowestReplicaOfAStage) {
  auto spec = Spec(2, 2, 1, 12);
  spec.mutable_parallel()->set_placement("in_order");
  auto cost = EstimateGrid(spec, {Worker("w0"), Worker("w1"), Worker("w2"), Worker("w3", 3e10)}, LinksFrom(nullptr));
  ASSERT_TRUE(cost.ok()) << cost.status();
  EXPECT_TRUE(absl::StartsWith(cost->critical_path, "compute of stage 1 on w3 ")) << cost->critical_path;
}

// parallel.wire_dtype "auto" sends the hop that would hold the pipeline up
// in 8-bit blocks and the fast one in f32 (both ends told alike); "int8"
// every hop. The prediction counts the smaller bytes.
TEST(GridSearchTest, AutoWireSendsOnlyTheSlowHopInEightBitBlocks) {
  auto spec = Spec(3, 1, 1);
  spec.mutable_parallel()->set_placement("in_order");
  const std::vector<WorkerRecord> idle = {Worker("a1"), Worker("a2"), Worker("b1")};
  const LinkLookup links = Racks(10e9, 1e6);
  auto f32 = EstimateGrid(spec, idle, links);
  spec.mutable_parallel()->set_wire_dtype("auto");
  auto placed = PlaceGrid(spec, "job-1", 1, 3, idle, {}, {}, links);
  ASSERT_TRUE(f32.ok() && placed.ok()) << placed.status();
  ASSERT_EQ(placed->workers, (std::vector<std::string>{"id-a1", "id-a2", "id-b1"}));
  const auto& a = placed->assignments;
  EXPECT_FALSE(a[0].int8_to_next()) << "a1 → a2 is fast";
  EXPECT_FALSE(a[1].int8_to_previous());
  EXPECT_TRUE(a[1].int8_to_next()) << "a2 → b1 crosses the slow link";
  EXPECT_TRUE(a[2].int8_to_previous());
  EXPECT_FALSE(a[0].int8_to_previous());
  EXPECT_FALSE(a[2].int8_to_next());
  auto preview = PreviewGrid(spec, idle, links);
  ASSERT_TRUE(preview.ok());
  EXPECT_EQ(preview->stages(0).wire_to_next(), "f32");
  EXPECT_EQ(preview->stages(1).wire_to_next(), "int8");
  EXPECT_EQ(preview->stages(2).wire_to_next(), "");
  EXPECT_LT(preview->stages(1).hop_seconds(), 0.3 * f32->positions[1].hop_seconds);
  EXPECT_LT(preview->predicted_step_seconds(), 0.5 * f32->step_seconds);
  spec.mutable_parallel()->set_wire_dtype("int8");
  auto every = PlaceGrid(spec, "job-1", 1, 3, idle, {}, {}, links);
  ASSERT_TRUE(every.ok());
  EXPECT_TRUE(every->assignments[0].int8_to_next() && every->assignments[1].int8_to_previous());
}

// Two replicas of two stages, in registration order: stage 0's replicas
// (a1, b1) sum their gradients across the slow link, stage 1's (a2, a3)
// within a rack. "auto" sends stage 0's all-reduce in 8-bit blocks (every
// rank of its ring alike), stage 1's in f32; "int8" both.
TEST(GridSearchTest, AutoWireSendsOnlyTheSlowAllReduceInEightBitBlocks) {
  auto spec = Spec(2, 2, 1);
  spec.mutable_parallel()->set_placement("in_order");
  const std::vector<WorkerRecord> idle = {Worker("a1"), Worker("a2"), Worker("b1"), Worker("a3")};
  const LinkLookup links = Racks(10e9, 1e6);
  auto f32 = EstimateGrid(spec, idle, links);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_TRUE(absl::StrContains(f32->critical_path, "all-reduce of stage 0")) << f32->critical_path;
  EXPECT_FALSE(f32->positions[0].int8_reduce);
  spec.mutable_parallel()->set_wire_dtype("auto");
  auto placed = PlaceGrid(spec, "job-1", 1, 2, idle, {}, {}, links);
  ASSERT_TRUE(placed.ok()) << placed.status();
  ASSERT_EQ(placed->workers, (std::vector<std::string>{"id-a1", "id-a2", "id-b1", "id-a3"}));
  for (const auto& a : placed->assignments) {
    EXPECT_EQ(a.int8_reduce(), a.stage() == 0) << "stage " << a.stage() << " replica " << a.replica();
  }
  auto preview = PreviewGrid(spec, idle, links);
  ASSERT_TRUE(preview.ok());
  for (const auto& st : preview->stages()) {
    EXPECT_EQ(st.wire_reduce(), st.stage() == 0 ? "int8" : "f32") << st.stage() << "/" << st.replica();
    if (st.stage() == 0) {
      EXPECT_LT(st.reduce_seconds(), 0.3 * f32->positions[0].reduce_seconds);
    }
  }
  EXPECT_LT(preview->predicted_step_seconds(), 0.5 * f32->step_seconds);
  spec.mutable_parallel()->set_wire_dtype("int8");
  auto every = PlaceGrid(spec, "job-1", 1, 2, idle, {}, {}, links);
  ASSERT_TRUE(every.ok());
  for (const auto& a : every->assignments) EXPECT_TRUE(a.int8_reduce()) << a.stage() << "/" << a.replica();
  auto alone = PlaceGrid(Spec(2, 1, 1), "job-1", 1, 2, idle, {}, {}, links);
  ASSERT_TRUE(alone.ok());
  EXPECT_FALSE(alone->assignments[0].int8_reduce()) << "no replicas, no all-reduce";
}

// Reports that say a worker is slower than its probe move a fresh plan's
// cut, not a restart's: its workers hold the state of the cut they had.
TEST(GridSearchTest, AchievedRatesMoveAFreshCutButNotARestartsCut) {
  const auto spec = Spec(2, 1, 1, 12);
  WorkerRecord slow = Worker("w1");
  slow.planning_flops = 0.5e11;  // its reports disagreed with its probe
  const std::vector<WorkerRecord> grid = {Worker("w0"), slow};
  auto even = EstimateGrid(spec, {Worker("w0"), Worker("w1")}, LinksFrom(nullptr));
  auto fresh = EstimateGrid(spec, grid, LinksFrom(nullptr));
  ASSERT_TRUE(even.ok() && fresh.ok());
  const int split = even->plan.stages[1].unit_begin;
  EXPECT_GT(fresh->plan.stages[1].unit_begin, split) << "the slower w1 gets fewer units";
  auto restart = EstimateGrid(spec, grid, LinksFrom(nullptr), {0, split});
  ASSERT_TRUE(restart.ok());
  EXPECT_EQ(restart->plan.stages[1].unit_begin, split) << "the restart keeps its cut";
}

// A restart keeps the workers that hold its state where they were.
TEST(GridSearchTest, ARestartKeepsItsWorkersInPlace) {
  const auto spec = Spec(1, 2, 2);
  const std::vector<WorkerRecord> idle = {Worker("a1"), Worker("b1"), Worker("a2"), Worker("b2")};
  auto grid = ChooseGrid(spec, idle, {"a1", "b1", "a2", "b2"}, Racks(10e9, 50e6));
  ASSERT_TRUE(grid.ok());
  EXPECT_EQ(Names(*grid), (std::vector<std::string>{"a1", "b1", "a2", "b2"}));
}

// No placement fits: the refusal names the stage and the worker.
TEST(GridSearchTest, AGridThatCannotFitIsRefusedNamingThePosition) {
  const auto spec = Spec(2, 1, 1);
  const std::vector<WorkerRecord> idle = {Worker("big", 1e11, 8 * kGiB), Worker("tiny", 1e11, 1 << 20)};
  auto grid = ChooseGrid(spec, idle, {}, LinksFrom(nullptr));
  ASSERT_TRUE(grid.ok());
  auto cost = EstimateGrid(spec, *grid, LinksFrom(nullptr));
  ASSERT_FALSE(cost.ok());
  EXPECT_EQ(cost.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StrContains(cost.status().message(), "on worker tiny")) << cost.status();
}

// A stage with a worker whose backend composes attention (CUDA) counts the
// backward scratch of the weights' size, once: 8 heads × 128 keys a token of
// one micro-batch (32 / (8 × 2 replicas) = 2 sequences × 128 tokens).
TEST(GridSearchTest, AStageWithACudaWorkerCountsTheComposedAttentionsScratch) {
  const auto spec = Spec(1, 2, 1);
  std::vector<WorkerRecord> grid = {Worker("a"), Worker("b")};
  for (WorkerRecord& w : grid) w.capabilities.set_device("cpu");
  auto cpu = EstimateGrid(spec, grid, LinksFrom(nullptr));
  grid[1].capabilities.set_device("cuda:0");
  auto mixed = EstimateGrid(spec, grid, LinksFrom(nullptr));
  ASSERT_TRUE(cpu.ok() && mixed.ok());
  EXPECT_EQ(mixed->plan.stages[0].memory_bytes - cpu->plan.stages[0].memory_bytes, int64_t{2} * 128 * 8 * 128 * 4);
}

}  // namespace
}  // namespace shardline::server
