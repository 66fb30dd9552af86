#include "worker/collective/grpc_collective.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/int8_blocks.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/collective/error_feedback.h"

namespace shardline::worker::collective {
namespace {

using transport::StageMessage;

constexpr int kWholeBuffer = -1;  // the chunk of a broadcast
constexpr int kEveryChunk = -2;   // the chunk of a one-round all-reduce: all of them

// `message`'s values as the 8-bit blocks it will carry decode, with
// feedback through `residual`.
void Quantize(StageMessage& message, absl::Span<float> residual) {
  message.int8_blocks.resize(common::Int8BlocksBytes(message.values.size()));
  QuantizeWithFeedback(message.values.span(), residual, absl::MakeSpan(message.int8_blocks));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcCollective>> GrpcCollective::Create(Backend& backend,
                                                                        GrpcCollectiveOptions options) {
  const int d = static_cast<int>(options.peer_addresses.size());
  if (d < 1 || options.rank < 0 || options.rank >= d) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", options.rank, " of a group of ", d));
  }
  if (options.group.empty()) return absl::InvalidArgumentError("a collective group needs a name");
  if (options.rank + 1 < d && options.service == nullptr) {
    return absl::InvalidArgumentError("a rank with higher ranks needs this worker's StageLink service");
  }
  for (int q = 0; q < options.rank; ++q) {
    if (options.peer_addresses[q].empty()) return absl::InvalidArgumentError(absl::StrCat("no address for rank ", q));
  }
  if (options.exchange.window_frames < 1 || options.exchange.max_waiting < 1) {
    return absl::InvalidArgumentError("a collective needs a window of at least one frame and one waiting message");
  }
  std::unique_ptr<GrpcCollective> c(new GrpcCollective(backend, std::move(options)));
  const GrpcCollectiveOptions& o = c->options_;
  const size_t slot = o.staging_slot_bytes;
  if (slot > 0 && d > 1) {
    // Sending: a reduce-scatter's d − 1 chunks, the sum an all-gather sends,
    // each held until written (and as many of the call before); receiving: a
    // few per peer (the credit window bounds what is in flight; the rest lands on the heap).
    ASSIGN_OR_RETURN(c->send_pool_, transport::StagingPool::Create(slot, 2 * d, o.staging_memory));
  }
  c->streams_.resize(static_cast<size_t>(d));
  c->connectors_.resize(static_cast<size_t>(d));
  c->receive_pools_.resize(static_cast<size_t>(d));
  for (int q = 0; q < d; ++q) {
    if (q == o.rank) continue;
    transport::ExchangeOptions exchange = o.exchange;
    if (slot > 0) {
      ASSIGN_OR_RETURN(c->receive_pools_[q], transport::StagingPool::Create(slot, 3, o.staging_memory));
      exchange.receive_pool = c->receive_pools_[q];
    }
    if (q > o.rank) {
      c->streams_[q] = o.service->ExpectPeer(o.job_id, o.plan_epoch, o.group, o.rank, q, exchange);
      continue;
    }
    c->streams_[q] = std::make_shared<transport::ExchangeStream>(exchange);
    shardline::v1::StageHello hello;
    hello.set_job_id(o.job_id);
    hello.set_plan_epoch(o.plan_epoch);
    hello.set_group(o.group);
    hello.set_rank(o.rank);
    hello.set_to_rank(q);
    hello.set_link_token(exchange.link_token);
    c->connectors_[q] =
        std::make_unique<transport::UpstreamConnector>(o.peer_addresses[q], hello, c->streams_[q], exchange.timeout,
                                                       exchange.channel_credentials);
  }
  return c;
}

GrpcCollective::~GrpcCollective() {
  if (!left_) Close("this rank left its collective group");
  connectors_.clear();
  for (int q = rank() + 1; q < size(); ++q) options_.service->ForgetPeer(options_.job_id, options_.group, rank(), q);
}

void GrpcCollective::Close(const std::string& reason) {
  // Ends the calls too: the peers' waits fail now, not at their timeout.
  for (const auto& stream : streams_) {
    if (stream != nullptr) stream->Abort(reason);
  }
}

void GrpcCollective::Leave(absl::Duration drain) {
  if (left_) return;
  left_ = true;
  bool failed = false;
  {
    absl::MutexLock lock(&mu_);
    failed = !failed_.ok();
    if (!failed) failed_ = absl::UnavailableError(absl::StrCat(Describe(), " has left its group"));
  }
  if (failed) return Close(absl::StrCat(Describe(), " left its group after a failure"));
  drain = std::min(drain, options_.exchange.timeout);
  for (const auto& stream : streams_) {
    if (stream != nullptr) (void)stream->AwaitSent(drain);
  }
  // Close, not Abort: a served stream's call stays up until the peer that
  // dialled it half-closes (having read our frames); a dialled one
  // half-closes when its connector goes (UpstreamExchangeCall::Shutdown).
  for (const auto& stream : streams_) {
    if (stream != nullptr) stream->Close(absl::StrCat("rank ", rank(), " left group '", options_.group, "'"));
  }
  connectors_.clear();
}

transport::WirePace GrpcCollective::PaceFrom(int peer) {
  if (peer < 0 || peer >= static_cast<int>(streams_.size()) || streams_[peer] == nullptr) return {};
  return streams_[peer]->wire_pace();
}

uint64_t GrpcCollective::BytesReceived() {
  uint64_t bytes = 0;
  for (const auto& stream : streams_) {
    if (stream != nullptr) bytes += stream->bytes_received();
  }
  return bytes;
}

std::string GrpcCollective::Describe() const {
  return absl::StrCat("rank ", rank(), " of group '", options_.group, "'");
}

template <typename Fn>
absl::Status GrpcCollective::Run(Fn&& call) {
  {
    absl::MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
  }
  absl::Status status = call();
  if (!status.ok()) {
    {
      absl::MutexLock lock(&mu_);
      if (failed_.ok()) failed_ = status;
    }
    // The peers are waiting for us, or we for them: end it for everyone.
    Close(absl::StrCat(Describe(), " failed: ", status.message()));
  }
  return status;
}

absl::StatusOr<std::shared_ptr<const StageMessage>> GrpcCollective::Outgoing(uint64_t sequence, int chunk,
                                                                             const CallBuffer& data, Chunk range,
                                                                             Residual residual) {
  std::shared_ptr<StageMessage> message = NewMessage(sequence, chunk, range.size());
  RETURN_IF_ERROR(data.Read(range.begin, message->values.span()));
  if (residual.has_value()) Quantize(*message, residual->subspan(range.begin, range.size()));
  return std::shared_ptr<const StageMessage>(std::move(message));
}

std::shared_ptr<const StageMessage> GrpcCollective::HeldPart(uint64_t sequence, int chunk, const float* part,
                                                             Chunk range) {
  std::shared_ptr<StageMessage> message = NewMessage(sequence, chunk, range.size());
  std::copy(part + range.begin, part + range.end, message->values.begin());
  return message;
}

std::shared_ptr<StageMessage> GrpcCollective::NewMessage(uint64_t sequence, int chunk, size_t elements) {
  auto message = std::make_shared<StageMessage>();
  message->kind = StageMessage::Kind::kCollective;
  message->sequence = sequence;
  message->micro_batch = chunk;
  message->values = HostChunk(elements);
  return message;
}

absl::Status GrpcCollective::Send(int peer, std::shared_ptr<const StageMessage> message) {
  const absl::Status status = streams_[peer]->Send(std::move(message));
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(Describe(), " sending to rank ", peer, " (",
                                                  options_.peer_addresses[peer], "): ", status.message()));
}

absl::StatusOr<StageMessage> GrpcCollective::Expect(int peer, uint64_t sequence, int chunk, size_t elements) {
  absl::StatusOr<StageMessage> m = streams_[peer]->Receive();
  auto want = [&] {
    const std::string what = chunk == kWholeBuffer  ? std::string("the whole buffer")
                             : chunk == kEveryChunk ? std::string("the whole buffer to sum")
                                                    : absl::StrCat("chunk ", chunk);
    return absl::StrCat(what, " (", elements, " floats) of call ", sequence);
  };
  if (!m.ok()) {
    return absl::Status(m.status().code(), absl::StrCat(Describe(), " waiting for ", want(), " from rank ", peer,
                                                        " (", options_.peer_addresses[peer], "): ",
                                                        m.status().message()));
  }
  if (m->kind != StageMessage::Kind::kCollective || m->dtype != common::DType::kF32 || m->sequence != sequence ||
      m->micro_batch != chunk || m->values.size() != elements) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(), " expected ", want(), " from rank ", peer, ", got ",
        m->kind == StageMessage::Kind::kCollective ? transport::DescribeMessage(*m) : "a stage-link message",
        m->dtype != common::DType::kF32 ? absl::StrCat(" in ", common::DTypeName(m->dtype)) : "",
        m->sequence < sequence ? " (stale)" : m->sequence > sequence ? " (out of order)" : ""));
  }
  return m;
}

transport::HostBuffer GrpcCollective::HostChunk(size_t elements) {
  if (send_pool_ != nullptr && elements * sizeof(float) <= send_pool_->slot_bytes()) {
    if (std::optional<transport::StagingSlot> slot = send_pool_->TryAcquire()) {
      return transport::HostBuffer(std::move(*slot), elements);
    }
  }
  return transport::HostBuffer(std::vector<float>(elements));
}

absl::StatusOr<transport::HostBuffer> GrpcCollective::ReduceScatter(const CallBuffer& data, Held held,
                                                                    uint64_t sequence, Residual residual, bool whole) {
  const int d = size(), r = rank();
  const size_t parts = held.size() + 1;  // every rank's
  const Chunk own = whole ? Chunk{0, data.size()} : ChunkOf(data.size(), d, r);
  const int own_id = whole ? kEveryChunk : r;
  const float* mine = data.host_data() != nullptr ? data.host_data() + own.begin : nullptr;
  std::shared_ptr<const StageMessage> sent;  // ours, whole
  if (whole) {
    // Each part whole, one message for every other rank, nearest ranks
    // after ours first.
    for (const float* part : held) {
      const std::shared_ptr<const StageMessage> message = HeldPart(sequence, kEveryChunk, part, own);
      for (int i = 1; i < d; ++i) RETURN_IF_ERROR(Send((r + i) % d, message));
    }
    ASSIGN_OR_RETURN(sent, Outgoing(sequence, kEveryChunk, data, own, residual));
    for (int i = 1; i < d; ++i) RETURN_IF_ERROR(Send((r + i) % d, sent));
    if (mine == nullptr) mine = sent->values.data();  // read from the device once
  } else {
    // Every other rank's chunk to it (of each part, in order), nearest ranks
    // after ours first.
    for (int i = 1; i < d; ++i) {
      const int q = (r + i) % d;
      const Chunk chunk = ChunkOf(data.size(), d, q);
      for (const float* part : held) RETURN_IF_ERROR(Send(q, HeldPart(sequence, q, part, chunk)));
      ASSIGN_OR_RETURN(auto message, Outgoing(sequence, q, data, chunk, residual));
      RETURN_IF_ERROR(Send(q, std::move(message)));
    }
  }
  // Our chunk (in one round, the whole buffer): the d · parts parts added
  // in (rank, part) order (ours where they fall), as they come; one
  // received part held at a time. Our own parts are read in place from host
  // memory (`data` copied once from a device), and rank 0's first part,
  // when received, becomes the running sum as it is.
  if (mine == nullptr) {
    own_.resize(own.size());
    RETURN_IF_ERROR(data.Read(own.begin, absl::Span<float>(own_)));
    mine = own_.data();
  }
  transport::HostBuffer sum;
  for (int q = 0; q < d; ++q) {
    for (size_t h = 0; h < parts; ++h) {
      StageMessage received;
      const float* part = h + 1 < parts ? held[h] + own.begin : mine;
      if (q != r) {
        ASSIGN_OR_RETURN(received, Expect(q, sequence, own_id, own.size()));
        part = received.values.data();
      }
      // AddInRankOrder, one part at a time: ((x₀ + x₁) + x₂) + …
      if (q == 0 && h == 0 && q != r) {
        sum = std::move(received.values);
      } else if (q == 0 && h == 0) {
        sum = HostChunk(own.size());
        std::copy(part, part + own.size(), sum.begin());
      } else {
        for (size_t i = 0; i < own.size(); ++i) sum[i] += part[i];
      }
    }
  }
  RETURN_IF_ERROR(data.Write(own.begin, absl::Span<const float>(sum)));
  return sum;
}

absl::Status GrpcCollective::Gather(const CallBuffer& data, uint64_t sequence,
                                    std::shared_ptr<const StageMessage> mine) {
  const int d = size(), r = rank();
  for (int i = 1; i < d; ++i) RETURN_IF_ERROR(Send((r + i) % d, mine));
  for (int q = 0; q < d; ++q) {
    if (q == r) continue;
    const Chunk c = ChunkOf(data.size(), d, q);
    ASSIGN_OR_RETURN(StageMessage theirs, Expect(q, sequence, q, c.size()));
    RETURN_IF_ERROR(data.Write(c.begin, absl::Span<const float>(theirs.values)));
  }
  return absl::OkStatus();
}

absl::Status GrpcCollective::ReduceScatterSum(DeviceSpan<float> data) { return ReduceScatterOnly(OnDevice(data)); }

absl::Status GrpcCollective::AllGather(DeviceSpan<float> data) { return AllGatherOnly(OnDevice(data)); }

absl::Status GrpcCollective::AllReduceSum(DeviceSpan<float> data) { return AllReduce(OnDevice(data)); }

absl::Status GrpcCollective::ReduceScatterOnly(const CallBuffer& data, Residual residual, Held held) {
  return Run([&]() -> absl::Status {
    const uint64_t sequence = next_sequence_++;
    if (size() == 1) return absl::OkStatus();
    return ReduceScatter(data, held, sequence, residual).status();
  });
}

absl::Status GrpcCollective::AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) {
  if (size() == 1) return Collective::AllReduceSumHostParts(data, held);
  RETURN_IF_ERROR(CheckParts(held.size() + 1));
  return AllReduce(CallBuffer::OnHost(data), std::nullopt, held);
}

absl::Status GrpcCollective::ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) {
  if (size() == 1) return Collective::ReduceScatterSumHostParts(data, held);
  RETURN_IF_ERROR(CheckParts(held.size() + 1));
  return ReduceScatterOnly(CallBuffer::OnHost(data), std::nullopt, held);
}

absl::Status GrpcCollective::CheckParts(size_t parts) const {
  // Every rank sends all its parts before it receives: the streams' queues
  // must hold them.
  if (parts > static_cast<size_t>(common::kMaxReplicaGroups) || parts > options_.exchange.max_waiting) {
    return absl::InvalidArgumentError(absl::StrCat(parts, " parts a rank; at most ", common::kMaxReplicaGroups,
                                                   " and the streams' max_waiting (", options_.exchange.max_waiting,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status GrpcCollective::ReduceScatterSumHostInt8(absl::Span<float> data, absl::Span<float> residual) {
  RETURN_IF_ERROR(CheckResidual(data.size(), residual.size()));
  return ReduceScatterOnly(CallBuffer::OnHost(data), residual);
}

absl::Status GrpcCollective::AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual) {
  RETURN_IF_ERROR(CheckResidual(data.size(), residual.size()));
  return AllReduce(CallBuffer::OnHost(data), residual);
}

absl::Status GrpcCollective::AllGatherOnly(const CallBuffer& data) {
  return Run([&]() -> absl::Status {
    const uint64_t sequence = next_sequence_++;
    if (size() == 1) return absl::OkStatus();
    ASSIGN_OR_RETURN(auto mine, Outgoing(sequence, rank(), data, ChunkOf(data.size(), size(), rank())));
    return Gather(data, sequence, std::move(mine));
  });
}

absl::Status GrpcCollective::AllReduce(const CallBuffer& data, Residual residual, Held held) {
  // A reduce-scatter, then an all-gather of the summed chunks straight from
  // the host copy of the sum (over 8-bit blocks: the sum as they decode,
  // here as at the other ranks).
  return Run([&]() -> absl::Status {
    const uint64_t scatter = next_sequence_++, gather = next_sequence_++;
    if (size() == 1) return absl::OkStatus();
    if (!residual.has_value() && common::AllReduceInOneRound(data.size() * sizeof(float), size(), options_.one_round_bytes)) {
      return ReduceScatter(data, held, scatter, residual, /*whole=*/true).status();
    }
    ASSIGN_OR_RETURN(transport::HostBuffer sum, ReduceScatter(data, held, scatter, residual));
    auto mine = std::make_shared<StageMessage>();
    mine->kind = StageMessage::Kind::kCollective;
    mine->sequence = gather;
    mine->micro_batch = rank();
    mine->values = std::move(sum);
    if (residual.has_value()) {
      const Chunk own = ChunkOf(data.size(), size(), rank());
      Quantize(*mine, residual->subspan(own.begin, own.size()));
      RETURN_IF_ERROR(data.Write(own.begin, absl::Span<const float>(mine->values)));
    }
    return Gather(data, gather, std::move(mine));
  });
}

absl::Status GrpcCollective::Broadcast(DeviceSpan<float> data, int root) {
  if (root < 0 || root >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " is not a rank of a group of ", size()));
  }
  const CallBuffer buffer = OnDevice(data);
  return Run([&]() -> absl::Status {
    const uint64_t sequence = next_sequence_++;
    if (size() == 1) return absl::OkStatus();
    if (rank() == root) {
      ASSIGN_OR_RETURN(auto whole, Outgoing(sequence, kWholeBuffer, buffer, Chunk{0, data.size()}));
      for (int i = 1; i < size(); ++i) RETURN_IF_ERROR(Send((rank() + i) % size(), whole));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(StageMessage whole, Expect(root, sequence, kWholeBuffer, data.size()));
    return buffer.Write(0, absl::Span<const float>(whole.values));
  });
}

}  // namespace shardline::worker::collective
