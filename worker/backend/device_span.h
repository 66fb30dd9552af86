// DeviceSpan<T> is a non-owning view of `size` elements of T in a backend's
// memory (host memory for the CPU backend, GPU memory for CUDA). It is a
// separate type from absl::Span so that host and device pointers are not
// mixed up by accident. Cheap to copy; never dereferenced on the host by
// code outside a backend.
#ifndef SHARDLINE_WORKER_BACKEND_DEVICE_SPAN_H_
#define SHARDLINE_WORKER_BACKEND_DEVICE_SPAN_H_

#include <algorithm>
#include <cstddef>
#include <type_traits>

namespace shardline::worker {

template <typename T>
class DeviceSpan {
 public:
  constexpr DeviceSpan() = default;
  constexpr DeviceSpan(T* data, size_t size) : data_(data), size_(size) {}
  // DeviceSpan<T> converts to DeviceSpan<const T>.
  template <typename U, typename = std::enable_if_t<std::is_same_v<const U, T>>>
  constexpr DeviceSpan(DeviceSpan<U> other) : data_(other.data()), size_(other.size()) {}

  constexpr T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }

  // Elements [offset, offset + count), clipped to the span: a view that is too
  // short is caught by the operation that receives it.
  constexpr DeviceSpan subspan(size_t offset, size_t count) const {
    offset = std::min(offset, size_);
    return DeviceSpan(data_ + offset, std::min(count, size_ - offset));
  }
  constexpr DeviceSpan subspan(size_t offset) const { return subspan(offset, size_); }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_DEVICE_SPAN_H_
