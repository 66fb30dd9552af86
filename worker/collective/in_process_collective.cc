#include "worker/collective/in_process_collective.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/collective/call_buffer.h"

namespace shardline::worker::collective {

// One rank's handle: copies its buffer to the host, meets the others, and
// copies its part of the result back.
class InProcessCollective final : public Collective {
 public:
  InProcessCollective(InProcessGroup& group, int rank, Backend& backend)
      : group_(group), rank_(rank), backend_(backend) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size_; }

  absl::Status AllReduceSum(DeviceSpan<float> data) override {
    return Run(InProcessGroup::Op::kAllReduceSum, OnDevice(data), 0);
  }
  absl::Status ReduceScatterSum(DeviceSpan<float> data) override {
    return Run(InProcessGroup::Op::kReduceScatterSum, OnDevice(data), 0);
  }
  absl::Status AllGather(DeviceSpan<float> data) override {
    return Run(InProcessGroup::Op::kAllGather, OnDevice(data), 0);
  }
  absl::Status Broadcast(DeviceSpan<float> data, int root) override {
    if (root < 0 || root >= size()) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of a group of ", size()));
    }
    return Run(InProcessGroup::Op::kBroadcast, OnDevice(data), root);
  }
  absl::Status AllReduceSumHost(absl::Span<float> data) override {
    return Run(InProcessGroup::Op::kAllReduceSum, CallBuffer::OnHost(data), 0);
  }
  absl::Status ReduceScatterSumHost(absl::Span<float> data) override {
    return Run(InProcessGroup::Op::kReduceScatterSum, CallBuffer::OnHost(data), 0);
  }
  absl::Status AllGatherHost(absl::Span<float> data) override {
    return Run(InProcessGroup::Op::kAllGather, CallBuffer::OnHost(data), 0);
  }
  absl::Status AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override {
    return Run(InProcessGroup::Op::kAllReduceSum, CallBuffer::OnHost(data), 0, held);
  }
  absl::Status ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override {
    return Run(InProcessGroup::Op::kReduceScatterSum, CallBuffer::OnHost(data), 0, held);
  }
  void Close(const std::string& reason) override { group_.Close(reason); }

 private:
  CallBuffer OnDevice(DeviceSpan<float> data) { return CallBuffer::OnDevice(backend_, data); }
  // `held`: the rank's parts before `data` (AllReduceSumHostParts).
  absl::Status Run(InProcessGroup::Op op, const CallBuffer& data, int root,
                   absl::Span<const float* const> held = {});

  InProcessGroup& group_;
  const int rank_;
  Backend& backend_;
  uint64_t next_sequence_ = 0;
};

absl::Status InProcessCollective::Run(InProcessGroup::Op op, const CallBuffer& data, int root,
                                     absl::Span<const float* const> held) {
  const uint64_t sequence = next_sequence_++;
  const size_t n = data.size();
  // The held parts, then the buffer, end to end.
  auto values = std::make_shared<std::vector<float>>(n * (held.size() + 1));
  for (size_t h = 0; h < held.size(); ++h) std::copy(held[h], held[h] + n, values->begin() + h * n);
  RETURN_IF_ERROR(data.Read(0, absl::Span<float>(values->data() + held.size() * n, n)));
  InProcessGroup::Contribution mine;
  mine.op = op;
  mine.elements = data.size();
  mine.root = root;
  mine.parts = static_cast<int>(held.size()) + 1;
  mine.values = values;
  ASSIGN_OR_RETURN(const std::vector<InProcessGroup::Contribution> all, group_.Meet(rank_, sequence, mine));
  const int d = size();
  // Not written into `values`: the other ranks may still be reading it.
  std::vector<float> result(data.size());
  // Writes chunk c of `result` back.
  auto write_chunk = [&](const Chunk& c) {
    return data.Write(c.begin, absl::Span<const float>(result.data() + c.begin, c.size()));
  };
  absl::Status status;
  switch (op) {
    case InProcessGroup::Op::kAllReduceSum:
    case InProcessGroup::Op::kReduceScatterSum: {
      std::vector<const float*> parts;  // in (rank, part) order
      for (const auto& c : all) {
        for (int h = 0; h < c.parts; ++h) parts.push_back(c.values->data() + static_cast<size_t>(h) * n);
      }
      const Chunk whole{0, data.size()};
      const Chunk own = op == InProcessGroup::Op::kAllReduceSum ? whole : ChunkOf(data.size(), d, rank_);
      std::vector<float> sum(own.size());
      for (const float*& p : parts) p += own.begin;
      AddInRankOrder(parts, absl::Span<float>(sum));
      std::copy(sum.begin(), sum.end(), result.begin() + static_cast<std::ptrdiff_t>(own.begin));
      status = write_chunk(own);
      break;
    }
    case InProcessGroup::Op::kAllGather:
      for (int r = 0; r < d; ++r) {
        const Chunk c = ChunkOf(data.size(), d, r);
        std::copy(all[r].values->begin() + static_cast<std::ptrdiff_t>(c.begin),
                  all[r].values->begin() + static_cast<std::ptrdiff_t>(c.end),
                  result.begin() + static_cast<std::ptrdiff_t>(c.begin));
      }
      status = write_chunk({0, data.size()});
      break;
    case InProcessGroup::Op::kBroadcast:
      result = *all[root].values;
      status = write_chunk({0, data.size()});
      break;
  }
  group_.Done(sequence);
  return status;
}

absl::StatusOr<std::unique_ptr<InProcessGroup>> InProcessGroup::Create(int ranks, absl::Duration timeout) {
  if (ranks < 1) return absl::InvalidArgumentError(absl::StrCat("a group of ", ranks, " ranks"));
  if (timeout <= absl::ZeroDuration()) return absl::InvalidArgumentError("a collective needs a positive timeout");
  return std::unique_ptr<InProcessGroup>(new InProcessGroup(ranks, timeout));
}

std::unique_ptr<Collective> InProcessGroup::Rank(int rank, Backend& backend) {
  return std::make_unique<InProcessCollective>(*this, rank, backend);
}

const char* InProcessGroup::OpName(Op op) {
  switch (op) {
    case Op::kAllReduceSum:
      return "AllReduceSum";
    case Op::kReduceScatterSum:
      return "ReduceScatterSum";
    case Op::kAllGather:
      return "AllGather";
    case Op::kBroadcast:
      return "Broadcast";
  }
  return "?";
}

absl::StatusOr<std::vector<InProcessGroup::Contribution>> InProcessGroup::Meet(int rank, uint64_t sequence,
                                                                               Contribution mine) {
  absl::MutexLock lock(&mu_);
  if (!closed_.empty()) return absl::UnavailableError(closed_);
  if (sequence < base_) return absl::InternalError(absl::StrCat("collective call ", sequence, " is already over"));
  while (calls_.size() <= sequence - base_) {
    calls_.emplace_back();
    calls_.back().ranks.resize(static_cast<size_t>(size_));
  }
  Call& call = calls_[sequence - base_];
  call.ranks[static_cast<size_t>(rank)] = std::move(mine);
  ++call.arrived;
  auto ready = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return call.arrived == size_ || !call.failure.ok() || !closed_.empty();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout_)) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (call.ranks[static_cast<size_t>(r)].values == nullptr) missing.push_back(r);
    }
    call.failure = absl::DeadlineExceededError(absl::StrCat("collective call ", sequence, ": rank(s) ",
                                                            absl::StrJoin(missing, ", "), " did not join within ",
                                                            absl::FormatDuration(timeout_)));
  }
  if (call.failure.ok() && call.arrived == size_) {
    const Contribution& first = call.ranks[0];
    for (int r = 1; r < size_ && call.failure.ok(); ++r) {
      const Contribution& other = call.ranks[static_cast<size_t>(r)];
      if (other.op != first.op || other.elements != first.elements || other.root != first.root ||
          other.parts != first.parts) {
        call.failure = absl::FailedPreconditionError(absl::StrCat(
            "collective call ", sequence, " does not match: rank 0 called ", OpName(first.op), " of ",
            first.parts, " × ", first.elements, " floats (root ", first.root, "), rank ", r, " ",
            OpName(other.op), " of ", other.parts, " × ", other.elements, " floats (root ", other.root, ")"));
      }
    }
  }
  if (!call.failure.ok()) {
    // The ranks are out of step: every later call fails at once too.
    if (closed_.empty()) closed_ = std::string(call.failure.message());
    return call.failure;
  }
  if (call.arrived < size_) return absl::UnavailableError(closed_);
  return call.ranks;
}

void InProcessGroup::Done(uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  if (sequence < base_) return;
  ++calls_[sequence - base_].read;
  while (!calls_.empty() && calls_.front().read == size_) {
    calls_.pop_front();
    ++base_;
  }
}

void InProcessGroup::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  if (closed_.empty()) closed_ = reason.empty() ? "the collective group was closed" : reason;
}

}  // namespace shardline::worker::collective
