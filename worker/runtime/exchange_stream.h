// ExchangeStream is one Exchange stream between two neighbouring stages as
// the stage thread sees it, whichever side opened it: Send encodes a message
// into frames and queues them for the gRPC reactor to write one at a time;
// Receive waits (with a deadline) for the next complete message that the
// reactor assembled from incoming frames. Close ends it with a reason that
// every later call returns. The reactor side talks to it through
// FrameWriter, so this file stays free of gRPC. Thread-safe.
#ifndef SHARDLINE_WORKER_RUNTIME_EXCHANGE_STREAM_H_
#define SHARDLINE_WORKER_RUNTIME_EXCHANGE_STREAM_H_

#include <atomic>
#include <deque>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/stage_link.pb.h"
#include "worker/runtime/stage_frame_coding.h"
#include "worker/runtime/stage_link.h"

namespace shardline::worker::runtime {

// Implemented by the reactor that owns the wire. StartFrameWrite is called
// with at most one frame in flight; the reactor answers with
// ExchangeStream::FrameWritten.
class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  virtual void StartFrameWrite(const shardline::v1::StageFrame* frame) = 0;
};

class ExchangeStream {
 public:
  // Messages received but not yet taken; more is a misbehaving peer.
  static constexpr size_t kMaxInbox = 4096;

  // Sends carry tensors at `wire` precision (f32, bf16 or f16).
  ExchangeStream(absl::Duration timeout, size_t chunk_bytes, common::DType wire = common::DType::kF32)
      : timeout_(timeout), chunk_bytes_(chunk_bytes), wire_(wire) {}

  // Stage side.
  absl::Status Send(const StageMessage& message);
  absl::StatusOr<StageMessage> Receive();
  // Waits until a reactor is attached (the peer connected), up to the timeout.
  absl::Status AwaitConnected();
  // Later calls fail with UNAVAILABLE carrying `reason`, or with `status`.
  void Close(const std::string& reason);
  void Close(const absl::Status& status);
  bool closed();

  // Reactor side. Attach before the first write; Detach once the reactor
  // will write no more (it calls nothing after that).
  void Attach(FrameWriter* writer);
  void Detach(const absl::Status& status);
  // A frame arrived; INVALID_ARGUMENT or RESOURCE_EXHAUSTED end the stream.
  absl::Status FrameReceived(const shardline::v1::StageFrame& frame);
  // The frame given to StartFrameWrite is on the wire (ok) or lost (!ok).
  void FrameWritten(bool ok);
  // True while a write is in flight (the reactor must not finish then).
  bool writing();
  // No write starts after this; returns whether one is still in flight.
  bool StopWriting();
  // Payload bytes of the frames received so far.
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  // Takes the next frame to write, if no write is in flight.
  const shardline::v1::StageFrame* NextWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration timeout_;
  const size_t chunk_bytes_;
  const common::DType wire_;
  std::atomic<uint64_t> bytes_received_{0};
  FrameAssembler assembler_;  // used by the reactor's read callbacks only, one at a time
  absl::Mutex mu_;
  FrameWriter* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_writes_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<shardline::v1::StageFrame> outbox_ ABSL_GUARDED_BY(mu_);
  std::deque<StageMessage> inbox_ ABSL_GUARDED_BY(mu_);
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // not OK once closed
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_EXCHANGE_STREAM_H_
