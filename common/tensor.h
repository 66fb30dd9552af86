// Tensor is the host-side tensor value type: a dtype, a row-major shape and
// 64-byte aligned storage that the Tensor owns. Copying a Tensor copies its
// data (use std::move to hand it on cheaply). Not thread-safe: share a Tensor
// between threads only for reading.
//
// Every factory validates the shape (no negative dimensions, no element count
// past kMaxElements) and returns INVALID_ARGUMENT instead of allocating
// nonsense. Accessing the elements with the wrong C++ type is a programming
// error and CHECK-fails.
#ifndef SHARDLINE_COMMON_TENSOR_H_
#define SHARDLINE_COMMON_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "glog/logging.h"

namespace shardline::common {

class Tensor {
 public:
  static constexpr size_t kAlignment = 64;

  // An empty f32 tensor of shape [0].
  Tensor();

  // A zero-filled tensor.
  static absl::StatusOr<Tensor> Zeros(DType dtype, std::vector<int64_t> shape);
  // A tensor holding `values`; their count must match the shape.
  template <typename T>
  static absl::StatusOr<Tensor> FromValues(std::vector<int64_t> shape, absl::Span<const T> values);

  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept = default;
  Tensor& operator=(Tensor&& other) noexcept = default;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t num_elements() const { return num_elements_; }
  size_t byte_size() const { return static_cast<size_t>(num_elements_) * DTypeSize(dtype_); }

  void* raw_data() { return data_.get(); }
  const void* raw_data() const { return data_.get(); }

  template <typename T>
  absl::Span<T> values() {
    CHECK(DTypeOf<T>::value == dtype_) << "tensor holds " << DTypeName(dtype_);
    return absl::Span<T>(static_cast<T*>(raw_data()), static_cast<size_t>(num_elements_));
  }
  template <typename T>
  absl::Span<const T> values() const {
    CHECK(DTypeOf<T>::value == dtype_) << "tensor holds " << DTypeName(dtype_);
    return absl::Span<const T>(static_cast<const T*>(raw_data()), static_cast<size_t>(num_elements_));
  }

  // Changes the shape without touching the data; INVALID_ARGUMENT unless the
  // new shape has the same number of elements.
  absl::Status Reshape(std::vector<int64_t> shape);

  // Converts to another floating dtype (f32, bf16, f16), rounding to nearest
  // even. INVALID_ARGUMENT for conversions to or from i32.
  absl::StatusOr<Tensor> ConvertTo(DType dtype) const;

  // "f32[2, 3]".
  std::string DebugString() const;

 private:
  struct FreeDeleter {
    void operator()(std::byte* p) const { std::free(p); }
  };
  using Storage = std::unique_ptr<std::byte, FreeDeleter>;

  Tensor(DType dtype, std::vector<int64_t> shape, int64_t num_elements, Storage data);
  static Storage AllocateZeroed(size_t bytes);

  DType dtype_;
  std::vector<int64_t> shape_;
  int64_t num_elements_;
  Storage data_;
};

template <typename T>
absl::StatusOr<Tensor> Tensor::FromValues(std::vector<int64_t> shape, absl::Span<const T> values) {
  absl::StatusOr<Tensor> tensor = Zeros(DTypeOf<T>::value, std::move(shape));
  if (!tensor.ok()) return tensor.status();
  if (static_cast<int64_t>(values.size()) != tensor->num_elements()) {
    return absl::InvalidArgumentError("value count " + std::to_string(values.size()) +
                                      " does not match shape " + ShapeString(tensor->shape()));
  }
  std::copy(values.begin(), values.end(), tensor->values<T>().begin());
  return tensor;
}

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_TENSOR_H_
