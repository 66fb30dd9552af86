#include "worker/transport/grpc_stage_link.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_coding.h"
#include "glog/logging.h"
#include "worker/transport/upstream_connector.h"

namespace shardline::worker::transport {
namespace {

absl::Status NoNeighbour(absl::string_view side) {
  return absl::FailedPreconditionError(absl::StrCat("this stage has no ", side, " stage"));
}

}  // namespace

grpc::ChannelArguments StageLinkChannelArguments() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);  // we recover at micro-batch level, not per message
  args.SetMaxReceiveMessageSize(StageLinkMaxFrameBytes());
  // A dead neighbour's connection is noticed within ~40 s even while a long
  // step sends nothing (the link timeout catches it too); the servers permit
  // these pings (StageLinkService::RegisterWith).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30'000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);  // keep pinging while idle
  args.SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, kStageLinkWriteBufferBytes);
  return args;
}

int StageLinkMaxFrameBytes() {
  return static_cast<int>(kMaxChunkBytes + common::kMaxFrameHeaderBytes);
}

GrpcStageLink::GrpcStageLink(GrpcStageLinkOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GrpcStageLink>> GrpcStageLink::Create(
    const GrpcStageLinkOptions& options) {
  if (options.stages < 1 || options.stage < 0 || options.stage >= options.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("stage ", options.stage, " of ", options.stages));
  }
  const bool has_next = options.stage + 1 < options.stages, has_previous = options.stage > 0;
  if (has_next && options.service == nullptr) {
    return absl::InvalidArgumentError("a stage with a next stage needs the StageLink service");
  }
  if (has_previous && options.upstream_address.empty()) {
    return absl::InvalidArgumentError("a stage with a previous stage needs its address");
  }
  std::unique_ptr<GrpcStageLink> link(new GrpcStageLink(options));
  if (options.exchange.chunk_bytes < kMinChunkBytes || options.exchange.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk of ", options.exchange.chunk_bytes,
                                                   " bytes; it must be within [", kMinChunkBytes, ", ",
                                                   kMaxChunkBytes, "]"));
  }
  if (options.exchange.window_frames < 1 || options.exchange.max_waiting < 1) {
    return absl::InvalidArgumentError("a link needs a window of at least one frame and one waiting message");
  }
  RETURN_IF_ERROR(link->CreateStagingPools(has_next, has_previous));
  if (has_next) {
    ExchangeOptions exchange = options.exchange;
    exchange.receive_pool = link->receive_next_;
    exchange.codec = options.to_next;
    link->downstream_ = options.service->Expect(options.job_id, options.plan_epoch, options.stage, exchange);
  }
  if (has_previous) {
    ExchangeOptions exchange = options.exchange;
    exchange.receive_pool = link->receive_previous_;
    exchange.codec = options.to_previous;
    link->upstream_stream_ = std::make_shared<ExchangeStream>(exchange);
    shardline::v1::StageHello hello;
    hello.set_job_id(options.job_id);
    hello.set_plan_epoch(options.plan_epoch);
    hello.set_stage(options.stage);
    hello.set_link_token(options.exchange.link_token);
    link->upstream_ = std::make_unique<UpstreamConnector>(options.upstream_address, hello, link->upstream_stream_,
                                                          options.exchange.timeout,
                                                          options.exchange.channel_credentials);
  }
  return link;
}

absl::Status GrpcStageLink::CreateStagingPools(bool has_next, bool has_previous) {
  const size_t bytes = options_.staging_slot_bytes;
  const int neighbours = int{has_next} + int{has_previous};
  if (bytes == 0 || neighbours == 0) return absl::OkStatus();
  const size_t wanted_send = options_.exchange.max_waiting + 2 + options_.extra_send_slots;
  const size_t wanted_receive = options_.exchange.max_waiting + 3;
  const size_t wanted = neighbours * (wanted_send + wanted_receive) * bytes;
  const size_t budget = options_.staging_budget_bytes;
  // Over budget: every pool shrinks by the same factor, to one slot at least.
  const double scale = wanted <= budget ? 1.0 : static_cast<double>(budget) / static_cast<double>(wanted);
  const int send_slots = std::max(1, static_cast<int>(wanted_send * scale));
  const int receive_slots = std::max(1, static_cast<int>(wanted_receive * scale));
  if (neighbours * (send_slots + receive_slots) * bytes > budget) {
    LOG(WARNING) << "job " << options_.job_id << " stage " << options_.stage << ": staging slots of " << bytes
                 << " bytes do not fit the budget of " << budget << " bytes; tensors stay on the heap";
    return absl::OkStatus();
  }
  for (auto [needed, pool, slots] : {std::tuple{has_next, &send_next_, send_slots},
                                     std::tuple{has_next, &receive_next_, receive_slots},
                                     std::tuple{has_previous, &send_previous_, send_slots},
                                     std::tuple{has_previous, &receive_previous_, receive_slots}}) {
    if (!needed) continue;
    ASSIGN_OR_RETURN(*pool, StagingPool::Create(bytes, slots, options_.staging_memory));
  }
  return absl::OkStatus();
}

GrpcStageLink::~GrpcStageLink() {
  // What the stage sent last reaches the neighbour before the call ends
  // (bounded: a neighbour that stopped reading does not hold us).
  const absl::Duration drain = std::min(options_.exchange.timeout, absl::Seconds(5));
  if (upstream_stream_ != nullptr) (void)upstream_stream_->AwaitSent(drain);
  if (downstream_ != nullptr) (void)downstream_->AwaitSent(drain);
  if (upstream_stream_ != nullptr) {
    upstream_stream_->Close("this stage closed its link");
    upstream_.reset();
  }
  if (downstream_ != nullptr) {
    downstream_->Close("the previous stage closed its link");
    options_.service->Forget(options_.job_id, options_.stage);
  }
}

uint64_t GrpcStageLink::BytesReceived() {
  return (downstream_ ? downstream_->bytes_received() : 0) +
         (upstream_stream_ ? upstream_stream_->bytes_received() : 0);
}

WirePace GrpcStageLink::PaceFromPrevious() { return upstream_stream_ ? upstream_stream_->wire_pace() : WirePace{}; }

WirePace GrpcStageLink::PaceFromNext() { return downstream_ ? downstream_->wire_pace() : WirePace{}; }

uint64_t GrpcStageLink::PeakHeldBytes() {
  return (downstream_ ? downstream_->peak_held_bytes() : 0) +
         (upstream_stream_ ? upstream_stream_->peak_held_bytes() : 0);
}

HostBuffer GrpcStageLink::OutgoingBuffer(StageMessage::Kind kind, size_t elements) {
  const bool backwards = kind == StageMessage::Kind::kGradient || kind == StageMessage::Kind::kNormTotal;
  const std::shared_ptr<StagingPool>& pool = backwards ? send_previous_ : send_next_;
  if (pool != nullptr && elements * sizeof(float) <= pool->slot_bytes()) {
    // Never waits: Send's bounded queue is what holds a stage back.
    if (std::optional<StagingSlot> slot = pool->TryAcquire()) return HostBuffer(std::move(*slot), elements);
  }
  return HostBuffer::Zeros(elements);
}

int GrpcStageLink::PeakStagingSlots() {
  int peak = 0;
  for (const auto* pool : {&send_next_, &send_previous_, &receive_next_, &receive_previous_}) {
    if (*pool != nullptr) peak += (*pool)->peak_in_use();
  }
  return peak;
}

GrpcStageLink::StagingUse GrpcStageLink::Staging() {
  StagingUse use;
  for (const auto* pool : {&send_next_, &send_previous_, &receive_next_, &receive_previous_}) {
    if (*pool == nullptr) continue;
    use.slots += (*pool)->slots();
    use.in_use += (*pool)->slots() - (*pool)->free_slots();
    use.bytes += static_cast<size_t>((*pool)->slots()) * (*pool)->slot_bytes();
    use.pinned = use.pinned || (*pool)->pinned();
  }
  return use;
}

void GrpcStageLink::Close(const std::string& reason) {
  if (downstream_ != nullptr) downstream_->Close(reason);
  if (upstream_stream_ != nullptr) upstream_stream_->Close(reason);
}

absl::Status GrpcStageLink::SendToNext(StageMessage message) {
  if (downstream_ == nullptr) return NoNeighbour("next");
  return downstream_->Send(std::make_shared<const StageMessage>(std::move(message)));
}

absl::StatusOr<StageMessage> GrpcStageLink::ReceiveFromPrevious() {
  if (upstream_stream_ == nullptr) return NoNeighbour("previous");
  return upstream_stream_->Receive();
}

absl::Status GrpcStageLink::SendToPrevious(StageMessage message) {
  if (upstream_stream_ == nullptr) return NoNeighbour("previous");
  return upstream_stream_->Send(std::make_shared<const StageMessage>(std::move(message)));
}

absl::StatusOr<StageMessage> GrpcStageLink::ReceiveFromNext() {
  if (downstream_ == nullptr) return NoNeighbour("next");
  return downstream_->Receive();
}

}  // namespace shardline::worker::transport
