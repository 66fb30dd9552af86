#include "worker/state_cache.h"

#include "common/random_token.h"

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

void StateCache::AdmitToken(const std::string& job_id, const std::string& token) {
  constexpr size_t kRemembered = 16;
  absl::MutexLock lock(&mu_);
  tokens_.emplace_back(job_id, token);
  while (tokens_.size() > kRemembered) tokens_.pop_front();
}

bool StateCache::Admits(const std::string& job_id, const std::string& token) {
  absl::MutexLock lock(&mu_);
  bool admitted = false;
  for (const auto& [job, known] : tokens_) admitted |= job == job_id && common::TokensEqual(known, token);
  return admitted && !token.empty();
}

}  // namespace shardline::worker
