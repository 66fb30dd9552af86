// ExchangeStream is one Exchange stream between two neighbouring stages as
// the stage thread sees it, whichever side opened it: Send splits a message
// into frames that alias its values and queues them for the gRPC reactor to
// write one at a time; Receive waits (with a deadline) for the next complete
// message that the reactor assembled from incoming frames. Close ends it with
// a reason that every later call returns. The reactor side talks to it
// through FrameWriter, so this file knows nothing of reactors.
//
// Memory is bounded on both sides whatever the speeds of the two stages:
//   - Send waits while `max_waiting` messages are queued and not yet written;
//   - a data frame is written only under credit the peer granted (the
//     protocol in stage_link.proto); we grant a frame back once it is copied
//     into its message and fewer than `max_waiting` complete messages wait
//     for the stage, so at most `window_frames` frames plus `max_waiting`
//     messages are ever held for a slow stage.
// Thread-safe.
#ifndef SHARDLINE_WORKER_TRANSPORT_EXCHANGE_STREAM_H_
#define SHARDLINE_WORKER_TRANSPORT_EXCHANGE_STREAM_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/support/byte_buffer.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/transport/stage_frame_coding.h"
#include "worker/transport/stage_link.h"
#include "worker/transport/staging_pool.h"
#include "worker/transport/wire_pace.h"

namespace shardline::worker::transport {

struct ExchangeOptions {
  absl::Duration timeout = absl::Seconds(60);  // for every wait of the stage thread
  size_t chunk_bytes = kDefaultChunkBytes;     // payload bytes per data frame
  uint32_t window_frames = 16;                 // data frames the peer may send ahead of us
  size_t max_waiting = 8;                      // messages queued to send, or received and not taken
  std::shared_ptr<StagingPool> receive_pool;   // where received tensors go when it has room
  FrameLimits limits;                          // the largest tensor (and targets) the peer may send
  std::string link_token;                      // the job's secret: hellos carry it (Assignment.link_token)
  WireCodec codec = WireCodec::kAsIs;          // how f32 activations and gradients are sent
  // The side that dials protects its channel with these (null: plaintext).
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
};

// Implemented by the reactor that owns the wire. StartFrameWrite is called
// with at most one frame in flight; the reactor answers with
// ExchangeStream::FrameWritten. `more_follows`: another write comes right
// after this one, so gRPC may coalesce them (its buffer hint).
class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  virtual void StartFrameWrite(const grpc::ByteBuffer* frame, bool more_follows) = 0;
  // Ends the call with `status`, which the peer then sees, from any thread
  // (never under the stream's lock); nothing once the call is ending.
  virtual void EndCall(const absl::Status& status) = 0;
};

class ExchangeStream {
 public:
  explicit ExchangeStream(const ExchangeOptions& options)
      : options_(options), assembler_(options.receive_pool, options.limits), peer_credit_(options.window_frames) {}

  // Stage side.
  absl::Status Send(std::shared_ptr<const StageMessage> message);
  absl::StatusOr<StageMessage> Receive();
  // Waits until a reactor is attached (the peer connected), up to the timeout.
  absl::Status AwaitConnected();
  // Later calls fail with UNAVAILABLE carrying `reason`, or with `status`.
  // The peer notices when the call ends (its process, or this side's link,
  // goes away).
  void Close(const std::string& reason);
  void Close(const absl::Status& status);
  // Close, and end the call now with UNAVAILABLE `reason`, so that the peer's
  // waits fail at once too (or as soon as the call is established).
  void Abort(const std::string& reason);
  bool closed();
  // Waits until every frame queued so far is written (or the stream is
  // closed), up to `timeout`; whether it was. A link going away after its
  // stage's last step calls it first, so the last message still queued
  // (the last step's norm total) is not dropped with the call.
  bool AwaitSent(absl::Duration timeout);

  // Reactor side. Our hello (or ack) grants the peer `window_frames()`;
  // Attach, with the peer's grant, before the first write; Detach once the
  // reactor will write no more (it calls nothing after that).
  uint32_t window_frames() const { return options_.window_frames; }
  void Attach(FrameWriter* writer, uint32_t peer_credit);
  void Detach(const absl::Status& status);
  // A frame arrived after the hellos. INVALID_ARGUMENT (malformed) or
  // RESOURCE_EXHAUSTED (sent without credit) end the stream.
  absl::Status FrameReceived(const grpc::ByteBuffer& frame);
  // The frame given to StartFrameWrite is on the wire (ok) or lost (!ok).
  void FrameWritten(bool ok);
  // True while a write is in flight (the reactor must not finish then).
  bool writing();
  // No write starts after this; returns whether one is still in flight.
  bool StopWriting();

  // Payload bytes of the frames received so far.
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }
  // What the frames received so far showed of the wire (wire_pace.h).
  WirePace wire_pace() const {
    return {paced_bytes_.load(std::memory_order_relaxed), paced_nanos_.load(std::memory_order_relaxed)};
  }
  // Most complete messages that ever waited for the stage at once.
  size_t peak_waiting_received();
  // Most tensor bytes this stream ever held at once: messages queued to
  // send and not yet written, plus received ones the stage has not taken.
  size_t peak_held_bytes();

 private:
  struct Outgoing {
    grpc::ByteBuffer frame;
    size_t message_bytes = 0;  // on a message's last frame: its tensor bytes
    bool ends_message = false;
  };
  // A write to start once the lock is released (the reactor may answer on
  // another thread at once); empty when there is none.
  struct Write {
    FrameWriter* writer = nullptr;
    const grpc::ByteBuffer* frame = nullptr;
    bool more_follows = false;
    void Start() const;
  };
  // The next frame to write, if none is in flight: a pending grant first,
  // then a data frame if the peer granted credit.
  Write NextWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Grants back the frames we hold credit for, if the stage keeps up.
  void MaybeGrant() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the attached writer's call with abort_, if both are set; the
  // writer stays alive meanwhile (Detach waits).
  void EndCallIfAborted();
  void Hold(size_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Times a data frame's arrival: one behind a frame marked followed
  // counts towards wire_pace(). Reactor side only.
  void Pace(bool followed, size_t payload_bytes);

  const ExchangeOptions options_;
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> paced_bytes_{0};
  std::atomic<uint64_t> paced_nanos_{0};
  FrameAssembler assembler_;  // used by the reactor's read callbacks only, one at a time
  // The reactor's, like assembler_: when the last data frame arrived, and
  // whether its sender marked it followed.
  int64_t last_arrival_nanos_ = 0;
  bool last_followed_ = false;
  absl::Mutex mu_;
  FrameWriter* writer_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_grant_ ABSL_GUARDED_BY(mu_) = false;  // the write in flight is grant_frame_
  bool stop_writes_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<Outgoing> outbox_ ABSL_GUARDED_BY(mu_);
  size_t queued_messages_ ABSL_GUARDED_BY(mu_) = 0;  // messages with frames in outbox_
  uint32_t send_credit_ ABSL_GUARDED_BY(mu_) = 0;    // data frames the peer lets us write
  uint32_t peer_credit_ ABSL_GUARDED_BY(mu_);        // data frames we let the peer write
  uint32_t owed_ ABSL_GUARDED_BY(mu_) = 0;           // received frames not yet granted back
  uint32_t grant_pending_ ABSL_GUARDED_BY(mu_) = 0;  // granted, not yet written
  grpc::ByteBuffer grant_frame_ ABSL_GUARDED_BY(mu_);
  // The data frame in flight, marked followed, when the next one was ready.
  grpc::ByteBuffer followed_frame_ ABSL_GUARDED_BY(mu_);
  std::deque<StageMessage> inbox_ ABSL_GUARDED_BY(mu_);
  size_t peak_inbox_ ABSL_GUARDED_BY(mu_) = 0;
  size_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  size_t peak_held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);  // not OK once closed
  absl::Status abort_ ABSL_GUARDED_BY(mu_);   // not OK once aborted: the call must end
  bool call_ended_ ABSL_GUARDED_BY(mu_) = false;
  int writer_calls_ ABSL_GUARDED_BY(mu_) = 0;  // EndCall calls in progress
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_EXCHANGE_STREAM_H_
