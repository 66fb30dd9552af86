#include "server/pace_window.h"

#include "common/median.h"

namespace shardline::server {

void PaceWindow::Add(double value) {
  if (baseline_ == 0) {
    first_.push_back(value);
    if (static_cast<int>(first_.size()) == kCount) baseline_ = common::Median(first_);
    if (after_baseline_) return;
  }
  window_.push_back(value);
  if (static_cast<int>(window_.size()) > kCount) window_.pop_front();
}

double PaceWindow::recent() const {
  if (static_cast<int>(window_.size()) < kCount) return 0;
  return common::Median({window_.begin(), window_.end()});
}

}  // namespace shardline::server
