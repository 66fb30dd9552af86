#include "worker/backend/work_timer.h"

namespace shardline::worker {

absl::Status WallTimer::Stop() {
  if (stopped_) return absl::FailedPreconditionError("the timer was already stopped");
  stopped_ = true;
  seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return absl::OkStatus();
}

absl::StatusOr<double> WallTimer::Seconds() {
  if (!stopped_) return absl::FailedPreconditionError("the timer is still running");
  return seconds_;
}

}  // namespace shardline::worker
