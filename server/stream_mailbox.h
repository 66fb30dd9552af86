// StreamMailbox<T> carries messages from the coordinator's domain threads to
// one gRPC server-streaming reactor: Push queues a message and starts a write
// when none is in flight; the reactor reports each finished write. The
// reactor cannot finish while a write is in flight, so Push never touches a
// finished reactor. A mailbox made with a limit drops, past that many queued
// messages, the oldest it has not sent (a status stream: the subscriber
// still gets the latest); one without keeps everything (assignments: a
// worker gets at most two per job). A mailbox serves one stream: once that
// stream is gone, TakeUnsent moves what it did not deliver to the next
// one's. Thread-safe.
#ifndef SHARDLINE_SERVER_STREAM_MAILBOX_H_
#define SHARDLINE_SERVER_STREAM_MAILBOX_H_

#include <algorithm>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardline::server {

template <typename T>
class StreamMailbox {
 public:
  static constexpr size_t kUnlimited = 0;
  explicit StreamMailbox(size_t max_queued) : max_queued_(max_queued) {}

  using StartWrite = std::function<void(const T*)>;

  // The reactor attaches once it can write, and detaches in OnDone.
  void Attach(StartWrite start_write) {
    const T* next = nullptr;
    {
      absl::MutexLock lock(&mu_);
      start_write_ = std::move(start_write);
      next = NextLocked();
    }
    if (next != nullptr) start_write_(next);
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    start_write_ = nullptr;
    closed_ = true;
  }
  // False once the reactor is gone: the subscriber should be dropped.
  bool Push(T message) {
    const T* next = nullptr;
    StartWrite start;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return false;
      queue_.push_back(std::move(message));
      // The front may be in flight; drop the oldest message behind it.
      if (max_queued_ != kUnlimited && queue_.size() > std::max<size_t>(max_queued_, 2)) {
        queue_.erase(queue_.begin() + (writing_ ? 1 : 0));
      }
      next = NextLocked();
      start = start_write_;
    }
    if (next != nullptr) start(next);
    return true;
  }
  // The reactor's OnWriteDone. A failed write keeps its message, for
  // TakeUnsent (the stream broke: it may never have arrived).
  void Written(bool ok) {
    const T* next = nullptr;
    StartWrite start;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (ok && !queue_.empty()) queue_.pop_front();
      if (!ok) closed_ = true;
      next = NextLocked();
      start = start_write_;
    }
    if (next != nullptr) start(next);
  }
  bool writing() {
    absl::MutexLock lock(&mu_);
    return writing_;
  }
  // Closes the mailbox and hands over the messages not yet written (a write
  // in flight keeps its own), for a new stream's mailbox.
  std::deque<T> TakeUnsent() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    std::deque<T> out;
    const size_t first = writing_ ? 1 : 0;
    while (queue_.size() > first) {
      out.push_front(std::move(queue_.back()));
      queue_.pop_back();
    }
    return out;
  }
  // No more writes start; returns whether one is in flight.
  bool Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
    return writing_;
  }

 private:
  const T* NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || closed_ || !start_write_ || queue_.empty()) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  StartWrite start_write_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_STREAM_MAILBOX_H_
