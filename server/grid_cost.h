// The predicted step time of a job on a given p × d × t grid of workers
// (positions (r·p + s)·t + k, as GridPlacement), from compute (each
// worker's rate: the cut on PlanningFlops, the prediction on
// PredictingFlops, server/worker_registry.h), memory, and the measured
// links between them:
//
//   slot  = the slowest of: each stage's compute and tensor collectives per
//           micro-batch (the cut is PlanPipeline's, on those costs), and
//           each pipeline hop's activation (forward) or gradient (backward)
//           per micro-batch over its link, plus the link's round trip;
//   fill  = one micro-batch through the pipeline and back: every stage's
//           passes and every hop's activation and gradient (the slowest
//           replica's); the other m − 1 follow one slot apart;
//   step  = (m − 1) · slot  +  fill  +  the slowest optimizer step (its
//           parameters at the rate its worker's reports showed, where any
//           worker has one: WorkerRecord::planning_optimizer_rate)  +  the
//           slowest stage's data-parallel
//           all-reduce (a ring over its replicas: 2 (d − 1)/d of its
//           gradients over the ring's slowest link, 2 (d − 1) round trips).
//
// Transfers overlap compute (stage links and buckets run beside the
// passes), so a hop or a stage, whichever is slower, sets the pace; the
// all-reduce after the last backward is not overlapped. Links never
// measured are taken at kAssumedHostBytesPerSecond within one host and
// kAssumedNetworkBytesPerSecond across hosts: with no measurements the
// prediction is today's compute-only one. Pure computation; thread-safe.
#ifndef SHARDLINE_SERVER_GRID_COST_H_
#define SHARDLINE_SERVER_GRID_COST_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/int8_blocks.h"
#include "server/link_groups.h"
#include "server/link_table.h"
#include "server/planner.h"
#include "server/worker_registry.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

inline constexpr double kAssumedHostBytesPerSecond = 10e9;
inline constexpr double kAssumedNetworkBytesPerSecond = 1.25e9;  // 10 Gbit/s
// parallel.wire_dtype "auto": a hop goes in 8-bit blocks where its f32
// transfer per micro-batch takes more than this share of the slower end's
// compute (it is, or will be when links are shared, what the stages wait on).
// A stage's data-parallel all-reduce goes in 8-bit blocks (with error
// feedback) where its f32 one takes more than this share of the
// pipeline's time per step ((m − 1) slots and the fill).
inline constexpr double kInt8HopShare = 0.25;
// Bytes of 8-bit blocks per byte of f32 they replace (68 per 256).
inline constexpr double kInt8BytesPerF32Byte =
    static_cast<double>(common::kInt8BlockBytes) / (4 * common::kInt8BlockValues);

struct LinkEstimate {
  double bytes_per_second = 0;
  double rtt_seconds = 0;
  bool measured = false;
};
// The link from one worker to another (the same worker: free).
using LinkLookup = std::function<LinkEstimate(const WorkerRecord& from, const WorkerRecord& to)>;
// From `table`'s measurements (stale ones too: they are the best known;
// a slowdown a running job observed where it is lower than the probe),
// else the assumptions above, capped where an end's own link is suspected
// (LinkTable::Suspect) and the link was not probed since; null:
// assumptions only. The lookup keeps each link's estimate from its first
// use on (one planning's view of the table, read once): made for one
// planning, used from one thread.
LinkLookup LinksFrom(const LinkTable* table);

// Gradient bytes one worker of a stage holding `parameters` sends per step
// in its d replicas' all-reduce (reduce-scatter and all-gather, (d − 1)/d
// each).
double ReduceBytesPerStep(int64_t parameters, int d);

// The host part of a worker's StageLink address.
std::string HostOf(const WorkerRecord& w);

struct PositionCost {
  double compute_seconds = 0;  // per micro-batch, forward + backward, at its worker's PredictingFlops
  double tensor_seconds = 0;   // per micro-batch, its tensor group's collectives
  double hop_seconds = 0;      // per micro-batch, to the next stage (activation or gradient, the slower)
  double reduce_seconds = 0;   // per step, its data-parallel all-reduce
  double optimizer_seconds = 0;  // per step, its optimizer step (0: no rate known)
  bool int8_to_next = false;     // its hop to the next stage in 8-bit blocks
  bool int8_reduce = false;      // its data-parallel all-reduce in 8-bit blocks (error feedback)
  int64_t memory_bytes = 0;
};

struct GridCost {
  PipelinePlan plan;                    // the cut
  std::vector<PositionCost> positions;  // by position
  double slot_seconds = 0;
  double fill_seconds = 0;    // one micro-batch through every stage and hop, forward and back
  double reduce_seconds = 0;  // the slowest stage's all-reduce
  double optimizer_seconds = 0;  // the slowest position's optimizer step
  double step_seconds = 0;
  // What sets the pace, for people: "compute of stage 2 on w3", "hop from
  // stage 0 to 1 of replica 1 (w1 → w4, 24.0 MB/s)", …
  std::string critical_path;
};

// `grid` holds p × d × t workers by position; `spec` is validated, its
// pipeline_stages p. The planner's errors as they come (a cut that does
// not fit names the stage and worker). `prefer_cut` (a restart's) is kept
// unless another is clearly faster on the probes; with `keep_cut` it is
// kept whenever it fits (a running layout, estimated on what is known now).
// `groups`: the grid's link groups (LinkGroups over `grid` and `links`),
// where the caller has them (a search whose move kept the grid's workers
// and only swapped two positions); built here where null.
absl::StatusOr<GridCost> EstimateGrid(const shardline::v1::JobSpec& spec, const std::vector<WorkerRecord>& grid,
                                      const LinkLookup& links, const std::vector<int>& prefer_cut = {},
                                      bool keep_cut = false, const LinkGroups* groups = nullptr);
// LinkGroups over `grid`, on `links`' bandwidths.
LinkGroups GroupsOf(const std::vector<WorkerRecord>& grid, const LinkLookup& links);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_GRID_COST_H_
