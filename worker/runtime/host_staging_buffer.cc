#include "worker/runtime/host_staging_buffer.h"

#include <utility>

namespace shardline::worker::runtime {

HostStagingBuffer& HostStagingBuffer::operator=(HostStagingBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status HostStagingBuffer::Reserve(Backend& backend, size_t bytes) {
  if (bytes == 0 || (bytes <= bytes_ && backend_ == &backend)) return absl::OkStatus();
  Free();
  absl::StatusOr<void*> memory = backend.AllocateHostStaging(bytes);
  if (!memory.ok()) return memory.status();
  backend_ = &backend;
  data_ = *memory;
  bytes_ = bytes;
  return absl::OkStatus();
}

void HostStagingBuffer::Free() {
  if (data_ != nullptr) backend_->FreeHostStaging(data_);
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace shardline::worker::runtime
