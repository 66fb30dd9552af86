// HostTransfer is the handle of a copy between a backend's memory and the
// host that a backend queued without waiting for it (Backend::CopyToHostAsync,
// CopyToDeviceAsync). The host side of the copy must stay allocated and
// untouched until the transfer is done: after Wait() returns OK for a copy to
// the host, the host memory holds the values; after it returns for a copy to
// the device, the host memory may be reused.
//
// Copyable: copies share one transfer. Wait() and done() may be called from
// any thread, also while the backend's own thread queues more work. A
// default-constructed transfer is already done (what backends that copy at
// once return).
#ifndef SHARDLINE_WORKER_BACKEND_HOST_TRANSFER_H_
#define SHARDLINE_WORKER_BACKEND_HOST_TRANSFER_H_

#include <memory>
#include <utility>

#include "absl/status/status.h"

namespace shardline::worker {

class HostTransfer {
 public:
  // What a backend implements for a transfer still in flight.
  class Completion {
   public:
    virtual ~Completion() = default;
    // Blocks until the copy has finished; its error, if it failed.
    virtual absl::Status Wait() = 0;
    // True once the copy has finished (or failed); never blocks.
    virtual bool Done() = 0;
    // The backend's own handle (a cudaEvent_t on CUDA), for ordering device
    // work after the copy without the host waiting.
    virtual void* native_handle() = 0;
  };

  HostTransfer() = default;
  explicit HostTransfer(std::shared_ptr<Completion> completion)
      : completion_(std::move(completion)) {}

  absl::Status Wait() const { return completion_ ? completion_->Wait() : absl::OkStatus(); }
  bool done() const { return !completion_ || completion_->Done(); }
  // Null when the transfer was finished before it was returned.
  void* native_handle() const { return completion_ ? completion_->native_handle() : nullptr; }

 private:
  std::shared_ptr<Completion> completion_;
};

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_BACKEND_HOST_TRANSFER_H_
