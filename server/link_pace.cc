#include "server/link_pace.h"

#include <cmath>

#include "common/median.h"

namespace shardline::server {

void LinkPace::Note(int64_t bytes, double seconds) {
  if (bytes <= 0 || !(seconds >= kMinSeconds) || !std::isfinite(seconds)) return;
  const double rate = static_cast<double>(bytes) / seconds;
  if (baseline_ == 0) {
    first_.push_back(rate);
    if (static_cast<int>(first_.size()) == kBaselineSteps) baseline_ = common::Median(first_);
  }
  window_.push_back(rate);
  if (static_cast<int>(window_.size()) > kWindowSteps) window_.pop_front();
}

double LinkPace::recent() const {
  if (static_cast<int>(window_.size()) < kWindowSteps) return 0;
  return common::Median({window_.begin(), window_.end()});
}

}  // namespace shardline::server
