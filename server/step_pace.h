// StepPace keeps the wall times of a plan epoch's steps, to tell a lasting
// slowdown (a worker whose machine got busy, a link that got slower) from
// noise: the epoch's pace is the median of its first kBaselineSteps steps
// after its first (which allocates and warms up), and it has slowed while
// the median of its last kWindowSteps steps stays above kSlowdown times
// that. Not thread-safe (a RunningJob's, under the JobManager's lock).
#ifndef SHARDLINE_SERVER_STEP_PACE_H_
#define SHARDLINE_SERVER_STEP_PACE_H_

#include <deque>
#include <vector>

namespace shardline::server {

class StepPace {
 public:
  static constexpr int kBaselineSteps = 5;
  static constexpr int kWindowSteps = 5;
  static constexpr double kSlowdown = 1.3;

  // A new epoch.
  void Reset();
  // The next completed step of the epoch took `seconds`.
  void Note(double seconds);

  // 0 until known.
  double baseline() const { return baseline_; }
  double recent() const;
  bool slowed() const { return baseline_ > 0 && recent() > kSlowdown * baseline_; }

 private:
  int noted_ = 0;
  std::vector<double> first_;   // the baseline's steps
  double baseline_ = 0;
  std::deque<double> window_;  // the last kWindowSteps steps
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_STEP_PACE_H_
