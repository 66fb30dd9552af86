// PaceWindow is what StepPace and LinkPace share: a baseline, the median of
// the first kCount values of a plan epoch, and the median of the last kCount
// values, to tell a lasting change from noise. Not thread-safe.
#ifndef SHARDLINE_SERVER_PACE_WINDOW_H_
#define SHARDLINE_SERVER_PACE_WINDOW_H_

#include <deque>
#include <vector>

namespace shardline::server {

class PaceWindow {
 public:
  static constexpr int kCount = 5;

  // `after_baseline`: the recent window starts once the baseline is known
  // (StepPace); otherwise the baseline's values count in it too (LinkPace).
  explicit PaceWindow(bool after_baseline) : after_baseline_(after_baseline) {}

  void Add(double value);

  // 0 until known.
  double baseline() const { return baseline_; }
  double recent() const;

 private:
  bool after_baseline_;
  std::vector<double> first_;  // the baseline's values
  double baseline_ = 0;
  std::deque<double> window_;  // the last kCount values
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_PACE_WINDOW_H_
