// WorkTimer measures how long a backend's device spent on the work queued
// between its start (Backend::StartTimer) and Stop(): on a GPU the time
// between two events on the compute stream, on the CPU (where work runs as
// it is queued) the wall time between the two calls. Seconds() waits until
// the timed work has run. Gaps in which the device waited for the host to
// queue more work count as part of the interval.
#ifndef SHARDLINE_WORKER_BACKEND_WORK_TIMER_H_
#define SHARDLINE_WORKER_BACKEND_WORK_TIMER_H_

#include <chrono>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::worker {

class WorkTimer {
 public:
  virtual ~WorkTimer() = default;
  // Marks the end of the timed work; once only.
  virtual absl::Status Stop() = 0;
  // The device time between the marks; FAILED_PRECONDITION before Stop().
  virtual absl::StatusOr<double> Seconds() = 0;
};

// The wall time between its construction and Stop(): the device time where
// work runs as it is queued (the CPU backend, and Backend's default).
class WallTimer final : public WorkTimer {
 public:
  absl::Status Stop() override;
  absl::StatusOr<double> Seconds() override;

 private:
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  bool stopped_ = false;
  double seconds_ = 0.0;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_WORK_TIMER_H_
