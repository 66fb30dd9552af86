#include "worker/transport/exchange_stream.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/tensor_coding.h"

namespace shardline::worker::transport {

// More credit than this in hand is a confused peer.
constexpr uint32_t kMaxCredit = 1u << 24;

absl::Status ExchangeStream::Send(std::shared_ptr<const StageMessage> message) {
  const size_t bytes = message->values.size() * sizeof(float);
  // Encoding only builds headers; the frames alias the message's values.
  std::vector<grpc::ByteBuffer> frames = EncodeStageMessage(std::move(message), options_.chunk_bytes, options_.codec);
  Write start;
  {
    absl::MutexLock lock(&mu_);
    // A full queue is waited on until half of it has drained, so that a
    // sender ahead of the wire wakes once per several messages, not each.
    const size_t resume_at = queued_messages_ < options_.max_waiting ? options_.max_waiting
                                                                      : (options_.max_waiting + 1) / 2;
    auto room = [this, resume_at]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return queued_messages_ < resume_at || !closed_.ok();
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&room), options_.timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("the neighbouring stage took nothing for ",
                                                      absl::FormatDuration(options_.timeout)));
    }
    if (!closed_.ok()) return closed_;
    for (size_t i = 0; i < frames.size(); ++i) {
      const bool last = i + 1 == frames.size();
      outbox_.push_back(Outgoing{std::move(frames[i]), last ? bytes : 0, last});
    }
    ++queued_messages_;
    Hold(bytes);
    start = NextWrite();
  }
  // Outside the lock: the reactor may answer on another thread at once.
  // While writing_ is set the reactor cannot finish, so the writer stays alive.
  start.Start();
  return absl::OkStatus();
}

ExchangeStream::Write ExchangeStream::NextWrite() {
  if (writing_ || stop_writes_ || writer_ == nullptr || !closed_.ok()) return {};
  if (grant_pending_ > 0) {
    shardline::v1::StageFrame grant;
    grant.set_credit(grant_pending_);
    grant_pending_ = 0;
    grant_frame_ = common::EncodeFrame(grant);
    writing_ = writing_grant_ = true;
    return {writer_, &grant_frame_, false};
  }
  if (outbox_.empty() || send_credit_ == 0) return {};
  --send_credit_;
  writing_ = true;
  // gRPC may hold a write back to coalesce it with the next only when that
  // next one is sure to follow at once: queued, with credit to go.
  // Such a frame goes marked followed, so that the receiver can time the
  // wire by the next one's arrival.
  const bool more = outbox_.size() > 1 && send_credit_ > 0;
  if (!more) return {writer_, &outbox_.front().frame, false};  // deque::push_back keeps references
  followed_frame_ = MarkFollowed(outbox_.front().frame);
  return {writer_, &followed_frame_, true};
}

void ExchangeStream::Write::Start() const {
  if (frame != nullptr) writer->StartFrameWrite(frame, more_follows);
}

void ExchangeStream::FrameWritten(bool ok) {
  Write next;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (writing_grant_) {
      writing_grant_ = false;
    } else if (!outbox_.empty()) {
      if (outbox_.front().ends_message && queued_messages_ > 0) {
        --queued_messages_;
        held_bytes_ -= std::min(held_bytes_, outbox_.front().message_bytes);
      }
      outbox_.pop_front();  // gRPC lets go of the payload when it is done with the bytes
      followed_frame_.Clear();
    }
    if (!ok) CloseLocked(absl::UnavailableError("the link to the neighbouring stage broke"));
    next = NextWrite();
  }
  next.Start();
}

bool ExchangeStream::StopWriting() {
  absl::MutexLock lock(&mu_);
  stop_writes_ = true;
  return writing_;
}

bool ExchangeStream::writing() {
  absl::MutexLock lock(&mu_);
  return writing_;
}

absl::StatusOr<StageMessage> ExchangeStream::Receive() {
  Write start;
  StageMessage message;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || !closed_.ok(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), options_.timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("no message from the neighbouring stage for ",
                                                      absl::FormatDuration(options_.timeout)));
    }
    if (inbox_.empty()) return closed_;
    message = std::move(inbox_.front());
    inbox_.pop_front();
    held_bytes_ -= std::min(held_bytes_, message.values.size() * sizeof(float));
    MaybeGrant();
    start = NextWrite();
  }
  start.Start();
  return message;
}

void ExchangeStream::MaybeGrant() {
  // Grants go out in batches of half the window (one small write per several
  // frames); the peer keeps the other half to go on with meanwhile.
  const uint32_t batch = std::max<uint32_t>(1, options_.window_frames / 2);
  if (owed_ < batch || inbox_.size() >= options_.max_waiting) return;
  grant_pending_ += owed_;
  peer_credit_ += owed_;
  owed_ = 0;
}

absl::Status ExchangeStream::AwaitConnected() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return writer_ != nullptr || !closed_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), options_.timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("the neighbouring stage did not connect within ",
                                                    absl::FormatDuration(options_.timeout)));
  }
  return closed_;
}

void ExchangeStream::Close(const std::string& reason) {
  Close(absl::UnavailableError(reason.empty() ? "link closed" : reason));
}

void ExchangeStream::Close(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  CloseLocked(status.ok() ? absl::UnavailableError("link closed") : status);
}

void ExchangeStream::CloseLocked(const absl::Status& status) {
  if (!closed_.ok()) return;
  closed_ = status;
  // Nothing queued will be written now: let the messages go.
  if (!writing_) outbox_.clear();
  queued_messages_ = 0;
}

void ExchangeStream::Abort(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    const absl::Status status = absl::UnavailableError(reason.empty() ? "link aborted" : reason);
    CloseLocked(status);
    if (abort_.ok()) abort_ = status;
  }
  EndCallIfAborted();
}

void ExchangeStream::EndCallIfAborted() {
  FrameWriter* writer = nullptr;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (abort_.ok() || writer_ == nullptr || call_ended_) return;
    call_ended_ = true;
    writer = writer_;
    status = abort_;
    ++writer_calls_;
  }
  writer->EndCall(status);
  absl::MutexLock lock(&mu_);
  --writer_calls_;
}

bool ExchangeStream::AwaitSent(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto sent = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_.ok() || (outbox_.empty() && !writing_); };
  return mu_.AwaitWithTimeout(absl::Condition(&sent), timeout);
}

bool ExchangeStream::closed() {
  absl::MutexLock lock(&mu_);
  return !closed_.ok();
}

void ExchangeStream::Hold(size_t bytes) {
  held_bytes_ += bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
}

size_t ExchangeStream::peak_held_bytes() {
  absl::MutexLock lock(&mu_);
  return peak_held_bytes_;
}

size_t ExchangeStream::peak_waiting_received() {
  absl::MutexLock lock(&mu_);
  return peak_inbox_;
}

void ExchangeStream::Attach(FrameWriter* writer, uint32_t peer_credit) {
  Write start;
  {
    absl::MutexLock lock(&mu_);
    writer_ = writer;
    send_credit_ = std::min(peer_credit, kMaxCredit);
    start = NextWrite();
  }
  start.Start();
  EndCallIfAborted();  // aborted before the peer connected
}

void ExchangeStream::Detach(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  // The reactor is going away: let an EndCall still running on it return.
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return writer_calls_ == 0; };
  mu_.Await(absl::Condition(&idle));
  writer_ = nullptr;
  CloseLocked(status.ok() ? absl::UnavailableError("link ended") : status);
  outbox_.clear();
  followed_frame_.Clear();
}

absl::Status ExchangeStream::FrameReceived(const grpc::ByteBuffer& bytes) {
  absl::StatusOr<common::DecodedFrame> frame = common::DecodeFrame(bytes);
  absl::Status status = frame.status();
  const shardline::v1::StageFrame* header = frame.ok() ? &frame->header() : nullptr;
  if (status.ok() && header->has_hello()) {
    status = absl::InvalidArgumentError("malformed stage frame: hello after the stream started");
  }
  const bool grant_only = status.ok() && header->kind() == shardline::v1::StageFrame::KIND_UNSPECIFIED &&
                          frame->payload_bytes() == 0;
  // 1. Credit: take the peer's grant, charge its data frame against ours.
  Write start;
  {
    absl::MutexLock lock(&mu_);
    if (status.ok() && send_credit_ + uint64_t{header->credit()} > kMaxCredit) {
      status = absl::InvalidArgumentError("the neighbouring stage granted more credit than it may");
    }
    if (status.ok() && !grant_only && peer_credit_ == 0) {
      status = absl::ResourceExhaustedError("the neighbouring stage sent a frame it had no credit for");
    }
    if (!status.ok()) {
      CloseLocked(status);
      return status;
    }
    send_credit_ += header->credit();
    if (!grant_only) {
      --peer_credit_;
      ++owed_;
    }
    start = NextWrite();  // a grant may let a data frame go
  }
  start.Start();
  if (grant_only) return absl::OkStatus();

  // 2. Data: copy it into its message (no lock held: only this reactor assembles).
  bytes_received_.fetch_add(frame->payload_bytes(), std::memory_order_relaxed);
  Pace(header->followed(), frame->payload_bytes());
  absl::StatusOr<std::optional<StageMessage>> message = assembler_.Add(*frame);
  {
    absl::MutexLock lock(&mu_);
    if (!message.ok()) {
      CloseLocked(message.status());
      return message.status();
    }
    if (message->has_value()) {
      Hold((*message)->values.size() * sizeof(float));
      inbox_.push_back(std::move(**message));
      peak_inbox_ = std::max(peak_inbox_, inbox_.size());
    }
    MaybeGrant();
    start = NextWrite();
  }
  start.Start();
  return absl::OkStatus();
}

void ExchangeStream::Pace(bool followed, size_t payload_bytes) {
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  if (last_followed_ && now > last_arrival_nanos_) {
    paced_bytes_.fetch_add(payload_bytes, std::memory_order_relaxed);
    paced_nanos_.fetch_add(static_cast<uint64_t>(now - last_arrival_nanos_), std::memory_order_relaxed);
  }
  last_arrival_nanos_ = now;
  last_followed_ = followed;
}

}  // namespace shardline::worker::transport
