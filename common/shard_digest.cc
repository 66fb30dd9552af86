#include "common/shard_digest.h"

#include <cstring>

#include "common/rng.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "ShardDigest reads words little-endian");

namespace shardline::common {

void ShardDigest::Update(absl::string_view bytes) {
  length_ += bytes.size();
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (pending_bytes_ > 0 && n > 0) {  // finish a partial word
    pending_ |= uint64_t{static_cast<unsigned char>(*p++)} << (8 * pending_bytes_);
    --n;
    if (++pending_bytes_ == 8) {
      Word(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts only (x86-64, aarch64)
    Word(w);
  }
  for (; n > 0; --n) pending_ |= uint64_t{static_cast<unsigned char>(*p++)} << (8 * pending_bytes_++);
}

uint64_t ShardDigest::Finish() const {
  uint64_t h = hash_;
  if (pending_bytes_ > 0) h = (h ^ pending_) * 0x100000001b3ull;
  return SplitMix64(h ^ SplitMix64(length_));
}

}  // namespace shardline::common
