// Placement of a job on a p × d × t grid of idle workers (positions
// (r·p + s)·t + k: stage s of replica r, tensor rank k): which workers
// where (ChooseGrid, server/grid_search.h: the plain choice, then a local
// search on the predicted step time with the measured links), and the cut
// and prediction (EstimateGrid, server/grid_cost.h: the d replicas share
// one pipeline cut, planned on the slowest and smallest worker of each
// stage, a stage's t ranks counted as one worker t times as fast and as
// large, plus its tensor collectives over its group's slowest link).
// PreviewGrid answers `shardctl plan`; PlaceGrid builds what starting the
// job needs: each position's worker, its StageStatus and its Assignment.
#ifndef SHARDLINE_SERVER_GRID_PLACEMENT_H_
#define SHARDLINE_SERVER_GRID_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/grid_cost.h"
#include "server/worker_registry.h"
#include "shardline/v1/admin.pb.h"
#include "shardline/v1/coordinator.pb.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

struct GridPlacement {
  int stages = 0;    // p
  int replicas = 1;  // d
  int tensor_ranks = 1;  // t
  // By position.
  std::vector<std::string> workers;  // worker ids
  std::vector<shardline::v1::StageStatus> stage_statuses;
  std::vector<shardline::v1::Assignment> assignments;
  // Each position's share of its stage's forward and backward FLOPs in a
  // step (what its reported busy seconds are measured against).
  std::vector<double> flops_per_step;
  // The parameters each position's optimizer step updates (its ZeRO-1
  // share with parallel.shard_optimizer).
  std::vector<double> optimizer_parameters;
  double predicted_step_seconds = 0;  // EstimateGrid's
  std::string critical_path;
};

// The plan `spec` (validated) would get on `idle` now. INVALID_ARGUMENT
// when fewer than p × d are idle; the planner's errors as they come.
absl::StatusOr<shardline::v1::PlanResponse> PreviewGrid(const shardline::v1::JobSpec& spec,
                                                        const std::vector<WorkerRecord>& idle,
                                                        const LinkLookup& links = LinksFrom(nullptr));

// Places job `job_id` (the assignments' plan epoch is the caller's) on the first `stages` × d of `idle`
// (there must be that many; `stages` is the spec's p, or fewer for a job
// re-planned onto the workers it has left: the cut is planned for that
// many, and the assignments' spec says so), every assignment starting at
// `first_step` (1 for a fresh job; after a restart or a loss, one after
// the committed version). `previous`, the names of the workers that held
// each position before a restart (same p × d), keeps those still idle
// where they were, and `previous_cut` (each stage's first unit) when it is
// nearly as fast as the best (PlanPipeline): they hold that position's
// state in memory. A position starting after step 1 is told its twins'
// addresses (state_peers).
//
// `replicas` (0: the spec's d) places a grid of fewer replicas, a divisor
// d′ of d, for a job that lost workers: each runs d / d′ of the spec's
// replicas' micro-batch groups (Assignment.replica_groups; the assignments'
// spec is common::FoldReplicas'), planned as the spec d′ replicas of m·d/d′
// micro-batches would be, plus the host copies of the groups' gradients
// each position keeps (FAILED_PRECONDITION where they do not fit).
absl::StatusOr<GridPlacement> PlaceGrid(const shardline::v1::JobSpec& spec, const std::string& job_id,
                                        int64_t first_step, int stages,
                                        const std::vector<WorkerRecord>& idle,
                                        const std::vector<std::string>& previous = {},
                                        const std::vector<int>& previous_cut = {},
                                        const LinkLookup& links = LinksFrom(nullptr), int replicas = 0);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_GRID_PLACEMENT_H_
