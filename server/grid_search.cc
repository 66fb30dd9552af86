#include "server/grid_search.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardline::server {
namespace {

// Idle workers ordered so that consecutive runs of t share a host where
// they can: a host's workers together, hosts in the order their first idle
// worker registered.
std::vector<WorkerRecord> ByHost(const std::vector<WorkerRecord>& idle, int t) {
  if (t <= 1) return idle;
  std::vector<std::string> hosts;
  for (const WorkerRecord& w : idle) {
    if (std::find(hosts.begin(), hosts.end(), HostOf(w)) == hosts.end()) hosts.push_back(HostOf(w));
  }
  std::vector<WorkerRecord> out;
  for (const std::string& h : hosts) {
    for (const WorkerRecord& w : idle) {
      if (HostOf(w) == h) out.push_back(w);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<WorkerRecord>> ChooseGrid(const shardline::v1::JobSpec& spec,
                                                     const std::vector<WorkerRecord>& idle_workers,
                                                     const std::vector<std::string>& previous, const LinkLookup& links,
                                                     const std::vector<int>& prefer_cut) {
  const int t = std::max(1, spec.parallel().tensor_parallel());
  const int n = spec.parallel().pipeline_stages() * std::max(1, spec.parallel().data_parallel()) * t;
  if (static_cast<int>(idle_workers.size()) < n) {
    return absl::FailedPreconditionError(absl::StrCat("placing ", n, " positions on ", idle_workers.size(), " workers"));
  }
  // The plain choice: previous holders in place, then the rest in order.
  const bool in_order = spec.parallel().placement() == "in_order";
  const std::vector<WorkerRecord> idle = in_order ? idle_workers : ByHost(idle_workers, t);
  std::vector<WorkerRecord> grid(n);
  std::vector<bool> placed(n, false), used(idle.size(), false);
  bool pinned = false;
  for (int i = 0; i < n && static_cast<int>(previous.size()) == n; ++i) {
    for (size_t w = 0; w < idle.size(); ++w) {
      if (!used[w] && idle[w].name == previous[i]) {
        grid[i] = idle[w];
        placed[i] = used[w] = pinned = true;
        break;
      }
    }
  }
  size_t next = 0;
  for (int i = 0; i < n; ++i) {
    if (placed[i]) continue;
    while (used[next]) ++next;
    grid[i] = idle[next];
    used[next] = true;
  }
  if (pinned || in_order) return grid;

  // The local search.
  std::vector<WorkerRecord> spare;
  for (size_t w = 0; w < idle.size(); ++w) {
    if (!used[w]) spare.push_back(idle[w]);
  }
  constexpr double kInfinite = std::numeric_limits<double>::infinity();
  int evaluations = 0;
  // The grid's link groups: a swap of two positions keeps them (its
  // workers are the same), one with a spare builds them again.
  LinkGroups groups = GroupsOf(grid, links);
  auto predicted = [&](const std::vector<WorkerRecord>& g, const LinkGroups* known) {
    ++evaluations;
    absl::StatusOr<GridCost> cost = EstimateGrid(spec, g, links, prefer_cut, false, known);
    return cost.ok() ? cost->step_seconds : kInfinite;
  };
  double current = predicted(grid, &groups);
  for (int round = 0; round < kSearchRounds && evaluations < kSearchEvaluations; ++round) {
    double best = current;
    std::pair<int, int> move{-1, -1};  // (position, position) or (position, n + spare index)
    for (int i = 0; i < n && evaluations < kSearchEvaluations; ++i) {
      for (int j = i + 1; j < n + static_cast<int>(spare.size()) && evaluations < kSearchEvaluations; ++j) {
        const bool inside = j < n;
        WorkerRecord& other = inside ? grid[j] : spare[j - n];
        std::swap(grid[i], other);
        if (inside) groups.Swap(i, j);
        const double step = predicted(grid, inside ? &groups : nullptr);
        if (inside) groups.Swap(i, j);
        std::swap(grid[i], other);
        if (step < best) {
          best = step;
          move = {i, j};
        }
      }
    }
    // Take it only when clearly better (an infeasible start takes any feasible move).
    if (move.first < 0 || !(current == kInfinite || best < current * (1 - kSearchGain))) break;
    const bool inside = move.second < n;
    WorkerRecord& other = inside ? grid[move.second] : spare[move.second - n];
    std::swap(grid[move.first], other);
    if (inside) {
      groups.Swap(move.first, move.second);
    } else {
      groups = GroupsOf(grid, links);
    }
    current = best;
  }
  return grid;
}

}  // namespace shardline::server
