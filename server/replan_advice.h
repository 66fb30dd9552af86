// Whether a running job should move to a new plan: its layout as it runs
// (its workers by position, its cut kept) estimated on what the
// coordinator knows now (the achieved rates its reports keep updating, the
// link table), against the best layout the search finds over the same
// workers and the idle ones. JobManager asks once a job's steps have
// slowed for long (StepPace) and re-plans when the new layout is predicted
// kReplanGain times faster: moving costs a restart (state reloaded,
// streams reconnected), so near-equal layouts never trade places. Pure
// computation.
#ifndef SHARDLINE_SERVER_REPLAN_ADVICE_H_
#define SHARDLINE_SERVER_REPLAN_ADVICE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/grid_cost.h"
#include "server/worker_registry.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

inline constexpr double kReplanGain = 1.25;

struct ReplanAdvice {
  GridCost current;   // the running layout, estimated now
  GridCost proposed;  // the best found
  std::vector<WorkerRecord> proposed_grid;
  bool replan = false;  // proposed is predicted kReplanGain times faster
  // For people: the two predictions, and what paces each.
  std::string why;
};

// `grid`: the job's workers by position (p × d × t, spec.pipeline_stages
// p); `cut`: each stage's first unit; `spare`: idle workers the new layout
// may take.
absl::StatusOr<ReplanAdvice> AdviseReplan(const shardline::v1::JobSpec& spec, const std::vector<WorkerRecord>& grid,
                                          const std::vector<int>& cut, const std::vector<WorkerRecord>& spare,
                                          const LinkLookup& links);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_REPLAN_ADVICE_H_
