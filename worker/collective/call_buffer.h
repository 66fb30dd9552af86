// CallBuffer is the data of one collective call as the implementations see
// it: a rank's device buffer, read and written through its backend, or host
// memory, read and written directly. A call on host memory touches no
// backend, so a thread of its own may make it while the rank's backend
// thread goes on queuing work (the gradient reduction overlapping the
// backward pass: runtime/gradient_buckets.h). Cheap to copy; a view.
#ifndef SHARDLINE_WORKER_COLLECTIVE_CALL_BUFFER_H_
#define SHARDLINE_WORKER_COLLECTIVE_CALL_BUFFER_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/backend/backend.h"
#include "worker/backend/device_span.h"

namespace shardline::worker::collective {

class CallBuffer {
 public:
  static CallBuffer OnDevice(Backend& backend, DeviceSpan<float> data) { return CallBuffer(&backend, data, {}); }
  static CallBuffer OnHost(absl::Span<float> data) { return CallBuffer(nullptr, {}, data); }

  size_t size() const { return backend_ != nullptr ? device_.size() : host_.size(); }
  // Copies elements [begin, begin + out.size()) into `out`.
  absl::Status Read(size_t begin, absl::Span<float> out) const;
  // Writes `values` over elements [begin, begin + values.size()).
  absl::Status Write(size_t begin, absl::Span<const float> values) const;
  // Host memory: the elements themselves, to read without a copy; null on a device.
  const float* host_data() const { return backend_ != nullptr ? nullptr : host_.data(); }

 private:
  CallBuffer(Backend* backend, DeviceSpan<float> device, absl::Span<float> host)
      : backend_(backend), device_(device), host_(host) {}

  Backend* backend_;  // null: host memory
  DeviceSpan<float> device_;
  absl::Span<float> host_;
};

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_CALL_BUFFER_H_
