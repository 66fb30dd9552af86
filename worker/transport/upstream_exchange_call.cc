#include "worker/transport/upstream_exchange_call.h"

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tensor_coding.h"
#include "worker/transport/stage_link_service.h"

namespace shardline::worker::transport {

UpstreamExchangeCall::UpstreamExchangeCall(grpc::GenericStub* stub, const shardline::v1::StageHello& hello,
                                           std::shared_ptr<ExchangeStream> stream)
    : stub_(stub), stream_(std::move(stream)) {
  shardline::v1::StageFrame frame;
  *frame.mutable_hello() = hello;
  frame.set_credit(stream_->window_frames());
  hello_ = common::EncodeFrame(frame);
  context_.set_wait_for_ready(true);  // the upstream worker may start after us
}

void UpstreamExchangeCall::Start() {
  stub_->PrepareBidiStreamingCall(&context_, StageLinkService::kExchangeMethod, grpc::StubOptions(), this);
  StartWrite(&hello_);
  StartRead(&in_);
  AddHold();
  StartCall();
}

bool UpstreamExchangeCall::WaitEstablished(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto settled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return established_ || done_; };
  mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
  return established_;
}

bool UpstreamExchangeCall::done() {
  absl::MutexLock lock(&mu_);
  return done_;
}

absl::Status UpstreamExchangeCall::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

void UpstreamExchangeCall::Shutdown(absl::Duration grace) {
  if (grace > absl::ZeroDuration() && attached_) {
    // Orderly: the upstream side reads every frame we wrote before it sees
    // our half-close (a cancel would let it drop those not yet read, such as
    // the last step's norm total) and then ends the call itself.
    stream_->StopWriting();
    while (stream_->writing()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    absl::MutexLock lock(&mu_);
    // Until OnReadDone(!ok) (it takes mu_) our hold keeps the call alive, so
    // the operation may start; after it the call is ending anyway. OnDone
    // cannot run inside StartWritesDone while the hold stands.
    if (!ending_) StartWritesDone();
    mu_.AwaitWithTimeout(absl::Condition(&ending_), grace);
  }
  context_.TryCancel();
  while (stream_->writing()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ReleaseHold();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
}

void UpstreamExchangeCall::StartFrameWrite(const grpc::ByteBuffer* frame, bool more_follows) {
  StartWrite(frame, more_follows ? grpc::WriteOptions().set_buffer_hint() : grpc::WriteOptions());
}

void UpstreamExchangeCall::EndCall(const absl::Status& /*status*/) { context_.TryCancel(); }

void UpstreamExchangeCall::OnWriteDone(bool ok) {
  if (hello_written_) {
    stream_->FrameWritten(ok);
  } else {
    hello_written_ = true;
    if (ok) MaybeAttach(/*hello_done=*/true, /*ack_received=*/false);
  }
  if (release_after_write_ && !stream_->writing()) ReleaseHold();
}

void UpstreamExchangeCall::OnReadDone(bool ok) {
  if (!ok) {
    // The call is ending. Let it (OnDone brings the status) as soon as no
    // write of ours is in flight; none starts from now on.
    bool established = false;
    {
      absl::MutexLock lock(&mu_);
      ending_ = true;
      established = established_;
    }
    if (established) stream_->StopWriting();
    release_after_write_ = true;
    if (!established || !stream_->writing()) ReleaseHold();  // else OnWriteDone does
    return;
  }
  if (!acked_) {
    absl::StatusOr<common::DecodedFrame> ack = common::DecodeFrame(in_);
    if (!ack.ok() || !ack->header().has_hello() || ack->header().credit() == 0) {
      context_.TryCancel();
      return;
    }
    acked_ = true;
    peer_credit_ = ack->header().credit();
    MaybeAttach(/*hello_done=*/false, /*ack_received=*/true);
  } else if (absl::Status s = stream_->FrameReceived(in_); !s.ok()) {
    context_.TryCancel();
    return;
  }
  StartRead(&in_);
}

void UpstreamExchangeCall::OnDone(const grpc::Status& status) {
  absl::Status s = common::FromGrpcStatus(status);
  if (s.ok() || s.code() == absl::StatusCode::kCancelled) {
    s = absl::UnavailableError("the previous stage closed the link");
  } else {
    s = absl::Status(s.code(), absl::StrCat("previous stage: ", s.message()));
  }
  if (attached_) stream_->Detach(s);
  absl::MutexLock lock(&mu_);
  status_ = s;
  done_ = true;
}

void UpstreamExchangeCall::ReleaseHold() {
  if (!hold_released_.exchange(true)) RemoveHold();
}

void UpstreamExchangeCall::MaybeAttach(bool hello_done, bool ack_received) {
  {
    absl::MutexLock lock(&mu_);
    hello_done_ |= hello_done;
    ack_received_ |= ack_received;
    if (!hello_done_ || !ack_received_ || established_ || ending_) return;
    established_ = true;
  }
  attached_ = true;
  stream_->Attach(this, peer_credit_);
}

}  // namespace shardline::worker::transport
