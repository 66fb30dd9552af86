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
  explicit StreamMailbox(size_t max_queued, size_t max_bytes = kUnlimited)
      : max_queued_(max_queued), max_bytes_(max_bytes) {}

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
      queued_bytes_ += Bytes(message);
      queue_.push_back(std::move(message));
      // The front may be in flight; drop the oldest messages behind it (the
      // newest always stays).
      auto over = [this] {
        return (max_queued_ != kUnlimited && queue_.size() > std::max<size_t>(max_queued_, 2)) ||
               (max_bytes_ != kUnlimited && queued_bytes_ > max_bytes_);
      };
      const size_t first = writing_ ? 1 : 0;
      while (over() && queue_.size() > first + 1) {
        queued_bytes_ -= std::min(queued_bytes_, Bytes(queue_[first]));
        queue_.erase(queue_.begin() + first);
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
      if (ok && !queue_.empty()) {
        queued_bytes_ -= std::min(queued_bytes_, Bytes(queue_.front()));
        queue_.pop_front();
      }
      if (!ok) closed_ = true;
      next = NextLocked();
      start = start_write_;
    }
    if (next != nullptr) start(next);
  }
  // True once the stream is gone (or the mailbox handed on).
  bool closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
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
      queued_bytes_ -= std::min(queued_bytes_, Bytes(queue_.back()));
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
  // A protobuf message's serialized size; sizeof for anything else.
  template <typename U>
  static auto BytesOf(const U& m, int) -> decltype(static_cast<size_t>(m.ByteSizeLong())) {
    return m.ByteSizeLong();
  }
  template <typename U>
  static size_t BytesOf(const U&, long) {
    return sizeof(U);
  }
  static size_t Bytes(const T& m) { return BytesOf(m, 0); }

  const T* NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || closed_ || !start_write_ || queue_.empty()) return nullptr;
    writing_ = true;
    return &queue_.front();
  }

  const size_t max_queued_;
  const size_t max_bytes_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  StartWrite start_write_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardline::server

#endif  // SHARDLINE_SERVER_STREAM_MAILBOX_H_
