#include "common/dtype.h"

#include "gtest/gtest.h"
#include "shardline/v1/tensor.pb.h"

namespace shardline::common {
namespace {

TEST(DTypeTest, NamesAndSizesRoundTrip) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    auto parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, dtype);
    auto from_proto = DTypeFromProto(DTypeToProto(dtype));
    ASSERT_TRUE(from_proto.ok());
    EXPECT_EQ(*from_proto, dtype);
  }
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeToProto(DType::kBF16), shardline::v1::DTYPE_BF16);
}

TEST(DTypeTest, UnknownNamesAndWireValuesAreRejected) {
  EXPECT_EQ(ParseDType("f64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromProto(shardline::v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DTypeFromProto(99).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DTypeTest, NumElementsChecksEveryDimension) {
  EXPECT_EQ(*NumElements({}), 1);
  EXPECT_EQ(*NumElements({2, 3, 4}), 24);
  EXPECT_EQ(*NumElements({5, 0, 7}), 0);
  EXPECT_EQ(NumElements({2, -1}).status().code(), absl::StatusCode::kInvalidArgument);
  // 2^31 · 2^31 overflows nothing in int64 but is past the 2^48 cap.
  EXPECT_EQ(NumElements({int64_t{1} << 31, int64_t{1} << 31}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A product that would wrap int64 is caught before it wraps.
  EXPECT_EQ(NumElements({int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ByteSize(DType::kBF16, {3, 5}), 30u);
  EXPECT_EQ(ShapeString({2, 3}), "[2, 3]");
}

}  // namespace
}  // namespace shardline::common
