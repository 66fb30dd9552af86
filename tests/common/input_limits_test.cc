#include "common/input_limits.h"

#include <limits>

#include "common/checked_int.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(InputLimitsTest, QuoteKeepsAShortPrintablePrefix) {
  EXPECT_EQ(Quote("job-1"), "'job-1'");
  EXPECT_EQ(Quote(std::string("a\nb\0c", 5)), "'a\\x0ab\\x00c'");
  const std::string quoted = Quote(std::string(1 << 20, 'x'));
  EXPECT_LT(quoted.size(), kMaxQuotedBytes + 32);
  EXPECT_NE(quoted.find("(1048576 bytes)"), std::string::npos) << quoted;
}

TEST(InputLimitsTest, LengthChecksNameTheFieldNotTheValue) {
  EXPECT_TRUE(CheckLength("job_id", std::string(kMaxIdBytes, 'j'), kMaxIdBytes).ok());
  const absl::Status long_id = CheckLength("job_id", std::string(1 << 20, 'j'), kMaxIdBytes);
  EXPECT_EQ(long_id.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_id.message(), "job_id is 1048576 bytes, at most 128");
  EXPECT_EQ(CheckRequired("worker_id", "", kMaxIdBytes).message(), "worker_id is required");
}

TEST(CheckedInt64Test, AnOverflowAnywhereIsRememberedAndSaturates) {
  const CheckedInt64 big = std::numeric_limits<int64_t>::max() / 2 + 1;
  EXPECT_TRUE((big + 1).ok());
  EXPECT_FALSE((big * 2).ok());
  EXPECT_FALSE((big + big).ok());
  EXPECT_FALSE((big * 2 - big + 0).ok()) << "an overflow stays with the result";
  EXPECT_EQ((big * 4).value(), std::numeric_limits<int64_t>::max());
  EXPECT_FALSE((CheckedInt64(std::numeric_limits<int64_t>::min()) - 1).ok());
  EXPECT_EQ((CheckedInt64(6) * 7 + 8).value(), 50);
  EXPECT_EQ((CheckedInt64(100) * 3).DividedBy(4).value(), 75);
}

}  // namespace
}  // namespace shardline::common
