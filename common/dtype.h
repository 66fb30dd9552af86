// Element types of Shardline tensors, with their sizes and names, and the
// checked arithmetic that turns a shape into element and byte counts.
#ifndef SHARDLINE_COMMON_DTYPE_H_
#define SHARDLINE_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/half.h"

namespace shardline::common {

enum class DType : int { kF32 = 1, kBF16 = 2, kF16 = 3, kI32 = 4 };

// Bytes per element.
size_t DTypeSize(DType dtype);
// "f32", "bf16", "f16", "i32".
absl::string_view DTypeName(DType dtype);
// Inverse of DTypeName; INVALID_ARGUMENT for any other string.
absl::StatusOr<DType> ParseDType(absl::string_view name);
// From the wire enum value (shardline.v1.DType); INVALID_ARGUMENT for
// DTYPE_UNSPECIFIED or a number this build does not know.
absl::StatusOr<DType> DTypeFromProto(int proto_value);
int DTypeToProto(DType dtype);

// The DType of a C++ element type.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kF16;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kI32;
};

// Largest number of elements a tensor may have (2^48): a shape past it is
// refused long before any size arithmetic can overflow.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;

// Product of the dimensions. INVALID_ARGUMENT for a negative dimension or a
// product above kMaxElements. An empty shape is a scalar (1 element).
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);
// NumElements(shape) * DTypeSize(dtype), with the same checks.
absl::StatusOr<size_t> ByteSize(DType dtype, absl::Span<const int64_t> shape);
// "[2, 3, 4]".
std::string ShapeString(absl::Span<const int64_t> shape);

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_DTYPE_H_
