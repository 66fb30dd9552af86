// LinkGroups tells which workers of a grid sit behind one shared wire, from
// pairwise measurements alone: workers joined by links at least
// kNearShare of either end's fastest link form a group (a rack, a host,
// a site), and transfers between two groups are taken to cross one wire
// whose capacity the pairwise probes measured (each probe had it alone).
// So two hops, or two all-reduces, across one uplink each get half of it
// (server/grid_cost). Workers whose links are all alike (a switch fabric,
// or nothing measured across hosts) form one group: nothing is shared. A
// link of no bandwidth (unmeasured, to LinkTable's probe claims) joins
// nothing.
// Pure computation.
#ifndef SHARDLINE_SERVER_LINK_GROUPS_H_
#define SHARDLINE_SERVER_LINK_GROUPS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "server/worker_registry.h"

namespace shardline::server {

inline constexpr double kNearShare = 0.25;

class LinkGroups {
 public:
  // `bandwidth(a, b)`: bytes/s from workers[a] to workers[b] (a != b).
  LinkGroups(const std::vector<WorkerRecord>& workers, const std::function<double(size_t, size_t)>& bandwidth);

  // The group of workers[i]: equal for workers of one group.
  int group(size_t i) const { return group_[i]; }
  bool same(size_t a, size_t b) const { return group_[a] == group_[b]; }
  // Positions a and b traded workers (the grid holds the same ones: the
  // same groups).
  void Swap(size_t a, size_t b) { std::swap(group_[a], group_[b]); }

 private:
  std::vector<int> group_;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LINK_GROUPS_H_
