// LinkMemo: one planning's view of the links (LinksFrom, grid_cost.h):
// each link's estimate from its first lookup on. A placement search looks
// up every pair of its grid at each of its thousands of evaluations, so a
// lookup must cost next to nothing: workers are numbered here by their
// registration order (their names checked: test records share order 0,
// and those go by name), and the estimates between the first kDense
// numbered sit in a square matrix, the rest in a map by pair. Not
// thread-safe: made for one planning, used from one thread.
#ifndef SHARDLINE_SERVER_LINK_MEMO_H_
#define SHARDLINE_SERVER_LINK_MEMO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/grid_cost.h"
#include "server/worker_registry.h"

namespace shardline::server {

class LinkMemo {
 public:
  using Estimate = std::function<LinkEstimate(const WorkerRecord& from, const WorkerRecord& to)>;
  static constexpr uint32_t kDense = 512;  // a matrix of at most 6 MiB

  explicit LinkMemo(Estimate estimate) : estimate_(std::move(estimate)) {}

  // `estimate(from, to)` the first time, what it said after that.
  const LinkEstimate& Get(const WorkerRecord& from, const WorkerRecord& to);
  // Workers numbered so far (for tests).
  size_t workers() const { return names_.size(); }

 private:
  uint32_t Number(const WorkerRecord& w);
  // The matrix holds at least `side` × `side` estimates.
  void Grow(uint32_t side);

  Estimate estimate_;
  std::vector<std::string> names_;                     // by number
  static constexpr uint32_t kNone = ~uint32_t{0};
  static constexpr int64_t kOrdersMost = int64_t{1} << 16;  // orders past it go by name
  std::vector<uint32_t> by_order_;                     // the first numbered of each order, or kNone
  std::unordered_map<std::string, uint32_t> by_name_;  // every one numbered
  uint32_t side_ = 0;
  std::vector<LinkEstimate> dense_;  // side_ × side_, by (from, to) numbers
  std::vector<bool> known_;
  std::unordered_map<uint64_t, LinkEstimate> sparse_;  // a number past kDense
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_LINK_MEMO_H_
