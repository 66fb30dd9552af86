// The pipeline planner: cuts the model's unit list (embedding, blocks, head)
// into contiguous stages, one per worker, minimising the slowest stage's time
// per micro-batch from the cost model and each worker's measured GEMM rate,
// subject to each stage's memory fitting its worker. Workers of different
// speed get different numbers of layers. Pure computation; thread-safe.
#ifndef SHARDLINE_SERVER_PLANNER_H_
#define SHARDLINE_SERVER_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "shardline/v1/job.pb.h"

namespace shardline::server {

struct WorkerCapacity {
  std::string name;
  double flops_per_second = 0;  // measured f32 GEMM rate
  int64_t memory_bytes = 0;     // usable by the stage (device memory on GPUs)
  double flops_spread = 0;      // how much its rate's probes disagreed: (max − min) / median
  // Its tensor group's collectives: seconds per byte a rank receives (the
  // group's slowest link; 0 without tensor parallelism). Reported per
  // stage (StagePlan::tensor_seconds); the cut balances compute alone.
  double tensor_seconds_per_byte = 0;
  // Its blocks keep a log-sum-exp per head and token instead of the attention
  // weights (common::RecomputesAttentionWeights: CPU workers, long sequences).
  bool recomputes_attention = false;
  // Its blocks compose attention from GEMMs (no attention kernel: CUDA) and
  // hold a backward scratch of the weights' size, once per stage.
  bool composes_attention = false;
};

// Rates closer than their probes' spread, and than this floor, are taken
// for the same hardware: the planner plans them as one rate (their mean),
// so two equal workers measured apart by noise get an equal cut.
inline constexpr double kRateNoiseFloor = 0.10;
// `workers` with each group of rates that are equal within the noise
// (sorted, grouped from the slowest: a rate joins while it is within
// max(kRateNoiseFloor, the group's spreads) of the group's slowest) set to
// the group's mean. Exposed for tests and `plan --explain`.
std::vector<WorkerCapacity> EqualizeRates(std::vector<WorkerCapacity> workers);

struct StagePlan {
  int unit_begin = 0;
  int unit_end = 0;  // exclusive
  std::string worker;
  double seconds_per_micro_batch = 0;  // predicted, forward + backward: compute + tensor collectives
  double compute_seconds = 0;          // of which compute
  double tensor_seconds = 0;           // of which its tensor group's collectives
  int64_t memory_bytes = 0;            // predicted peak: parameters, gradients, optimizer, activations
  int64_t parameters = 0;              // of the stage's units
  double flops_per_micro_batch = 0;    // forward + backward of its units, all its tensor ranks together
};

struct PipelinePlan {
  std::vector<StagePlan> stages;
  // (m + p − 1) · slowest stage: the synchronous pipeline's step with its bubble.
  double predicted_step_seconds = 0;
  double bubble_fraction = 0;  // (p − 1) / (m + p − 1)
};

// Plans spec.parallel.pipeline_stages stages on `workers`, which must be at
// least that many; stages go to the first p workers in the order given.
// With data parallelism each stage's micro-batches are 1/d of the global
// batch's (the caller passes, per stage, what its d workers can all do).
// INVALID_ARGUMENT for too few workers or units; RESOURCE_EXHAUSTED when no
// cut fits in memory, saying which worker falls short and by how much.
// `prefer` (each stage's first unit, p of them) is kept instead of the best
// cut when it fits and its slowest stage is within kKeepCutSlack of the
// best's: a restart keeps the cut its surviving workers hold state for
// unless another is clearly faster (measured rates differ by noise alone).
// `keep_slack` other than that: infinity keeps `prefer` whenever it fits
// (the prediction of a layout as it runs).
inline constexpr double kKeepCutSlack = 1.10;
absl::StatusOr<PipelinePlan> PlanPipeline(const shardline::v1::JobSpec& spec,
                                          const std::vector<WorkerCapacity>& workers,
                                          const std::vector<int>& prefer = {}, double keep_slack = kKeepCutSlack);

// A readable multi-line description of the plan.
std::string DescribePlan(const PipelinePlan& plan);

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_PLANNER_H_
