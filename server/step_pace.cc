#include "server/step_pace.h"

#include <algorithm>

namespace shardline::server {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

void StepPace::Reset() { *this = StepPace(); }

void StepPace::Note(double seconds) {
  if (noted_++ == 0 || seconds <= 0) return;  // the epoch's first step warms up
  if (baseline_ == 0) {
    first_.push_back(seconds);
    if (static_cast<int>(first_.size()) == kBaselineSteps) baseline_ = Median(first_);
    return;
  }
  window_.push_back(seconds);
  if (static_cast<int>(window_.size()) > kWindowSteps) window_.pop_front();
}

double StepPace::recent() const {
  if (static_cast<int>(window_.size()) < kWindowSteps) return 0;
  return Median({window_.begin(), window_.end()});
}

}  // namespace shardline::server
