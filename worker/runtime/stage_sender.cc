#include "worker/runtime/stage_sender.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace shardline::worker::runtime {

StageSender::StageSender(transport::StageLink& link, size_t max_queued)
    : link_(link), max_queued_(std::max<size_t>(1, max_queued)) {}

StageSender::~StageSender() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (error_.ok()) error_ = absl::CancelledError("the stage sender is shutting down");
  }
  if (thread_.joinable()) thread_.join();
}

absl::Status StageSender::Deliver(Pending& pending) {
  return pending.to == Direction::kNext ? link_.SendToNext(std::move(pending.message))
                                        : link_.SendToPrevious(std::move(pending.message));
}

void StageSender::Fail(const absl::Status& status) {
  if (!error_.ok()) return;
  LOG(ERROR) << "stage link send failed: " << status;
  error_ = status;
}

absl::Status StageSender::Send(Direction to, transport::StageMessage message, HostTransfer written) {
  Pending pending{to, std::move(message), std::move(written)};
  {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
    const bool now = queue_.empty() && !sending_ && pending.written.done();
    if (!now) {
      auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return queue_.size() < max_queued_ || !error_.ok();
      };
      mu_.Await(absl::Condition(&room));
      if (!error_.ok()) return error_;
      queue_.push_back(std::move(pending));
      if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
      return absl::OkStatus();
    }
    sending_ = true;
  }
  absl::Status status = pending.written.Wait();
  if (status.ok()) status = Deliver(pending);
  absl::MutexLock lock(&mu_);
  sending_ = false;
  if (!status.ok()) Fail(status);
  return status;
}

absl::Status StageSender::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return queue_.empty() && !sending_; };
  mu_.Await(absl::Condition(&idle));
  return error_;
}

void StageSender::Run() {
  while (true) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !queue_.empty() || stopping_; };
      mu_.Await(absl::Condition(&work));
      if (queue_.empty()) return;
      pending = std::move(queue_.front());
      queue_.pop_front();
      sending_ = true;
    }
    // The tensor's host memory is written until the transfer is done, even
    // when the message is only to be dropped.
    absl::Status status = pending.written.Wait();
    bool failed = false;
    {
      absl::MutexLock lock(&mu_);
      failed = !error_.ok();  // also set by the destructor
    }
    if (status.ok() && !failed) status = Deliver(pending);
    pending = Pending();
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!status.ok()) Fail(status);
  }
}

}  // namespace shardline::worker::runtime
