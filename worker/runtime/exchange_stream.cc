#include "worker/runtime/exchange_stream.h"

#include "absl/strings/str_cat.h"

namespace shardline::worker::runtime {

absl::Status ExchangeStream::Send(const StageMessage& message) {
  std::vector<shardline::v1::StageFrame> frames = EncodeStageMessage(message, chunk_bytes_, wire_);
  const shardline::v1::StageFrame* start = nullptr;
  FrameWriter* writer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    for (auto& f : frames) outbox_.push_back(std::move(f));
    start = NextWrite();
    writer = writer_;
  }
  // Outside the lock: the reactor may answer on another thread at once.
  // While writing_ is set the reactor cannot finish, so `writer` stays alive.
  if (start != nullptr) writer->StartFrameWrite(start);
  return absl::OkStatus();
}

const shardline::v1::StageFrame* ExchangeStream::NextWrite() {
  if (writing_ || stop_writes_ || writer_ == nullptr || outbox_.empty() || !closed_.ok()) {
    return nullptr;
  }
  writing_ = true;
  return &outbox_.front();  // deque::push_back keeps references to existing elements
}

void ExchangeStream::FrameWritten(bool ok) {
  const shardline::v1::StageFrame* next = nullptr;
  FrameWriter* writer = nullptr;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!outbox_.empty()) outbox_.pop_front();
    if (!ok && closed_.ok()) closed_ = absl::UnavailableError("the link to the neighbouring stage broke");
    next = NextWrite();
    writer = writer_;
  }
  if (next != nullptr) writer->StartFrameWrite(next);
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
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !inbox_.empty() || !closed_.ok(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) {
    return absl::DeadlineExceededError(absl::StrCat("no message from the neighbouring stage for ",
                                                    absl::FormatDuration(timeout_)));
  }
  if (inbox_.empty()) return closed_;
  StageMessage message = std::move(inbox_.front());
  inbox_.pop_front();
  return message;
}

absl::Status ExchangeStream::AwaitConnected() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return writer_ != nullptr || !closed_.ok();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) {
    return absl::DeadlineExceededError(absl::StrCat("the neighbouring stage did not connect within ",
                                                    absl::FormatDuration(timeout_)));
  }
  if (!closed_.ok()) return closed_;
  return absl::OkStatus();
}

void ExchangeStream::Close(const std::string& reason) {
  Close(absl::UnavailableError(reason.empty() ? "link closed" : reason));
}

void ExchangeStream::Close(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (closed_.ok()) closed_ = status.ok() ? absl::UnavailableError("link closed") : status;
}

bool ExchangeStream::closed() {
  absl::MutexLock lock(&mu_);
  return !closed_.ok();
}

void ExchangeStream::Attach(FrameWriter* writer) {
  const shardline::v1::StageFrame* start = nullptr;
  {
    absl::MutexLock lock(&mu_);
    writer_ = writer;
    start = NextWrite();
  }
  if (start != nullptr) writer->StartFrameWrite(start);
}

void ExchangeStream::Detach(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  writer_ = nullptr;
  if (closed_.ok()) closed_ = status.ok() ? absl::UnavailableError("link ended") : status;
}

absl::Status ExchangeStream::FrameReceived(const shardline::v1::StageFrame& frame) {
  bytes_received_.fetch_add(frame.payload().size(), std::memory_order_relaxed);
  absl::StatusOr<std::optional<StageMessage>> message = assembler_.Add(frame);
  absl::MutexLock lock(&mu_);
  if (!message.ok()) {
    if (closed_.ok()) closed_ = message.status();
    return message.status();
  }
  if (!message->has_value()) return absl::OkStatus();
  if (inbox_.size() >= kMaxInbox) {
    if (closed_.ok()) {
      closed_ = absl::ResourceExhaustedError("the neighbouring stage sent more than it may have in flight");
    }
    return closed_;
  }
  inbox_.push_back(std::move(**message));
  return absl::OkStatus();
}

}  // namespace shardline::worker::runtime
