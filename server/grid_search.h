// Which idle workers fill a job's p × d × t grid, and where (positions
// (r·p + s)·t + k). The start is the plain choice: the worker that held
// each position before a restart where it is idle, then the idle workers
// in registration order, consecutive runs of t from one host where one has
// that many. Then, unless a restart pinned workers to their positions
// (they hold its state), a local search on EstimateGrid's predicted step:
// each round takes the best single move (two positions swap workers, or an
// idle worker not in the grid takes a position) while it shortens the step
// by more than kSearchGain, so measured noise never reshuffles a grid.
// The search also runs from constructive starts (the fastest runs of t
// sorted by rate, dealt stage by stage so a stage's replicas run alike:
// ByRate in grid_search.cc) predicted clearly faster than the plain
// choice, each search on an equal share of kSearchEvaluations; the fastest
// result is chosen (the plain search's on a tie).
// With measured links this puts a tensor group's ranks on fast links and
// the slow links where the fewest bytes cross; with faster and slower
// workers it puts them where the cut can use them. parallel.placement
// "in_order": the idle workers in registration order, no search. Pure
// computation.
#ifndef SHARDLINE_SERVER_GRID_SEARCH_H_
#define SHARDLINE_SERVER_GRID_SEARCH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/grid_cost.h"
#include "server/worker_registry.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

inline constexpr double kSearchGain = 0.03;
inline constexpr int kSearchRounds = 16;
inline constexpr int kSearchEvaluations = 4096;  // a bound on the planner calls of one search

// `spec`'s pipeline_stages is the p to place; `idle` must hold at least
// p × d × t workers; `previous` (a restart: the names by position) is kept
// where idle and then pins the grid.
absl::StatusOr<std::vector<WorkerRecord>> ChooseGrid(const shardline::v1::JobSpec& spec,
                                                     const std::vector<WorkerRecord>& idle,
                                                     const std::vector<std::string>& previous, const LinkLookup& links,
                                                     const std::vector<int>& prefer_cut = {});

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_GRID_SEARCH_H_
