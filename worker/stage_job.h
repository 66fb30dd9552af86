// RunStageJob runs one assignment on a worker: builds the ShardRuntime for
// the assigned units, drives a PipelineStage over the link step after step,
// reports every step and, every checkpoint.every_steps and at the end, the
// shard (weights and optimizer state). A failed step is reported with its
// error before it is returned. With data parallelism `replicas` is the
// stage's data-parallel group (assignment.replica is its rank); replica 0
// sends the shards, every replica reports their digests; with tensor
// parallelism `tensor_group` is the stage's tensor-parallel group
// (assignment.tensor_rank its rank) and only rank 0 of replica 0 sends
// the (global) shard. `cancelled` is
// polled between steps; to interrupt a step, close the link (and the
// group). `stop_after_step` (0: none), also polled, ends the job early
// after that step, checkpointed (the coordinator re-plans from it). Checkpoint snapshots go to `cache`, and a position starting
// after step 1 loads its state from the nearest source (LoadState).
// `activity`, if set, is told what the stage is doing (the hang
// explainer). Synchronous; one call per assignment.
#ifndef SHARDLINE_WORKER_STAGE_JOB_H_
#define SHARDLINE_WORKER_STAGE_JOB_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"
#include "worker/data/data_file.h"
#include "worker/runtime/stage_activity.h"
#include "worker/stage_reporter.h"
#include "worker/state_cache.h"
#include "worker/transport/stage_link.h"

namespace shardline::worker {

absl::Status RunStageJob(const shardline::v1::Assignment& assignment, const std::string& worker_id,
                         Backend& backend, transport::StageLink& link, collective::Collective* replicas,
                         collective::Collective* tensor_group,
                         StageReporter& reporter, StateCache& cache, const std::atomic<bool>& cancelled,
                         const std::atomic<int64_t>& stop_after_step,
                         const data::DataAccess& data_access, runtime::StageActivity* activity = nullptr);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_STAGE_JOB_H_
