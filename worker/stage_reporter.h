// StageReporter is where a running stage sends its progress and shards (and
// where a restarted one gets its committed state): the
// coordinator (GrpcCoordinatorClient) in a worker daemon, a fake in tests.
#ifndef SHARDLINE_WORKER_STAGE_REPORTER_H_
#define SHARDLINE_WORKER_STAGE_REPORTER_H_

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "shardline/v1/coordinator.pb.h"
#include "worker/shard_snapshot.h"

namespace shardline::worker {

class StageReporter {
 public:
  virtual ~StageReporter() = default;
  // True when the coordinator says the job no longer runs: stop.
  virtual absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) = 0;
  // Uploads a shard (its header's digest computed); gives up, CANCELLED,
  // soon after `cancelled` turns true.
  virtual absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) = 0;
  // The committed state a restarted position loads (Coordinator.FetchState):
  // a safetensors file's contents, metadata "step" its committed step.
  virtual absl::StatusOr<common::SafetensorsContents> FetchState(const shardline::v1::FetchStateRequest& request) = 0;
  // The same from a data-parallel twin's memory (its WorkerState service
  // at `address`): NOT_FOUND when it does not hold that step.
  virtual absl::StatusOr<common::SafetensorsContents> FetchStateFromTwin(
      const std::string& address, const shardline::v1::FetchStateRequest& request) = 0;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_STAGE_REPORTER_H_
