#include "server/replan_advice.h"

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "server/grid_search.h"

namespace shardline::server {

absl::StatusOr<ReplanAdvice> AdviseReplan(const shardline::v1::JobSpec& spec, const std::vector<WorkerRecord>& grid,
                                          const std::vector<int>& cut, const std::vector<WorkerRecord>& spare,
                                          const LinkLookup& links) {
  ReplanAdvice advice;
  ASSIGN_OR_RETURN(advice.current, EstimateGrid(spec, grid, links, cut, /*keep_cut=*/true));
  std::vector<WorkerRecord> candidates = grid;
  candidates.insert(candidates.end(), spare.begin(), spare.end());
  ASSIGN_OR_RETURN(advice.proposed_grid, ChooseGrid(spec, candidates, {}, links));
  ASSIGN_OR_RETURN(advice.proposed, EstimateGrid(spec, advice.proposed_grid, links));
  advice.replan = advice.proposed.step_seconds * kReplanGain < advice.current.step_seconds;
  advice.why = absl::StrFormat("the running layout is predicted at %.4g s a step now (%s), a new one at %.4g s (%s)",
                               advice.current.step_seconds, advice.current.critical_path,
                               advice.proposed.step_seconds, advice.proposed.critical_path);
  return advice;
}

}  // namespace shardline::server
