// LinkTable's probe claims: which queued direction may be probed now
// (link_table.h says the rules), and the measurements to take again alone.
#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "server/link_groups.h"
#include "server/link_table.h"

namespace shardline::server {

void LinkTable::SetConcurrentProbes(int n) {
  absl::MutexLock lock(&mu_);
  concurrent_probes_ = std::clamp(n, 1, kMaxConcurrentProbes);
}

bool LinkTable::Queue(const std::string& from, const std::string& to) {
  absl::MutexLock lock(&mu_);
  return QueueLocked({from, to});
}

std::vector<std::string> LinkTable::QueuedFrom(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> peers;
  for (auto it = queued_.lower_bound({name, ""}); it != queued_.end() && it->first == name; ++it) {
    peers.push_back(it->second);
  }
  return peers;
}

int LinkTable::probing() const {
  absl::MutexLock lock(&mu_);
  int live = 0;
  for (const auto& [direction, claim] : claims_) live += clock_() - claim.at < kClaimTimeout;
  return live;
}

bool LinkTable::HostProbing(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  const std::string& host = HostLocked(name);
  for (const auto& [d, claim] : claims_) {
    if (clock_() - claim.at < kClaimTimeout && (HostLocked(d.first) == host || HostLocked(d.second) == host)) {
      return true;
    }
  }
  return false;
}

void LinkTable::ExpireClaimsLocked(absl::Time now) {
  for (auto it = claims_.begin(); it != claims_.end();) {
    if (now - it->second.at < kClaimTimeout) {
      ++it;
      continue;
    }
    it = claims_.erase(it);
    ++version_;
  }
}

const std::string& LinkTable::HostLocked(const std::string& name) const {
  auto it = hosts_.find(name);
  return it == hosts_.end() ? name : it->second;
}

const LinkTable::Groups& LinkTable::GroupsLocked() {
  if (!groups_stale_) return groups_;
  Groups& g = groups_;
  g = Groups{};
  // The groups are of hosts (a host's own links are memory, and a host is
  // in one probe at a time anyway), joined by their workers' fastest link.
  std::vector<WorkerRecord> hosts;
  std::map<std::string, size_t> index;
  auto add = [&](const std::string& name) {
    const std::string& host = HostLocked(name);
    if (index.emplace(host, hosts.size()).second) hosts.emplace_back().name = host;
  };
  for (const auto& [name, host] : hosts_) add(name);
  for (const auto& [d, link] : links_) {
    add(d.first);
    add(d.second);
  }
  for (const auto& [d, link] : links_) {
    const std::string &from = HostLocked(d.first), &to = HostLocked(d.second);
    if (from == to || link.bytes_per_second <= 0) continue;
    double& rate = g.host_rate[{from, to}];
    rate = std::max(rate, link.bytes_per_second);
    g.fastest[from] = std::max(g.fastest[from], link.bytes_per_second);
  }
  const LinkGroups groups(hosts, [&](size_t a, size_t b) { return HostRateLocked(hosts[a].name, hosts[b].name); });
  std::map<int, int> first;  // LinkGroups' id → its first host's index, the same for the same groups
  std::map<std::string, int> of_host;
  for (size_t i = 0; i < hosts.size(); ++i) {
    of_host[hosts[i].name] = first.emplace(groups.group(i), static_cast<int>(i)).first->second;
  }
  for (const auto& [name, host] : hosts_) g.of[name] = of_host[host];
  for (const auto& [d, link] : links_) {
    for (const std::string& name : {d.first, d.second}) g.of[name] = of_host[HostLocked(name)];
  }
  for (const auto& [d, link] : links_) {
    if (link.bytes_per_second <= 0) continue;
    const int x = g.of[d.first], y = g.of[d.second];
    g.tried.insert({x, y});
    g.tried.insert({y, x});
  }
  groups_stale_ = false;
  ++version_;
  leaving_.clear();
  for (const Direction& d : queued_) {
    if (LeavesGroupLocked(d)) leaving_.insert(d);
  }
  return groups_;
}

double LinkTable::HostRateLocked(const std::string& from, const std::string& to) const {
  auto it = groups_.host_rate.find({from, to});
  return it == groups_.host_rate.end() ? 0.0 : it->second;
}

void LinkTable::KeepGroupsLocked(const Direction& d, double before, double after) {
  const std::string &from = HostLocked(d.first), &to = HostLocked(d.second);
  Groups& g = groups_;
  auto a = g.of.find(d.first), b = g.of.find(d.second);
  if (a == g.of.end() || b == g.of.end()) {
    groups_stale_ = true;  // a worker the groups have not seen
    return;
  }
  if (from == to) return;  // memory: no part of the groups
  if (after > 0) {
    g.tried.insert({a->second, b->second});
    g.tried.insert({b->second, a->second});
  }
  // The groups see the hosts' fastest link: they stay unless it moves a
  // host's fastest link, or makes two hosts of two groups near.
  const double rate = HostRateLocked(from, to);
  if (after <= rate && !(before == rate && after < before)) return;  // the hosts' rate stays
  const double fastest_from = g.fastest[from], fastest_to = g.fastest[to];
  if (after < rate || after > fastest_from) {
    groups_stale_ = true;
    return;
  }
  const double back = HostRateLocked(to, from);
  if (a->second != b->second && std::min(after, back) >= kNearShare * std::max(fastest_from, fastest_to)) {
    groups_stale_ = true;
    return;
  }
  g.host_rate[{from, to}] = after;
}

bool LinkTable::QueueLocked(const Direction& d) {
  if (!queued_.insert(d).second) return false;
  ++version_;
  if (!groups_stale_ && LeavesGroupLocked(d)) leaving_.insert(d);
  return true;
}

bool LinkTable::LeavesGroupLocked(const Direction& d) {
  if (HostLocked(d.first) == HostLocked(d.second)) return false;  // memory, not a wire
  const std::map<std::string, int>& groups = GroupsLocked().of;
  auto a = groups.find(d.first), b = groups.find(d.second);
  return a == groups.end() || b == groups.end() || a->second != b->second;
}

void LinkTable::RecheckSharedLocked(const std::vector<Direction>* links) {
  std::vector<Direction> again;
  auto check = [&](const Direction& d, const std::set<Direction>& beside) {
    if (!LeavesGroupLocked(d)) return;
    for (const Direction& other : beside) {
      if (LeavesGroupLocked(other)) {
        again.push_back(d);
        return;
      }
    }
  };
  if (links == nullptr) {
    for (const auto& [d, beside] : measured_beside_) check(d, beside);
  } else {
    for (const Direction& d : *links) {
      if (auto it = measured_beside_.find(d); it != measured_beside_.end()) check(d, it->second);
    }
  }
  for (const Direction& d : again) {
    measured_beside_.erase(d);
    QueueLocked(d);
    alone_.insert(d);
  }
}

std::optional<std::string> LinkTable::Claim(const std::string& name, const std::set<std::string>& unavailable) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  ExpireClaimsLocked(now);
  std::set<std::string> busy_hosts;
  bool leaving_runs = false, alone_runs = false;
  for (const auto& [d, claim] : claims_) {
    if (d.first == name) return std::nullopt;  // it probes one link at a time
    busy_hosts.insert(HostLocked(d.first));
    busy_hosts.insert(HostLocked(d.second));
    leaving_runs |= claim.leaves_group;
    alone_runs |= claim.alone;
  }
  if (alone_runs || static_cast<int>(claims_.size()) >= concurrent_probes_) return std::nullopt;
  auto ready = [&](const Direction& d) {
    return !unavailable.count(d.first) && !unavailable.count(d.second) && !busy_hosts.count(HostLocked(d.first)) &&
           !busy_hosts.count(HostLocked(d.second));
  };
  // A measurement to take again alone goes first: nothing else starts
  // while one waits for the others to end.
  for (const Direction& d : alone_) {
    if (unavailable.count(d.first) || unavailable.count(d.second)) continue;
    if (d.first != name || !claims_.empty()) return std::nullopt;
    ++version_;
    claims_[d] = Claimed{now, true, true, {}};
    return d.second;
  }

  // The one probe that may leave its group: the one likeliest to show two
  // groups one (the first between two hosts whose reverse was measured
  // near), else one between two groups with nothing measured between them
  // yet, else any; granted only to the worker it is from (the others take
  // links inside their groups).
  const Groups& groups = GroupsLocked();
  auto group = [&](const std::string& n) {
    auto it = groups.of.find(n);
    return it == groups.of.end() ? -1 : it->second;
  };
  auto fastest = [&](const std::string& host) {
    auto it = groups.fastest.find(host);
    return it == groups.fastest.end() ? 0.0 : it->second;
  };
  // The scan over every queued link that may leave its group is kept
  // until anything changes (most workers ask in between).
  if (!leaving_runs && (choice_.version != version_ || choice_.unavailable != unavailable)) {
    std::optional<std::tuple<int, Direction>> best;  // (rank, direction): the lowest rank
    for (const Direction& d : leaving_) {
      if (claims_.count(d) || !ready(d)) continue;
      int rank = 2;
      const std::string &from = HostLocked(d.first), &to = HostLocked(d.second);
      const double back = HostRateLocked(to, from);
      if (HostRateLocked(from, to) <= 0 && back > 0 && back >= kNearShare * std::max(fastest(from), fastest(to))) {
        rank = 0;  // it may show the two hosts near
      } else if (!groups.tried.count({group(d.first), group(d.second)})) {
        rank = 1;
      }
      if (!best.has_value() || rank < std::get<0>(*best)) best = std::make_tuple(rank, d);
      if (rank == 0) break;
    }
    choice_.version = version_;
    choice_.unavailable = unavailable;
    choice_.leaving.reset();
    if (best.has_value()) choice_.leaving = std::get<1>(*best);
  }
  const std::optional<Direction> leaving = leaving_runs ? std::nullopt : choice_.leaving;
  std::optional<Direction> inside;
  for (auto it = queued_.lower_bound({name, ""}); it != queued_.end() && it->first == name; ++it) {
    if (!claims_.count(*it) && ready(*it) && !LeavesGroupLocked(*it)) {
      inside = *it;
      break;
    }
  }
  std::set<Direction> beside;  // checks' figures are lower bounds: not weighed for sharing
  for (auto& [d, claim] : claims_) {
    if (!claim.check) beside.insert(d);
  }
  auto take = [&](const Direction& d, bool leaves) {
    ++version_;
    for (auto& [other, claim] : claims_) {
      if (!claim.check) claim.beside.insert(d);
    }
    claims_[d] = Claimed{now, leaves, false, beside};
    return d.second;
  };
  if (leaving.has_value() && leaving->first == name) return take(*leaving, true);
  if (inside.has_value()) return take(*inside, false);
  return std::nullopt;
}

bool LinkTable::CheckDue(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  for (auto it = links_.lower_bound({name, ""}); it != links_.end() && it->first.first == name; ++it) {
    if (it->second.fast_before > 0 && now >= it->second.next_check) return true;
  }
  for (auto it = queued_.lower_bound({name, ""}); it != queued_.end() && it->first == name; ++it) {
    // Never measured across hosts: checked where its other end is busy.
    if (!links_.count(*it) && HostLocked(it->first) != HostLocked(it->second)) return true;
  }
  return false;
}

std::optional<std::string> LinkTable::ClaimCheck(const std::string& name, const std::set<std::string>& busy,
                                                 const std::set<std::string>& absent) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  ExpireClaimsLocked(now);
  std::set<std::string> busy_hosts;
  bool leaving_runs = false;
  for (const auto& [d, claim] : claims_) {
    if (d.first == name || claim.alone) return std::nullopt;  // one at a time; nothing beside a lone one
    busy_hosts.insert(HostLocked(d.first));
    busy_hosts.insert(HostLocked(d.second));
    leaving_runs |= claim.leaves_group;
  }
  if (static_cast<int>(claims_.size()) >= concurrent_probes_) return std::nullopt;
  auto may = [&](const Direction& d) {
    return !absent.count(d.first) && !absent.count(d.second) && !(busy.count(d.first) && busy.count(d.second)) &&
           !busy_hosts.count(HostLocked(d.first)) && !busy_hosts.count(HostLocked(d.second)) &&
           !(leaving_runs && LeavesGroupLocked(d));
  };
  auto take = [&](const Direction& d) {
    ++version_;
    claims_[d] = Claimed{now, LeavesGroupLocked(d), false, {}, true};
    return d.second;
  };
  for (auto it = links_.lower_bound({name, ""}); it != links_.end() && it->first.first == name; ++it) {
    if (it->second.fast_before > 0 && now >= it->second.next_check && may(it->first)) return take(it->first);
  }
  // Never measured with one end busy (a worker that joined while jobs
  // run: its links to their workers; within one host, memory: assumed);
  // two idle ends' is a probe's (Claim).
  // One end busy, the other not: `name` busy, only its directions to
  // peers not busy, and where every worker is busy or absent (a full
  // cluster's heartbeats) none is scanned: one walk of the sorted names.
  const bool name_busy = busy.count(name) > 0;
  auto any_idle = [&] {
    auto b = busy.begin(), a = absent.begin();
    for (const auto& [worker, host] : hosts_) {
      while (b != busy.end() && *b < worker) ++b;
      while (a != absent.end() && *a < worker) ++a;
      if ((b == busy.end() || *b != worker) && (a == absent.end() || *a != worker)) return true;
    }
    return false;
  };
  if (name_busy && !any_idle()) return std::nullopt;
  for (auto it = queued_.lower_bound({name, ""}); it != queued_.end() && it->first == name; ++it) {
    if (busy.count(it->second) == name_busy) continue;  // both busy, or both idle (a plain probe's)
    if (!links_.count(*it) && HostLocked(it->first) != HostLocked(it->second) && may(*it)) return take(*it);
  }
  return std::nullopt;
}

}  // namespace shardline::server
