#include "worker/state_cache.h"

namespace shardline::worker {

void StateCache::Put(std::shared_ptr<ShardSnapshot> snapshot) {
  absl::MutexLock lock(&mu_);
  held_ = std::move(snapshot);
}

std::shared_ptr<const ShardSnapshot> StateCache::Get(const std::string& job_id, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (held_ == nullptr || held_->header().job_id() != job_id || held_->header().step() != step) return nullptr;
  return held_;
}

std::map<std::string, common::Tensor> StateCache::TakeMemory() {
  absl::MutexLock lock(&mu_);
  // Only this holds it, and under the lock nobody can get it now.
  if (held_ == nullptr || held_.use_count() != 1) return {};
  std::shared_ptr<ShardSnapshot> held = std::move(held_);
  return std::move(*held).TakeTensors();
}

}  // namespace shardline::worker
