#include "server/step_pace.h"

#include "common/median.h"

namespace shardline::server {

void StepPace::Reset() { *this = StepPace(); }

void StepPace::Note(double seconds) {
  if (noted_++ == 0 || seconds <= 0) return;  // the epoch's first step warms up
  if (baseline_ == 0) {
    first_.push_back(seconds);
    if (static_cast<int>(first_.size()) == kBaselineSteps) baseline_ = common::Median(first_);
    return;
  }
  window_.push_back(seconds);
  if (static_cast<int>(window_.size()) > kWindowSteps) window_.pop_front();
}

double StepPace::recent() const {
  if (static_cast<int>(window_.size()) < kWindowSteps) return 0;
  return common::Median({window_.begin(), window_.end()});
}

}  // namespace shardline::server
