#include "worker/runtime/stage_activity.h"

#include "absl/time/clock.h"

namespace shardline::worker::runtime {

void StageActivity::Begin(const std::string& job_id, uint64_t plan_epoch, int stage, int replica) {
  absl::MutexLock lock(&mu_);
  current_.emplace();
  current_->set_job_id(job_id);
  current_->set_plan_epoch(plan_epoch);
  current_->set_stage(stage);
  current_->set_replica(replica);
  current_->set_doing("starting");
  since_ = absl::Now();
}

void StageActivity::End() {
  absl::MutexLock lock(&mu_);
  current_.reset();
}

void StageActivity::Set(int64_t step, std::string doing) {
  absl::MutexLock lock(&mu_);
  if (!current_.has_value()) return;
  current_->set_step(step);
  current_->set_doing(std::move(doing));
  since_ = absl::Now();
}

std::optional<shardline::v1::StageActivity> StageActivity::Now() {
  absl::MutexLock lock(&mu_);
  if (!current_.has_value()) return std::nullopt;
  shardline::v1::StageActivity now = *current_;
  now.set_seconds(absl::ToDoubleSeconds(absl::Now() - since_));
  return now;
}

}  // namespace shardline::worker::runtime
