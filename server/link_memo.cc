#include "server/link_memo.h"

#include <algorithm>
#include <utility>

namespace shardline::server {

namespace {

// Names are short: a loop the compiler keeps inline beats a call to memcmp.
bool Same(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

}  // namespace

uint32_t LinkMemo::Number(const WorkerRecord& w) {
  if (w.order >= 0 && static_cast<uint64_t>(w.order) < by_order_.size()) {
    const uint32_t numbered = by_order_[static_cast<size_t>(w.order)];
    if (numbered != kNone && Same(names_[numbered], w.name)) return numbered;
  }
  auto named = by_name_.find(w.name);
  if (named != by_name_.end()) return named->second;
  const auto number = static_cast<uint32_t>(names_.size());
  names_.push_back(w.name);
  by_name_.emplace(w.name, number);
  if (w.order >= 0 && w.order < kOrdersMost) {
    if (static_cast<uint64_t>(w.order) >= by_order_.size()) by_order_.resize(static_cast<size_t>(w.order) + 1, kNone);
    if (by_order_[static_cast<size_t>(w.order)] == kNone) by_order_[static_cast<size_t>(w.order)] = number;
  }
  return number;
}

void LinkMemo::Grow(uint32_t side) {
  const uint32_t grown = std::min(kDense, std::max(side, 2 * side_));
  std::vector<LinkEstimate> dense(static_cast<size_t>(grown) * grown);
  std::vector<bool> known(dense.size(), false);
  for (uint32_t a = 0; a < side_; ++a) {
    for (uint32_t b = 0; b < side_; ++b) {
      dense[static_cast<size_t>(a) * grown + b] = dense_[static_cast<size_t>(a) * side_ + b];
      known[static_cast<size_t>(a) * grown + b] = known_[static_cast<size_t>(a) * side_ + b];
    }
  }
  dense_ = std::move(dense);
  known_ = std::move(known);
  side_ = grown;
}

const LinkEstimate& LinkMemo::Get(const WorkerRecord& from, const WorkerRecord& to) {
  const uint32_t a = Number(from), b = Number(to);
  if (a < kDense && b < kDense) {
    if (std::max(a, b) >= side_) Grow(std::max(a, b) + 1);
    const size_t at = static_cast<size_t>(a) * side_ + b;
    if (!known_[at]) {
      dense_[at] = estimate_(from, to);
      known_[at] = true;
    }
    return dense_[at];
  }
  const uint64_t key = uint64_t{a} << 32 | b;
  auto it = sparse_.find(key);
  if (it == sparse_.end()) it = sparse_.emplace(key, estimate_(from, to)).first;
  return it->second;
}

}  // namespace shardline::server
