#include "worker/transport/local_stage_link.h"

#include "absl/strings/str_cat.h"

namespace shardline::worker::transport {
namespace {

absl::Status NoNeighbour(absl::string_view side) {
  return absl::FailedPreconditionError(absl::StrCat("this stage has no ", side, " stage"));
}

}  // namespace

std::string DescribeMessage(const StageMessage& m) {
  switch (m.kind) {
    case StageMessage::Kind::kActivation:
      if (m.step < 0) return absl::StrCat("activation of batch ", m.micro_batch, " of the validation after step ", -m.step);
      return absl::StrCat("activation of step ", m.step, " micro-batch ", m.micro_batch);
    case StageMessage::Kind::kGradient:
      return absl::StrCat("gradient of step ", m.step, " micro-batch ", m.micro_batch);
    case StageMessage::Kind::kNormPartial:
      return absl::StrCat("norm partial of step ", m.step);
    case StageMessage::Kind::kNormTotal:
      return absl::StrCat("norm total of step ", m.step);
    case StageMessage::Kind::kCollective:
      return absl::StrCat(m.micro_batch < 0 ? "whole buffer" : absl::StrCat("chunk ", m.micro_batch), " of ",
                          m.values.size(), " floats in collective call ", m.sequence);
  }
  return "message";
}

absl::Status LocalChannel::Push(StageMessage message) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !closed_.empty() || queue_.size() < capacity_;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the neighbouring stage took no message for ", absl::FormatDuration(timeout_)));
  }
  if (!closed_.empty()) return absl::UnavailableError(closed_);
  queue_.push_back(std::move(message));
  return absl::OkStatus();
}

absl::StatusOr<StageMessage> LocalChannel::Pop() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !closed_.empty() || !queue_.empty();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) {
    return absl::DeadlineExceededError(
        absl::StrCat("no message from the neighbouring stage for ", absl::FormatDuration(timeout_)));
  }
  if (!closed_.empty()) return absl::UnavailableError(closed_);
  StageMessage message = std::move(queue_.front());
  queue_.pop_front();
  return message;
}

void LocalChannel::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (closed_.empty()) closed_ = reason.empty() ? "link closed" : reason;
}

absl::Status LocalStageLink::SendToNext(StageMessage message) {
  if (to_next_ == nullptr) return NoNeighbour("next");
  return to_next_->Push(std::move(message));
}

absl::StatusOr<StageMessage> LocalStageLink::ReceiveFromPrevious() {
  if (from_previous_ == nullptr) return NoNeighbour("previous");
  return from_previous_->Pop();
}

absl::Status LocalStageLink::SendToPrevious(StageMessage message) {
  if (to_previous_ == nullptr) return NoNeighbour("previous");
  return to_previous_->Push(std::move(message));
}

absl::StatusOr<StageMessage> LocalStageLink::ReceiveFromNext() {
  if (from_next_ == nullptr) return NoNeighbour("next");
  return from_next_->Pop();
}

void LocalStageLink::Close(const std::string& reason) {
  for (LocalChannel* channel : {to_next_, from_next_, to_previous_, from_previous_}) {
    if (channel != nullptr) channel->Close(reason);
  }
}

void LocalPipelineLinks::CloseAll(const std::string& reason) {
  for (auto& channel : channels) channel->Close(reason);
}

LocalPipelineLinks CreateLocalStageLinks(int stages, size_t capacity, absl::Duration timeout) {
  LocalPipelineLinks out;
  // Between stage s and s+1: forward[s] carries s → s+1, backward[s] s+1 → s.
  std::vector<LocalChannel*> forward, backward;
  for (int s = 0; s + 1 < stages; ++s) {
    out.channels.push_back(std::make_unique<LocalChannel>(capacity, timeout));
    forward.push_back(out.channels.back().get());
    out.channels.push_back(std::make_unique<LocalChannel>(capacity, timeout));
    backward.push_back(out.channels.back().get());
  }
  for (int s = 0; s < stages; ++s) {
    const bool last = s + 1 == stages, first = s == 0;
    out.links.push_back(std::make_unique<LocalStageLink>(
        last ? nullptr : forward[s], last ? nullptr : backward[s],
        first ? nullptr : backward[s - 1], first ? nullptr : forward[s - 1]));
  }
  return out;
}

}  // namespace shardline::worker::transport
