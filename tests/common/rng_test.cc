#include "common/rng.h"

#include <set>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(RngTest, SameKeySameStreamDifferentKeyDifferentStream) {
  Rng a(MixKey(1, 2, 3)), b(MixKey(1, 2, 3)), c(MixKey(1, 2, 4));
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
  EXPECT_EQ(HashString("blocks.0.attn.qkv.weight"), HashString("blocks.0.attn.qkv.weight"));
  EXPECT_NE(HashString("blocks.0.ln1.weight"), HashString("blocks.1.ln1.weight"));
}

TEST(RngTest, DistributionsStayInRangeWithPlausibleMoments) {
  Rng rng(7);
  std::set<uint64_t> seen;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t u = rng.Uniform(10);
    ASSERT_LT(u, 10u);
    seen.insert(u);
    const double d = rng.UniformDouble();
    ASSERT_GE(d, 0.0);
    ASSERT_LT(d, 1.0);
    const double n = rng.Normal();
    sum += n;
    sum_sq += n * n;
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_NEAR(sum / 20000, 0.0, 0.05);
  EXPECT_NEAR(sum_sq / 20000, 1.0, 0.05);
}

}  // namespace
}  // namespace shardline::common
