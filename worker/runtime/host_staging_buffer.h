// HostStagingBuffer is a block of a backend's host staging memory
// (Backend::AllocateHostStaging: page-locked on CUDA, so the device copies
// to and from it run without the host waiting) that grows on demand and is
// freed with the buffer. Move-only; must not outlive its backend. Callers
// see to it that no copy still uses the memory when it grows or dies.
#ifndef SHARDLINE_WORKER_RUNTIME_HOST_STAGING_BUFFER_H_
#define SHARDLINE_WORKER_RUNTIME_HOST_STAGING_BUFFER_H_

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/backend/backend.h"

namespace shardline::worker::runtime {

class HostStagingBuffer {
 public:
  HostStagingBuffer() = default;
  ~HostStagingBuffer() { Free(); }
  HostStagingBuffer(HostStagingBuffer&& other) noexcept { *this = std::move(other); }
  HostStagingBuffer& operator=(HostStagingBuffer&& other) noexcept;
  HostStagingBuffer(const HostStagingBuffer&) = delete;
  HostStagingBuffer& operator=(const HostStagingBuffer&) = delete;

  // The first `count` elements of T, the block grown (contents dropped) when
  // it holds fewer.
  template <typename T>
  absl::StatusOr<absl::Span<T>> Get(Backend& backend, size_t count) {
    if (absl::Status s = Reserve(backend, count * sizeof(T)); !s.ok()) return s;
    return absl::Span<T>(static_cast<T*>(data_), count);
  }

 private:
  absl::Status Reserve(Backend& backend, size_t bytes);
  void Free();

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_HOST_STAGING_BUFFER_H_
