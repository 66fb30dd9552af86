#include "server/link_table.h"

#include <algorithm>

#include "absl/strings/str_format.h"

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
  std::vector<Direction> measured, slowed, checked;
  for (LinkRecord& link : links) {
    const Direction d{from, link.to};
    measured.push_back(d);
    link.from = from;
    link.measured_at = now;
    queued_.erase(d);
    leaving_.erase(d);
    alone_.erase(d);
    measured_beside_.erase(d);
    bool by_check = false;
    if (auto claim = claims_.find(d); claim != claims_.end()) {
      if (!claim->second.beside.empty() && link.error.empty()) measured_beside_[d] = claim->second.beside;
      by_check = claim->second.check;
      claims_.erase(claim);
    }
    link.checked = by_check && link.error.empty() && link.bytes_per_second > 0;
    auto it = links_.find(d);
    if (!link.error.empty() && it != links_.end()) {
      it->second.error = link.error;  // keep the last good figures, say it failed
      if (it->second.fast_before > 0) DeferCheckLocked(it->second);  // not again at once
      if (by_check && it->second.checked) checked.push_back(d);  // its figure still waits for a probe
      continue;
    }
    const double before = it == links_.end() ? 0 : it->second.bytes_per_second;
    if (!groups_stale_) KeepGroupsLocked(d, before, link.bytes_per_second);
    NoteDoubtLocked(d, it == links_.end() ? nullptr : &it->second, link);
    // Evidence against its ends, unless one is suspected already: that
    // explains it (and its own probes, which end the suspicion, would
    // otherwise start it again).
    if (link.bytes_per_second > 0 && link.bytes_per_second * kProbedSlowdown < before &&
        !suspects_.count(d.first) && !suspects_.count(d.second)) {
      link.slowed_from = before;
      slowed.push_back(d);
    }
    if (link.checked) checked.push_back(d);
    links_[d] = std::move(link);
  }
  // A check's figure is a lower bound: probed again once both ends are idle.
  for (const Direction& d : checked) QueueLocked(d);
  for (const Direction& d : slowed) {
    MaybeSuspectLocked(d.first, "");
    MaybeSuspectLocked(d.second, "");
  }
  ClearExplainedLocked();
  // Where the groups may have moved, any measurement taken beside another
  // may now cross between groups; else only these.
  RecheckSharedLocked(groups_stale_ ? nullptr : &measured);
  // A suspected worker whose every link was probed again is as probed (a
  // link only checked waits for its probe).
  for (auto it = suspects_.begin(); it != suspects_.end();) {
    const std::string& name = it->first;
    const bool queued = std::any_of(queued_.begin(), queued_.end(),
                                    [&](const Direction& d) { return d.first == name || d.second == name; });
    it = queued ? std::next(it) : suspects_.erase(it);
  }
}

void LinkTable::NoteDoubtLocked(const Direction& d, const LinkRecord* old, LinkRecord& link) {
  // Within one host a link is memory: its figure moves with the host's
  // load, not with a wire.
  if (link.bytes_per_second <= 0 || HostLocked(d.first) == HostLocked(d.second)) return;
  const absl::Time now = clock_();
  const double before = old == nullptr ? 0 : old->bytes_per_second;
  const double fast = old == nullptr ? 0 : old->fast_before;
  if (fast <= 0) {
    if (link.bytes_per_second * kProbedSlowdown >= before) return;
    link.fast_before = before;  // newly slowed
    link.next_check = now + kCheckEvery;
    return;
  }
  if (link.bytes_per_second * kProbedSlowdown < fast) {  // still slow: checked later and later
    link.fast_before = fast;
    link.checks = old->checks;
    DeferCheckLocked(link);
    return;
  }
  ++recoveries_;
  if (recovered_.size() == kRecoveriesKept) recovered_.pop_front();
  const double slow = old->observed_bytes_per_second > 0 ? old->observed_bytes_per_second : before;
  recovered_.push_back(LinkRecovery{
      recoveries_, d.first, d.second,
      absl::StrFormat("%s -> %s carries %.0f Mbit/s again (%.0f Mbit/s while slow, %.0f before)", d.first, d.second,
                      link.bytes_per_second * 8 / 1e6, slow * 8 / 1e6, fast * 8 / 1e6)});
  // Its ends' own links are not slow now; their other links in doubt are
  // checked at once (what slowed them likely ended too).
  for (const std::string* end : {&d.first, &d.second}) {
    suspects_.erase(*end);
    for (auto& [other, l] : links_) {
      if (other != d && (other.first == *end || other.second == *end) && l.fast_before > 0) l.next_check = now;
    }
  }
}

void LinkTable::DeferCheckLocked(LinkRecord& link) {
  ++link.checks;
  link.next_check = clock_() + std::min(kCheckEveryMost, kCheckEvery * (int64_t{1} << std::min(link.checks, 10)));
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
                                            const std::string& job_id, double before) {
  absl::MutexLock lock(&mu_);
  LinkRecord& link = links_[{from, to}];
  if (link.from.empty()) {  // never probed
    link.from = from;
    link.to = to;
    link.measured_at = absl::InfinitePast();
  }
  const bool fresh = link.observed_bytes_per_second <= 0;
  if (link.fast_before <= 0 && HostLocked(from) != HostLocked(to)) {  // a wire (NoteDoubtLocked)
    link.fast_before = std::max(before, link.bytes_per_second);
    link.checks = 0;
    link.next_check = clock_() + kCheckEvery;  // its job's streams tell while it runs on it
  }
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
  it->second.fast_before = 0;  // its own job's frames showed it back
  it->second.checks = 0;
}

uint64_t LinkTable::recoveries() const {
  absl::MutexLock lock(&mu_);
  return recoveries_;
}

std::vector<LinkRecovery> LinkTable::RecoveredSince(uint64_t after, uint64_t* forgotten) const {
  absl::MutexLock lock(&mu_);
  std::vector<LinkRecovery> out;
  for (const LinkRecovery& r : recovered_) {
    if (r.number > after) out.push_back(r);
  }
  if (forgotten != nullptr) *forgotten = after >= recoveries_ ? 0 : recoveries_ - after - out.size();
  return out;
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
