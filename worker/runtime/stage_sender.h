// StageSender sends a pipeline stage's messages to its neighbours in the
// order they are given, each once the device has written its tensor (the
// HostTransfer of the copy into the message's host buffer is done). The stage
// thread can then queue the next micro-batch's work while the previous one's
// output is still on its way to the host.
//
// A message whose tensor is already written and with nothing queued before it
// goes to the link at once, on the caller's thread: on the CPU backend every
// message does, so no thread is ever started. Otherwise the sender's own
// thread, started on first need, waits for the transfer and sends. At most
// `max_queued` messages wait for their transfers; Send blocks while that many
// do. A failure (of a transfer or of the link) is logged at once; Send and
// Flush return the first one from then on, and queued messages are dropped
// once their transfers are done. Thread-safe; meant for one stage thread.
#ifndef SHARDLINE_WORKER_RUNTIME_STAGE_SENDER_H_
#define SHARDLINE_WORKER_RUNTIME_STAGE_SENDER_H_

#include <cstddef>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/host_transfer.h"
#include "worker/transport/stage_link.h"

namespace shardline::worker::runtime {

class StageSender {
 public:
  enum class Direction { kNext, kPrevious };

  static constexpr size_t kDefaultMaxQueued = 4;

  explicit StageSender(transport::StageLink& link, size_t max_queued = kDefaultMaxQueued);
  // Waits for the transfers of the messages still queued, drops them (the
  // step they belong to has failed) and stops the thread.
  ~StageSender();
  StageSender(const StageSender&) = delete;
  StageSender& operator=(const StageSender&) = delete;

  // Sends `message` once `written` is done. OK means queued or sent; the
  // error of an earlier message otherwise.
  absl::Status Send(Direction to, transport::StageMessage message, HostTransfer written = {});
  // Waits until every message given so far has gone to the link (or been
  // dropped after a failure); the first failure.
  absl::Status Flush();

 private:
  struct Pending {
    Direction to = Direction::kNext;
    transport::StageMessage message;
    HostTransfer written;
  };

  absl::Status Deliver(Pending& pending);
  void Run();
  void Fail(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  transport::StageLink& link_;
  const size_t max_queued_;
  absl::Mutex mu_;
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool sending_ ABSL_GUARDED_BY(mu_) = false;  // a message is between the queue and the link
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // started by the first message that has to wait
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_STAGE_SENDER_H_
