// UpstreamExchangeCall is one StageLink.Exchange call from a stage to the
// previous stage's worker (the client side of the stream). The hello, with
// the credit this side grants, goes out first; the shared ExchangeStream is
// attached (and may write) only once the upstream side has answered with its
// ack, so a call refused before that (the upstream stage has not registered
// yet) leaves the stream untouched and GrpcStageLink can try again. A hold
// keeps the call open while the stage thread may still start writes.
#ifndef SHARDLINE_WORKER_TRANSPORT_UPSTREAM_EXCHANGE_CALL_H_
#define SHARDLINE_WORKER_TRANSPORT_UPSTREAM_EXCHANGE_CALL_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "shardline/v1/stage_link.pb.h"
#include "worker/transport/exchange_stream.h"

namespace shardline::worker::transport {

class UpstreamExchangeCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                                   public FrameWriter {
 public:
  UpstreamExchangeCall(grpc::GenericStub* stub, const shardline::v1::StageHello& hello,
                       std::shared_ptr<ExchangeStream> stream);

  void Start();
  // Blocks until the call is established (true) or over (false; see status()).
  bool WaitEstablished(absl::Duration timeout);
  bool done();
  // Why the call ended (once done()).
  absl::Status status();
  // Stops the call and waits until gRPC is done with this object. With a
  // `grace`, an established call is half-closed first and the upstream side
  // given that long to read what was sent and end the call; then (or at
  // once) the call is cancelled.
  void Shutdown(absl::Duration grace = absl::ZeroDuration());

  void StartFrameWrite(const grpc::ByteBuffer* frame, bool more_follows) override;
  // Cancels the call (the upstream side sees it cancelled).
  void EndCall(const absl::Status& status) override;
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  void ReleaseHold();
  // The stream may write only once our hello is off (its write completed:
  // one write at a time) and the upstream side has acked it; whichever of
  // the two happens second attaches.
  void MaybeAttach(bool hello_done, bool ack_received);

  grpc::GenericStub* const stub_;
  const std::shared_ptr<ExchangeStream> stream_;
  grpc::ClientContext context_;
  grpc::ByteBuffer hello_;
  grpc::ByteBuffer in_;
  std::atomic<uint32_t> peer_credit_{0};  // the ack's grant
  bool hello_written_ = false;            // OnWriteDone only
  std::atomic<bool> attached_{false};
  bool acked_ = false;  // OnReadDone only
  std::atomic<bool> release_after_write_{false};
  std::atomic<bool> hold_released_{false};
  absl::Mutex mu_;
  bool established_ ABSL_GUARDED_BY(mu_) = false;
  bool hello_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool ack_received_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_UPSTREAM_EXCHANGE_CALL_H_
