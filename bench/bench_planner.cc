// bench_planner: how long the coordinator's placement search takes
// (ChooseGrid, as a job's start and every weighed re-plan run it, under the
// job manager's lock) on synthetic clusters: `positions` = p stages × 4
// replicas over p × 4 + 8 idle workers on hosts of their own, racks of
// eight (1.25 GB/s inside, 125 MB/s between), three GEMM rates. Each size
// runs twice in the same process: links from a LinkTable holding every
// measurement (what the coordinator plans on: LinksFrom) and from a
// precomputed matrix (no table at all); the ratio is what reading the table
// costs the search. Beside it, the chosen grid's predicted step and the
// plain choice's (registration order), where the search starts.
//
//   bench_planner [--positions=8,32,64] [--reps=3] [--json=FILE]
#include <limits>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_report.h"
#include "common/init.h"
#include "common/job_spec.h"
#include "glog/logging.h"
#include "server/grid_cost.h"
#include "server/grid_search.h"
#include "server/link_table.h"

ABSL_FLAG(std::string, positions, "8,32,64", "grid sizes (multiples of 4: p stages x 4 replicas)");
ABSL_FLAG(int, reps, 3, "timed searches per size (median reported)");
ABSL_FLAG(std::string, json, "", "write the rows as JSON to this file");

namespace shardline::bench {
namespace {

using server::LinkEstimate;
using server::LinkRecord;
using server::WorkerRecord;

constexpr int kReplicas = 4;
constexpr int kSpares = 8;
constexpr int kRack = 8;

double Rate(size_t from, size_t to) { return from / kRack == to / kRack ? 1.25e9 : 1.25e8; }

shardline::v1::JobSpec Spec(int stages) {
  const std::string json = absl::StrCat(
      R"({"name": "bench",
      "model": {"kind": "gpt", "vocab_size": 256, "context": 128, "d_model": 512, "n_heads": 8, "n_layers": 64},
      "data": {"kind": "text_bytes", "path": "/x"},
      "train": {"steps": 10, "global_batch": 64, "micro_batches": 16, "seed": 1,
                "optimizer": {"kind": "adamw", "lr": 0.001}},
      "parallel": {"pipeline_stages": )",
      stages, R"(, "data_parallel": )", kReplicas, "}}");
  absl::StatusOr<shardline::v1::JobSpec> spec = common::ParseJobSpec(json);
  BENCH_CHECK_OK(spec.status());
  return *spec;
}

void BenchSize(int positions, int reps, BenchReport& report) {
  CHECK(positions > 0 && positions % kReplicas == 0) << "--positions: multiples of " << kReplicas;
  const shardline::v1::JobSpec spec = Spec(positions / kReplicas);
  const size_t n = static_cast<size_t>(positions + kSpares);
  std::vector<WorkerRecord> idle(n);
  server::LinkTable table;
  for (size_t i = 0; i < n; ++i) {
    WorkerRecord& w = idle[i];
    w.id = absl::StrCat("worker-", i);
    w.order = static_cast<int64_t>(i);
    w.name = absl::StrCat("w", i);
    w.capabilities.set_gemm_flops(1e11 * static_cast<double>(1 + i % 3));
    w.capabilities.set_memory_bytes(int64_t{64} << 30);
    w.capabilities.set_listen_address(absl::StrCat("10.0.", i, ".1:7401"));
    table.Joined(w.name, absl::StrCat("10.0.", i, ".1"), {});
  }
  for (size_t i = 0; i < n; ++i) {
    std::vector<LinkRecord> probes;
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      LinkRecord& l = probes.emplace_back();
      l.to = idle[j].name;
      l.bytes_per_second = Rate(i, j);
      l.rtt_seconds = 1e-4;
    }
    table.Record(idle[i].name, probes);
  }
  // The same figures without the table, by registration order.
  const server::LinkLookup matrix = [](const WorkerRecord& from, const WorkerRecord& to) {
    LinkEstimate e;
    e.measured = true;
    e.rtt_seconds = 1e-4;
    const size_t a = static_cast<size_t>(from.order), b = static_cast<size_t>(to.order);
    e.bytes_per_second = a == b ? std::numeric_limits<double>::infinity() : Rate(a, b);
    return e;
  };
  double seconds[2] = {0, 0};
  std::vector<std::string> grids[2];
  std::vector<WorkerRecord> chosen;
  for (int with_table = 0; with_table < 2; ++with_table) {
    seconds[with_table] = MedianSeconds(reps, [&] {
      absl::StatusOr<std::vector<WorkerRecord>> grid =
          server::ChooseGrid(spec, idle, {}, with_table ? server::LinksFrom(&table) : matrix, {});
      BENCH_CHECK_OK(grid.status());
      grids[with_table].clear();
      for (const WorkerRecord& w : *grid) grids[with_table].push_back(w.name);
      chosen = *grid;
    });
  }
  CHECK(grids[0] == grids[1]) << "the same figures chose another grid";
  // What the search found: the chosen grid's predicted step against the
  // plain choice's (registration order).
  const std::vector<WorkerRecord> plain(idle.begin(), idle.begin() + positions);
  absl::StatusOr<server::GridCost> found = server::EstimateGrid(spec, chosen, server::LinksFrom(&table));
  absl::StatusOr<server::GridCost> start = server::EstimateGrid(spec, plain, server::LinksFrom(&table));
  BENCH_CHECK_OK(found.status());
  BENCH_CHECK_OK(start.status());
  report.Add({{"positions", static_cast<double>(positions)},
              {"idle_workers", static_cast<double>(n)},
              {"search_s", seconds[1]},
              {"search_without_table_s", seconds[0]},
              {"table_cost_ratio", seconds[1] / seconds[0]},
              {"plain_step_s", start->step_seconds},
              {"chosen_step_s", found->step_seconds}});
}

}  // namespace
}  // namespace shardline::bench

int main(int argc, char** argv) {
  shardline::common::InitProcess(argc, argv, "how long the coordinator's placement search takes");
  shardline::bench::BenchReport report;
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_positions), ',', absl::SkipEmpty())) {
    shardline::bench::BenchSize(std::stoi(std::string(size)), absl::GetFlag(FLAGS_reps), report);
  }
  BENCH_CHECK_OK(report.Publish(absl::GetFlag(FLAGS_json)));
  return 0;
}
