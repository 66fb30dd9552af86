#include "common/int8_blocks.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::common {
namespace {

std::vector<float> RoundTrip(const std::vector<float>& x) {
  std::vector<char> bytes(Int8BlocksBytes(x.size()));
  EncodeInt8Blocks(x, absl::MakeSpan(bytes));
  std::vector<float> y(x.size());
  EXPECT_TRUE(DecodeInt8Blocks(bytes, absl::MakeSpan(y)).ok());
  return y;
}

// Every value within half a step of its block's scale (largest / 127),
// for sizes that end mid-block, values spanning many magnitudes.
TEST(Int8BlocksTest, RoundTripIsWithinTheDocumentedBound) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<float> exponent(-20, 20);
  for (size_t n : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{1000}, size_t{4096}}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * std::exp2(exponent(rng));
    const std::vector<float> y = RoundTrip(x);
    double worst = 0;
    for (size_t b = 0; b < n; b += kInt8BlockValues) {
      float largest = 0;
      const size_t end = std::min(n, b + kInt8BlockValues);
      for (size_t i = b; i < end; ++i) largest = std::max(largest, std::fabs(x[i]));
      const double bound = largest / 127.0 / 2 * (1 + std::exp2(-16));
      for (size_t i = b; i < end; ++i) {
        ASSERT_LE(std::fabs(static_cast<double>(x[i]) - y[i]), bound) << "value " << i << " of " << n;
        worst = std::max(worst, std::fabs(static_cast<double>(x[i]) - y[i]) / (largest / 127.0));
      }
    }
    if (n >= 64) {
      EXPECT_GT(worst, 0.3) << "the bound is tight: some value is off by most of half a step";
    }
  }
  EXPECT_EQ(Int8BlocksBytes(64), 68u);
  EXPECT_EQ(Int8BlocksBytes(65), 68u + 5);
  EXPECT_EQ(Int8BlocksBytes(0), 0u);
}

TEST(Int8BlocksTest, ZerosExtremesAndNonFiniteBlocks) {
  std::vector<float> x(130, 0.0f);
  x[1] = 3.0f;  // block 0: exact at its largest value
  x[2] = -3.0f;
  x[64] = std::numeric_limits<float>::infinity();  // block 1: not finite
  x[128] = std::numeric_limits<float>::max();       // block 2 (2 values): the largest float
  const std::vector<float> y = RoundTrip(x);
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_FLOAT_EQ(y[1], 3.0f);
  EXPECT_FLOAT_EQ(y[2], -3.0f);
  for (size_t i = 64; i < 128; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  EXPECT_FLOAT_EQ(y[128], std::numeric_limits<float>::max());
  EXPECT_EQ(y[129], 0.0f);
  x.assign(64, std::nanf(""));
  EXPECT_TRUE(std::isnan(RoundTrip(x)[5]));
}

TEST(Int8BlocksTest, DecodingRefusesAWrongSizeOrABadScale) {
  std::vector<float> x(100, 1.5f), y(100);
  std::vector<char> bytes(Int8BlocksBytes(100));
  EncodeInt8Blocks(x, absl::MakeSpan(bytes));
  EXPECT_EQ(DecodeInt8Blocks(absl::MakeSpan(bytes).subspan(1), absl::MakeSpan(y)).code(),
            absl::StatusCode::kInvalidArgument);
  const float negative = -1, infinite = std::numeric_limits<float>::infinity();
  std::memcpy(bytes.data() + 68, &negative, 4);
  EXPECT_EQ(DecodeInt8Blocks(bytes, absl::MakeSpan(y)).code(), absl::StatusCode::kInvalidArgument);
  std::memcpy(bytes.data() + 68, &infinite, 4);
  EXPECT_EQ(DecodeInt8Blocks(bytes, absl::MakeSpan(y)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::common
