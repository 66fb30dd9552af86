// DeviceBuffer owns one allocation in a backend's memory and frees it when it
// dies. Move-only. A buffer must not outlive the backend that allocated it.
// Not thread-safe (like any value).
#ifndef SHARDLINE_WORKER_BACKEND_DEVICE_BUFFER_H_
#define SHARDLINE_WORKER_BACKEND_DEVICE_BUFFER_H_

#include <cstddef>
#include <functional>
#include <utility>

#include "worker/backend/device_span.h"

namespace shardline::worker {

class DeviceBuffer {
 public:
  using Release = std::function<void(void*)>;

  DeviceBuffer() = default;
  DeviceBuffer(void* data, size_t bytes, Release release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  ~DeviceBuffer() { Reset(); }

  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        bytes_(std::exchange(other.bytes_, 0)),
        release_(std::move(other.release_)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      release_ = std::move(other.release_);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  // The whole buffer as elements of T (a trailing partial element is left out).
  template <typename T>
  DeviceSpan<T> span() const {
    return DeviceSpan<T>(static_cast<T*>(data_), bytes_ / sizeof(T));
  }

 private:
  void Reset() {
    if (data_ != nullptr && release_) release_(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
  Release release_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_DEVICE_BUFFER_H_
