#include "worker/transport/host_buffer.h"

#include <algorithm>

#include "glog/logging.h"

namespace shardline::worker::transport {

HostBuffer::HostBuffer(std::vector<float> values)
    : heap_(std::move(values)), data_(heap_.data()), size_(heap_.size()) {}

HostBuffer::HostBuffer(StagingSlot slot, size_t elements)
    : slot_(std::move(slot)), data_(static_cast<float*>(slot_.data())), size_(elements) {
  CHECK_LE(elements * sizeof(float), slot_.bytes()) << "a staging slot too small for its tensor";
}

HostBuffer& HostBuffer::operator=(const HostBuffer& other) {
  if (this != &other) *this = HostBuffer(other.ToVector());
  return *this;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this == &other) return *this;
  // A vector's move keeps its storage, so data_ stays valid for heap buffers.
  heap_ = std::move(other.heap_);
  slot_ = std::move(other.slot_);
  data_ = other.data_;
  size_ = other.size_;
  other.heap_.clear();
  other.data_ = nullptr;
  other.size_ = 0;
  return *this;
}

bool operator==(const HostBuffer& a, const HostBuffer& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace shardline::worker::transport
