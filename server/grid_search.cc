#include "server/grid_search.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/planner.h"

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

// The constructive start: the idle workers (in ByHost's order) cut into
// runs of t, a run as fast as its slowest worker; the p × d fastest runs,
// sorted by that rate (equal ones keep their order), dealt stage by stage
// so that a stage's d replicas run alike (a stage runs at its slowest
// replica's pace): a stage's replicas are workers registered near each
// other (often one rack: its all-reduce). With `chains`, within a block of
// stages whose rates are equal within kRateNoiseFloor the runs are dealt
// replica by replica instead, so that a replica's consecutive stages are
// near each other (its hops). The fastest stage first or last
// (`fastest_first`). Indices into `idle` by position.
std::vector<size_t> ByRate(const std::vector<WorkerRecord>& idle, int p, int d, int t, bool chains,
                           bool fastest_first) {
  std::vector<size_t> runs;  // each run's first index
  for (size_t first = 0; first + static_cast<size_t>(t) <= idle.size(); first += static_cast<size_t>(t)) {
    runs.push_back(first);
  }
  std::vector<double> rate(idle.size(), 0);
  for (size_t first : runs) {
    rate[first] = PlanningFlops(idle[first]);
    for (int k = 1; k < t; ++k) rate[first] = std::min(rate[first], PlanningFlops(idle[first + k]));
  }
  std::stable_sort(runs.begin(), runs.end(), [&](size_t a, size_t b) { return rate[a] > rate[b]; });
  std::vector<size_t> grid(static_cast<size_t>(p * d * t));
  for (int begin = 0; begin < p;) {
    const double fastest = rate[runs[begin * d]];
    int end = begin + 1;
    while (chains && end < p && fastest <= (1 + kRateNoiseFloor) * rate[runs[(end + 1) * d - 1]]) ++end;
    const int stages = end - begin;
    for (int j = 0; j < stages * d; ++j) {
      const int r = j / stages, s = fastest_first ? begin + j % stages : p - 1 - begin - j % stages;
      for (int k = 0; k < t; ++k) {
        grid[static_cast<size_t>((r * p + s) * t + k)] = runs[begin * d + j] + static_cast<size_t>(k);
      }
    }
    begin = end;
  }
  return grid;
}

constexpr double kInfinite = std::numeric_limits<double>::infinity();

// A grid, the idle workers not in it, and its predicted step.
struct Candidate {
  std::vector<WorkerRecord> grid, spare;
  double step = kInfinite;
};

// The local search from `c`: each round takes the best single move while
// it shortens the step by more than kSearchGain (an infeasible start takes
// any feasible move), until a round finds none or `evaluations` (counted
// by `predicted`) reach `limit` (a round cut short takes the best move it
// found).
template <typename Predicted>
void Improve(Candidate& c, const LinkLookup& links, const int& evaluations, int limit, const Predicted& predicted) {
  const int n = static_cast<int>(c.grid.size());
  std::vector<WorkerRecord>& grid = c.grid;
  // The grid's link groups: a swap of two positions keeps them (its
  // workers are the same), one with a spare builds them again.
  LinkGroups groups = GroupsOf(grid, links);
  for (int round = 0; round < kSearchRounds && evaluations < limit; ++round) {
    double best = c.step;
    std::pair<int, int> move{-1, -1};  // (position, position) or (position, n + spare index)
    for (int i = 0; i < n && evaluations < limit; ++i) {
      for (int j = i + 1; j < n + static_cast<int>(c.spare.size()) && evaluations < limit; ++j) {
        const bool inside = j < n;
        WorkerRecord& other = inside ? grid[j] : c.spare[j - n];
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
    if (move.first < 0 || !(c.step == kInfinite || best < c.step * (1 - kSearchGain))) break;
    const bool inside = move.second < n;
    WorkerRecord& other = inside ? grid[move.second] : c.spare[move.second - n];
    std::swap(grid[move.first], other);
    if (inside) {
      groups.Swap(move.first, move.second);
    } else {
      groups = GroupsOf(grid, links);
    }
    c.step = best;
  }
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
  std::vector<size_t> at(n);  // each position's index in idle
  std::vector<bool> placed(n, false), used(idle.size(), false);
  bool pinned = false;
  for (int i = 0; i < n && static_cast<int>(previous.size()) == n; ++i) {
    for (size_t w = 0; w < idle.size(); ++w) {
      if (!used[w] && idle[w].name == previous[i]) {
        at[i] = w;
        placed[i] = used[w] = pinned = true;
        break;
      }
    }
  }
  size_t next = 0;
  for (int i = 0; i < n; ++i) {
    if (placed[i]) continue;
    while (used[next]) ++next;
    at[i] = next;
    used[next] = true;
  }
  if (pinned || in_order) {
    std::vector<WorkerRecord> grid;
    for (size_t w : at) grid.push_back(idle[w]);
    return grid;
  }

  // The local search, from the plain choice and from each constructive
  // start (ByRate's two layouts, the faster of each one's orientations)
  // predicted clearly faster than it (large uneven clusters, where no
  // single move from the plain choice gives a stage replicas of one rate):
  // the fastest start first, the plain choice last, each on an equal share
  // of the evaluations left. The fastest result wins, the plain one's on a
  // tie.
  int evaluations = 0;
  auto predicted = [&](const std::vector<WorkerRecord>& g, const LinkGroups* known) {
    ++evaluations;
    absl::StatusOr<GridCost> cost = EstimateGrid(spec, g, links, prefer_cut, false, known);
    return cost.ok() ? cost->step_seconds : kInfinite;
  };
  auto clearly_faster = [](double step, double than) {
    return than == kInfinite ? step < kInfinite : step < than * (1 - kSearchGain);
  };
  auto candidate = [&](const std::vector<size_t>& positions) {
    Candidate c;
    std::vector<bool> in(idle.size(), false);
    for (size_t w : positions) {
      c.grid.push_back(idle[w]);
      in[w] = true;
    }
    for (size_t w = 0; w < idle.size(); ++w) {
      if (!in[w]) c.spare.push_back(idle[w]);
    }
    c.step = predicted(c.grid, nullptr);
    return c;
  };
  std::vector<Candidate> searches;
  const Candidate plain = candidate(at);
  const int p = spec.parallel().pipeline_stages(), d = std::max(1, spec.parallel().data_parallel());
  for (const bool chains : {false, true}) {
    Candidate first = candidate(ByRate(idle, p, d, t, chains, true));
    Candidate last = candidate(ByRate(idle, p, d, t, chains, false));
    Candidate& faster = last.step < first.step ? last : first;
    if (clearly_faster(faster.step, plain.step)) searches.push_back(std::move(faster));
  }
  std::stable_sort(searches.begin(), searches.end(),
                   [](const Candidate& a, const Candidate& b) { return a.step < b.step; });
  searches.push_back(plain);
  for (size_t i = 0; i < searches.size(); ++i) {
    const int share = (kSearchEvaluations - evaluations) / static_cast<int>(searches.size() - i);
    Improve(searches[i], links, evaluations, evaluations + share, predicted);
  }
  const Candidate* best = &searches.back();
  for (const Candidate& c : searches) {
    if (c.step < best->step) best = &c;
  }
  return best->grid;
}

}  // namespace shardline::server
