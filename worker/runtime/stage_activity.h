// StageActivity is what a worker's stage is doing now, for the hang
// explainer: the job and position it runs, the step, a phrase ("waits for
// GRADIENT of micro-batch 5 from stage 3", "backward of micro-batch 2")
// and since when. The stage's thread sets it at each change (a lock and a
// short string, a few times per micro-batch); the heartbeat reads it.
// Thread-safe.
#ifndef SHARDLINE_WORKER_RUNTIME_STAGE_ACTIVITY_H_
#define SHARDLINE_WORKER_RUNTIME_STAGE_ACTIVITY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/coordinator.pb.h"

namespace shardline::worker::runtime {

class StageActivity {
 public:
  // A job's stage starts on this worker / has ended.
  void Begin(const std::string& job_id, uint64_t plan_epoch, int stage, int replica);
  void End();
  // From now on the stage is doing `doing` at `step`.
  void Set(int64_t step, std::string doing);
  // What it does now, or nothing while no job runs.
  std::optional<shardline::v1::StageActivity> Now();

 private:
  absl::Mutex mu_;
  std::optional<shardline::v1::StageActivity> current_ ABSL_GUARDED_BY(mu_);
  absl::Time since_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_STAGE_ACTIVITY_H_
