#include "worker/shard_snapshot.h"

#include <algorithm>

#include "common/shard_digest.h"
#include "common/status_macros.h"

namespace shardline::worker {

absl::StatusOr<std::unique_ptr<ShardSnapshot>> ShardSnapshot::Create(shardline::v1::ShardHeader header,
                                                                     common::SafetensorsContents contents) {
  std::unique_ptr<ShardSnapshot> s(new ShardSnapshot());
  ASSIGN_OR_RETURN(s->prefix_, common::SafetensorsHeader(contents));
  s->contents_ = std::move(contents);
  int64_t offset = 0;
  s->starts_.push_back(0);
  s->pieces_.push_back(s->prefix_);
  offset += static_cast<int64_t>(s->prefix_.size());
  for (const auto& [name, tensor] : s->contents_.tensors) {
    if (tensor.byte_size() == 0) continue;
    s->starts_.push_back(offset);
    s->pieces_.emplace_back(static_cast<const char*>(tensor.raw_data()), tensor.byte_size());
    offset += static_cast<int64_t>(tensor.byte_size());
  }
  s->header_ = std::move(header);
  s->header_.set_total_bytes(offset);
  return s;
}

void ShardSnapshot::Read(int64_t offset, size_t n, std::string* out) const {
  out->clear();
  if (offset < 0 || offset >= size()) return;
  const int64_t end = std::min<int64_t>(size(), offset + static_cast<int64_t>(n));
  out->reserve(static_cast<size_t>(end - offset));
  // The last piece starting at or before `offset`.
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  while (offset < end) {
    const int64_t within = offset - starts_[i];
    const int64_t take = std::min<int64_t>(end - offset, static_cast<int64_t>(pieces_[i].size()) - within);
    out->append(pieces_[i].data() + within, static_cast<size_t>(take));
    offset += take;
    ++i;
  }
}

std::string ShardSnapshot::Bytes() const {
  std::string out;
  Read(0, static_cast<size_t>(size()), &out);
  return out;
}

uint64_t ShardSnapshot::ComputeDigest() {
  common::ShardDigest digest;
  for (absl::string_view piece : pieces_) digest.Update(piece);
  header_.set_digest(digest.Finish());
  return header_.digest();
}

}  // namespace shardline::worker
