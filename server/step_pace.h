// StepPace keeps the wall times of a plan epoch's steps, to tell a lasting
// slowdown (a worker whose machine got busy, a link that got slower) from
// noise: the epoch's pace is the median of its first PaceWindow::kCount
// steps after its first (which allocates and warms up), and it has slowed
// while the median of its last kCount steps stays above kSlowdown times
// that. Not thread-safe (a RunningJob's, under the JobManager's lock).
#ifndef SHARDLINE_SERVER_STEP_PACE_H_
#define SHARDLINE_SERVER_STEP_PACE_H_

#include "server/pace_window.h"

namespace shardline::server {

class StepPace {
 public:
  static constexpr double kSlowdown = 1.3;

  // A new epoch.
  void Reset();
  // The next completed step of the epoch took `seconds`.
  void Note(double seconds);

  // 0 until known.
  double baseline() const { return seconds_.baseline(); }
  double recent() const { return seconds_.recent(); }
  bool slowed() const { return baseline() > 0 && recent() > kSlowdown * baseline(); }

 private:
  int noted_ = 0;
  PaceWindow seconds_{/*after_baseline=*/true};
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_STEP_PACE_H_
