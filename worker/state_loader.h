// LoadState gives a position that starts after step 1 (a restart after a
// lost worker, a drain or a coordinator restart), or at step 1 of a job
// that starts from given weights (Assignment.initial_weights: the
// coordinator's version of step 0, weights only), the state of the step
// before its first: the weights and optimizer state of its units, from the
// first source that has them, nearest first: this worker's StateCache (it
// held this position and took that step's snapshot), a data-parallel twin's
// memory (Assignment.state_peers), the coordinator's committed version.
// Returns where they came from ("its own memory", "its twin at ADDRESS",
// "the coordinator"); the coordinator's error when no source had them.
#ifndef SHARDLINE_WORKER_STATE_LOADER_H_
#define SHARDLINE_WORKER_STATE_LOADER_H_

#include <string>

#include "absl/status/statusor.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/runtime/pipeline_stage.h"
#include "worker/runtime/shard_runtime.h"
#include "worker/stage_reporter.h"
#include "worker/state_cache.h"

namespace shardline::worker {

absl::StatusOr<std::string> LoadState(const shardline::v1::Assignment& assignment, const std::string& worker_id,
                                      runtime::ShardRuntime& runtime, runtime::PipelineStage& stage,
                                      StageReporter& reporter, StateCache& cache);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_STATE_LOADER_H_
