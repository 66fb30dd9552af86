#include "tests/testing/deferred_copy_backend.h"

#include <cstring>
#include <utility>

#include "common/status_macros.h"

namespace shardline::testing {

DeferredCopyBackend::DeferredCopyBackend(absl::Duration delay)
    : delay_(delay), thread_([this] { Run(); }) {}

DeferredCopyBackend::~DeferredCopyBackend() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

int DeferredCopyBackend::deferred_copies() {
  absl::MutexLock lock(&mu_);
  return finished_;
}

worker::HostTransfer DeferredCopyBackend::Queue(const void* src, void* dst, size_t bytes) {
  auto completion = std::make_shared<ManualCompletion>();
  absl::MutexLock lock(&mu_);
  queue_.push_back({absl::Now() + delay_, src, dst, bytes, completion});
  return worker::HostTransfer(std::move(completion));
}

absl::StatusOr<worker::HostTransfer> DeferredCopyBackend::CopyToHostAsyncImpl(const void* src,
                                                                              void* dst,
                                                                              size_t bytes) {
  return Queue(src, dst, bytes);  // the bytes are read when the copy runs
}

absl::StatusOr<worker::HostTransfer> DeferredCopyBackend::CopyToDeviceAsyncImpl(
    const void* src, void* dst, size_t bytes, const worker::HostTransfer* after) {
  if (after != nullptr) RETURN_IF_ERROR(after->Wait());
  // The work queued next reads `dst` at once (the CPU computes as work is
  // queued), so the bytes move now; the host memory counts as read later.
  std::memcpy(dst, src, bytes);
  return Queue(nullptr, nullptr, 0);
}

void DeferredCopyBackend::Run() {
  while (true) {
    Pending next;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    const absl::Duration wait = next.due - absl::Now();
    if (wait > absl::ZeroDuration()) absl::SleepFor(wait);
    if (next.src != nullptr) std::memcpy(next.dst, next.src, next.bytes);
    next.completion->Finish();
    absl::MutexLock lock(&mu_);
    ++finished_;
  }
}

}  // namespace shardline::testing
