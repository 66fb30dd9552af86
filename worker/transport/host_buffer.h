// HostBuffer holds the floats of a stage-link tensor in host memory: either
// its own heap vector, or a StagingSlot (pinned on CUDA workers) that goes
// back to its pool when the buffer is destroyed. Moves keep the storage;
// copies are deep and land on the heap (a slot is never shared).
#ifndef SHARDLINE_WORKER_TRANSPORT_HOST_BUFFER_H_
#define SHARDLINE_WORKER_TRANSPORT_HOST_BUFFER_H_

#include <initializer_list>
#include <vector>

#include "absl/types/span.h"
#include "worker/transport/staging_pool.h"

namespace shardline::worker::transport {

class HostBuffer {
 public:
  using value_type = float;
  using iterator = float*;
  using const_iterator = const float*;

  HostBuffer() = default;
  HostBuffer(std::vector<float> values);  // NOLINT: implicit, a vector is a heap buffer
  HostBuffer(std::initializer_list<float> values) : HostBuffer(std::vector<float>(values)) {}
  // `elements` floats in `slot` (which must hold them); their values are
  // whatever the slot held.
  HostBuffer(StagingSlot slot, size_t elements);
  // `elements` floats on the heap, zero.
  static HostBuffer Zeros(size_t elements) { return HostBuffer(std::vector<float>(elements)); }

  HostBuffer(const HostBuffer& other) : HostBuffer(other.ToVector()) {}
  HostBuffer& operator=(const HostBuffer& other);
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  float* begin() { return data_; }
  float* end() { return data_ + size_; }
  const float* begin() const { return data_; }
  const float* end() const { return data_ + size_; }
  float& operator[](size_t i) { return data_[i]; }
  float operator[](size_t i) const { return data_[i]; }
  absl::Span<float> span() { return {data_, size_}; }
  operator absl::Span<const float>() const { return {data_, size_}; }  // NOLINT
  std::vector<float> ToVector() const { return {begin(), end()}; }
  // True while the floats live in a staging slot.
  bool staged() const { return static_cast<bool>(slot_); }

  friend bool operator==(const HostBuffer& a, const HostBuffer& b);
  friend bool operator!=(const HostBuffer& a, const HostBuffer& b) { return !(a == b); }

 private:
  std::vector<float> heap_;
  StagingSlot slot_;
  float* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_HOST_BUFFER_H_
