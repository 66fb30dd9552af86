#include "common/dtype.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "shardline/v1/tensor.pb.h"

namespace shardline::common {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
  }
  return "invalid";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, bf16, f16 or i32)"));
}

absl::StatusOr<DType> DTypeFromProto(int proto_value) {
  switch (proto_value) {
    case shardline::v1::DTYPE_F32:
      return DType::kF32;
    case shardline::v1::DTYPE_BF16:
      return DType::kBF16;
    case shardline::v1::DTYPE_F16:
      return DType::kF16;
    case shardline::v1::DTYPE_I32:
      return DType::kI32;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown or unspecified dtype ", proto_value));
  }
}

int DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return shardline::v1::DTYPE_F32;
    case DType::kBF16:
      return shardline::v1::DTYPE_BF16;
    case DType::kF16:
      return shardline::v1::DTYPE_F16;
    case DType::kI32:
      return shardline::v1::DTYPE_I32;
  }
  return shardline::v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t dim = shape[i];
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dimension ", dim, " at index ", i, " of shape ", ShapeString(shape)));
    }
    // count <= kMaxElements, so the check below cannot itself overflow.
    if (dim != 0 && count > kMaxElements / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has more than 2^48 elements"));
    }
    count *= dim;
  }
  return count;
}

absl::StatusOr<size_t> ByteSize(DType dtype, absl::Span<const int64_t> shape) {
  absl::StatusOr<int64_t> count = NumElements(shape);
  if (!count.ok()) return count.status();
  return static_cast<size_t>(*count) * DTypeSize(dtype);
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace shardline::common
