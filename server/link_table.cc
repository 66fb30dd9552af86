#include "server/link_table.h"

namespace shardline::server {

void LinkTable::Joined(const std::string& name, const std::vector<std::string>& peers) {
  absl::MutexLock lock(&mu_);
  for (const std::string& peer : peers) {
    if (peer == name) continue;
    queued_.insert({name, peer});
    queued_.insert({peer, name});
  }
}

int LinkTable::Request(const std::vector<std::string>& names) {
  absl::MutexLock lock(&mu_);
  int added = 0;
  for (const std::string& a : names) {
    for (const std::string& b : names) {
      if (a != b && queued_.insert({a, b}).second) ++added;
    }
  }
  return added;
}

std::vector<std::string> LinkTable::Claim(const std::string& name) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  if (!claimed_by_.empty() && claimed_by_ != name && now - claimed_at_ < kClaimTimeout) return {};
  std::vector<std::string> targets;
  for (auto it = queued_.lower_bound({name, ""}); it != queued_.end() && it->first == name; ++it) {
    targets.push_back(it->second);
  }
  if (targets.empty()) {
    if (claimed_by_ == name) claimed_by_.clear();
    return {};
  }
  // A worker that still holds its claim is probing what it was given.
  if (claimed_by_ == name && now - claimed_at_ < kClaimTimeout) return {};
  claimed_by_ = name;
  claimed_at_ = now;
  return targets;
}

void LinkTable::Record(const std::string& from, std::vector<LinkRecord> links) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (LinkRecord& link : links) {
    link.from = from;
    link.measured_at = now;
    queued_.erase({from, link.to});
    auto it = links_.find({from, link.to});
    if (!link.error.empty() && it != links_.end()) {
      it->second.error = link.error;  // keep the last good figures, say it failed
      continue;
    }
    links_[{from, link.to}] = std::move(link);
  }
  if (claimed_by_ == from) claimed_by_.clear();
}

void LinkTable::Observe(const std::string& from, const std::string& to, double bytes_per_second,
                        const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  LinkRecord& link = links_[{from, to}];
  if (link.from.empty()) {  // never probed
    link.from = from;
    link.to = to;
    link.measured_at = absl::InfinitePast();
  }
  link.observed_bytes_per_second = bytes_per_second;
  link.observed_at = clock_();
  link.observed_in = job_id;
  queued_.insert({from, to});
}

void LinkTable::ForgetObserved(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find({from, to});
  if (it == links_.end()) return;
  if (it->second.bytes_per_second <= 0 && it->second.error.empty()) {
    links_.erase(it);  // nothing but the observation
    return;
  }
  it->second.observed_bytes_per_second = 0;
  it->second.observed_in.clear();
}

void LinkTable::Retain(const std::set<std::string>& known) {
  absl::MutexLock lock(&mu_);
  auto unknown = [&](const Direction& d) { return !known.count(d.first) || !known.count(d.second); };
  for (auto it = links_.begin(); it != links_.end();) it = unknown(it->first) ? links_.erase(it) : std::next(it);
  for (auto it = queued_.begin(); it != queued_.end();) it = unknown(*it) ? queued_.erase(it) : std::next(it);
  if (!claimed_by_.empty() && !known.count(claimed_by_)) claimed_by_.clear();
}

std::vector<LinkRecord> LinkTable::Links() const {
  absl::MutexLock lock(&mu_);
  std::vector<LinkRecord> out;
  out.reserve(links_.size());
  for (const auto& [direction, link] : links_) out.push_back(link);
  return out;
}

std::optional<LinkRecord> LinkTable::Get(const std::string& from, const std::string& to) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find({from, to});
  if (it == links_.end()) return std::nullopt;
  return it->second;
}

int LinkTable::pending() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(queued_.size());
}

}  // namespace shardline::server
