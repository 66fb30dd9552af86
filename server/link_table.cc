#include "server/link_table.h"

#include <algorithm>

namespace shardline::server {

void LinkTable::Joined(const std::string& name, const std::string& host, const std::vector<std::string>& peers) {
  absl::MutexLock lock(&mu_);
  if (hosts_[name] != host) groups_stale_ = true;  // a link on one host is memory, not a wire
  hosts_[name] = host;
  // A worker registering again runs none of the probes it claimed before.
  for (auto it = claims_.begin(); it != claims_.end();) {
    if (it->first.first != name) {
      ++it;
      continue;
    }
    it = claims_.erase(it);
    ++version_;
  }
  for (const std::string& peer : peers) {
    if (peer == name) continue;
    QueueLocked({name, peer});
    QueueLocked({peer, name});
  }
}

int LinkTable::Request(const std::vector<std::string>& names) {
  absl::MutexLock lock(&mu_);
  int added = 0;
  for (const std::string& a : names) {
    for (const std::string& b : names) {
      if (a != b && QueueLocked({a, b})) ++added;
    }
  }
  return added;
}

void LinkTable::Record(const std::string& from, std::vector<LinkRecord> links) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  GroupsLocked();  // fresh: each figure below either keeps them or marks them stale
  ++version_;
  std::vector<Direction> measured, slowed;
  for (LinkRecord& link : links) {
    const Direction d{from, link.to};
    measured.push_back(d);
    link.from = from;
    link.measured_at = now;
    queued_.erase(d);
    leaving_.erase(d);
    alone_.erase(d);
    measured_beside_.erase(d);
    if (auto claim = claims_.find(d); claim != claims_.end()) {
      if (!claim->second.beside.empty() && link.error.empty()) measured_beside_[d] = claim->second.beside;
      claims_.erase(claim);
    }
    auto it = links_.find(d);
    if (!link.error.empty() && it != links_.end()) {
      it->second.error = link.error;  // keep the last good figures, say it failed
      continue;
    }
    const double before = it == links_.end() ? 0 : it->second.bytes_per_second;
    if (!groups_stale_) KeepGroupsLocked(d, before, link.bytes_per_second);
    // Evidence against its ends, unless one is suspected already: that
    // explains it (and its own probes, which end the suspicion, would
    // otherwise start it again).
    if (link.bytes_per_second > 0 && link.bytes_per_second * kProbedSlowdown < before &&
        !suspects_.count(d.first) && !suspects_.count(d.second)) {
      link.slowed_from = before;
      slowed.push_back(d);
    }
    links_[d] = std::move(link);
  }
  for (const Direction& d : slowed) {
    MaybeSuspectLocked(d.first, "");
    MaybeSuspectLocked(d.second, "");
  }
  ClearExplainedLocked();
  // Where the groups may have moved, any measurement taken beside another
  // may now cross between groups; else only these.
  RecheckSharedLocked(groups_stale_ ? nullptr : &measured);
  // A suspected worker whose every link was probed again is as probed.
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const std::string& name = it->first;
    const bool queued = std::any_of(queued_.begin(), queued_.end(),
                                    [&](const Direction& d) { return d.first == name || d.second == name; });
    it = queued ? std::next(it) : suspects_.erase(it);
  }
}

bool LinkTable::MaybeSuspectLocked(const std::string& name, const std::string& job_id) {
  std::set<std::string> peers;
  double fastest = 0;
  std::string blamed_in = job_id;  // a probe's evidence: the job that observed the other
  for (const auto& [d, link] : links_) {
    if (d.first != name && d.second != name) continue;
    const bool observed = link.observed_bytes_per_second > 0;
    if (!observed && link.slowed_from <= 0) continue;
    peers.insert(d.first == name ? d.second : d.first);
    fastest = std::max(fastest, observed ? link.observed_bytes_per_second : link.bytes_per_second);
    if (blamed_in.empty() && observed) blamed_in = link.observed_in;
  }
  if (peers.size() < 2) return false;
  auto [it, fresh] = suspects_.try_emplace(name);
  it->second.bytes_per_second = fastest;
  it->second.since = clock_();
  it->second.job_id = blamed_in;
  for (const auto& [peer, host] : hosts_) {
    if (peer == name) continue;
    QueueLocked({name, peer});
    QueueLocked({peer, name});
  }
  return fresh;
}

void LinkTable::ClearExplainedLocked() {
  for (auto& [d, link] : links_) {
    if (suspects_.count(d.first) || suspects_.count(d.second)) link.slowed_from = 0;
  }
}

std::map<std::string, LinkSuspicion> LinkTable::Suspects() const {
  absl::MutexLock lock(&mu_);
  return suspects_;
}

std::optional<LinkSuspicion> LinkTable::Suspected(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = suspects_.find(name);
  if (it == suspects_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> LinkTable::Observe(const std::string& from, const std::string& to, double bytes_per_second,
                                            const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  LinkRecord& link = links_[{from, to}];
  if (link.from.empty()) {  // never probed
    link.from = from;
    link.to = to;
    link.measured_at = absl::InfinitePast();
  }
  const bool fresh = link.observed_bytes_per_second <= 0;
  link.observed_bytes_per_second = bytes_per_second;
  link.observed_at = clock_();
  link.observed_in = job_id;
  QueueLocked({from, to});
  std::vector<std::string> suspected;
  if (!fresh) return suspected;  // nothing new of its ends (this is called at every step while slow)
  for (const std::string& end : {from, to}) {
    if (MaybeSuspectLocked(end, job_id)) suspected.push_back(end);
  }
  ClearExplainedLocked();
  return suspected;
}

void LinkTable::ForgetObserved(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  suspects_.erase(to);
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
  leaving_.clear();  // rebuilt with the groups
  ++version_;
  for (auto it = claims_.begin(); it != claims_.end();) it = unknown(it->first) ? claims_.erase(it) : std::next(it);
  for (auto it = measured_beside_.begin(); it != measured_beside_.end();) {
    it = unknown(it->first) ? measured_beside_.erase(it) : std::next(it);
  }
  for (auto it = alone_.begin(); it != alone_.end();) it = unknown(*it) ? alone_.erase(it) : std::next(it);
  for (auto it = hosts_.begin(); it != hosts_.end();) it = known.count(it->first) ? std::next(it) : hosts_.erase(it);
  for (auto it = suspects_.begin(); it != suspects_.end();) it = known.count(it->first) ? std::next(it) : suspects_.erase(it);
  groups_stale_ = true;
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
