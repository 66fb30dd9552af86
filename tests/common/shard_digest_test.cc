#include "common/shard_digest.h"

#include <string>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(ShardDigestTest, DependsOnTheBytesNotOnHowTheyArrive) {
  std::string bytes;
  for (int i = 0; i < 1000; ++i) bytes += static_cast<char>(i * 37);
  const uint64_t whole = ShardDigest::Of(bytes);
  for (size_t cut : {1, 5, 8, 13, 999}) {
    ShardDigest d;
    for (size_t at = 0; at < bytes.size(); at += cut) d.Update(absl::string_view(bytes).substr(at, cut));
    EXPECT_EQ(d.Finish(), whole) << cut;
  }
  std::string flipped = bytes;
  flipped[500] ^= 1;
  EXPECT_NE(ShardDigest::Of(flipped), whole);
  EXPECT_NE(ShardDigest::Of(bytes + std::string(1, '\0')), whole) << "the length counts";
  EXPECT_NE(ShardDigest::Of(""), ShardDigest::Of(std::string(8, '\0')));
}

}  // namespace
}  // namespace shardline::common
