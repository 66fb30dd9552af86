#include "server/link_groups.h"

#include <algorithm>
#include <map>
#include <numeric>

namespace shardline::server {

LinkGroups::LinkGroups(const std::vector<WorkerRecord>& workers,
                       const std::function<double(size_t, size_t)>& bandwidth) {
  const size_t n = workers.size();
  // The same worker may hold several positions: one node per name.
  std::map<std::string, size_t> node;
  std::vector<size_t> first;  // node → a position holding it
  std::vector<size_t> of(n);
  for (size_t i = 0; i < n; ++i) {
    auto [it, added] = node.emplace(workers[i].name, first.size());
    if (added) first.push_back(i);
    of[i] = it->second;
  }
  const size_t m = first.size();
  std::vector<double> rate(m * m, 0);  // each link asked once (a search asks at every evaluation)
  std::vector<double> fastest(m, 0);
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = 0; b < m; ++b) {
      if (a == b) continue;
      rate[a * m + b] = bandwidth(first[a], first[b]);
      fastest[a] = std::max(fastest[a], rate[a * m + b]);
    }
  }
  std::vector<size_t> parent(m);
  std::iota(parent.begin(), parent.end(), 0);
  auto root = [&](size_t x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  };
  for (size_t a = 0; a < m; ++a) {
    for (size_t b = a + 1; b < m; ++b) {
      const double link = std::min(rate[a * m + b], rate[b * m + a]);
      if (link > 0 && link >= kNearShare * std::max(fastest[a], fastest[b])) parent[root(a)] = root(b);
    }
  }
  group_.resize(n);
  for (size_t i = 0; i < n; ++i) group_[i] = static_cast<int>(root(of[i]));
}

}  // namespace shardline::server
