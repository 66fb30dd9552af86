// GrpcStageLink is a StageLink over gRPC: to the previous stage it is the
// client of that worker's StageLink.Exchange (it connects and says hello with
// job, plan epoch and its stage); to the next stage it is the server side,
// through the local StageLinkService. Messages are chunked frames
// (stage_frame_coding.h) written under the peer's credit, one write in
// flight per stream (exchange_stream.h); every wait has the link's timeout,
// so a dead neighbour becomes UNAVAILABLE or DEADLINE_EXCEEDED, never a
// hang. Tensors sent and received live in the link's staging slots
// (staging_pool.h) when a slot is free. Thread-safe as StageLink requires.
#ifndef SHARDLINE_WORKER_TRANSPORT_GRPC_STAGE_LINK_H_
#define SHARDLINE_WORKER_TRANSPORT_GRPC_STAGE_LINK_H_

#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/transport/exchange_stream.h"
#include "worker/transport/stage_link.h"
#include "worker/transport/stage_link_service.h"
#include "worker/transport/upstream_connector.h"

namespace shardline::worker::transport {

struct GrpcStageLinkOptions {
  std::string job_id;
  uint64_t plan_epoch = 0;
  int stage = 0;
  int stages = 1;
  std::string upstream_address;          // the previous stage's worker (stage > 0)
  StageLinkService* service = nullptr;   // this worker's service (stage < stages − 1)
  ExchangeOptions exchange;               // timeout, chunk size, flow control
  // How activations go to the next stage and gradients to the previous
  // one (exchange.codec is ignored).
  WireCodec to_next = WireCodec::kAsIs;
  WireCodec to_previous = WireCodec::kAsIs;
  // Staging slots for the tensors this link moves, allocated at Create:
  // per neighbour, max_waiting + 2 + extra_send_slots for sending and
  // max_waiting + 3 for receiving, fewer (at least one per pool) when that would exceed
  // `staging_budget_bytes`, none when even that would. 0: none. Tensors
  // larger than a slot, or sent or received while every slot is in use, live
  // on the heap: slots speed the path up, the queues bound its memory.
  size_t staging_slot_bytes = 0;
  size_t staging_budget_bytes = size_t{512} << 20;
  // Outgoing tensors held before they reach the link (a StageSender's queue,
  // where device copies finish later): without slots for them they would
  // fall back to pageable memory, whose device copies are synchronous.
  size_t extra_send_slots = 0;
  HostMemory staging_memory = PlainHostMemory();  // pinned on CUDA workers
};

// The arguments of every channel to a StageLink server: no retries (we
// recover at micro-batch level), frames up to the largest chunk, keepalive
// pings every 30 s, idle or not.
grpc::ChannelArguments StageLinkChannelArguments();
// The largest frame a StageLink peer accepts (servers set it too).
int StageLinkMaxFrameBytes();

class GrpcStageLink final : public StageLink {
 public:
  // Registers with the service and starts connecting upstream; returns at
  // once (sends and receives wait for the peers, up to the timeout).
  static absl::StatusOr<std::unique_ptr<GrpcStageLink>> Create(const GrpcStageLinkOptions& options);
  ~GrpcStageLink() override;

  absl::Status SendToNext(StageMessage message) override;
  absl::StatusOr<StageMessage> ReceiveFromPrevious() override;
  absl::Status SendToPrevious(StageMessage message) override;
  absl::StatusOr<StageMessage> ReceiveFromNext() override;
  uint64_t BytesReceived() override;
  WirePace PaceFromPrevious() override;
  WirePace PaceFromNext() override;
  uint64_t PeakHeldBytes() override;
  HostBuffer OutgoingBuffer(StageMessage::Kind kind, size_t elements) override;
  // The most slots each staging pool had in use at once, summed over the pools.
  int PeakStagingSlots();
  // The staging pools now, summed: slots, those handed out, their bytes.
  struct StagingUse {
    int slots = 0;
    int in_use = 0;
    size_t bytes = 0;
    bool pinned = false;  // page-locked (CUDA)
  };
  StagingUse Staging();
  // Fails every wait, now and later, with UNAVAILABLE `reason` (cancellation).
  void Close(const std::string& reason) override;

 private:
  explicit GrpcStageLink(GrpcStageLinkOptions options);
  absl::Status CreateStagingPools(bool has_next, bool has_previous);

  const GrpcStageLinkOptions options_;
  std::shared_ptr<ExchangeStream> downstream_;  // we serve it; the next stage connects
  std::shared_ptr<ExchangeStream> upstream_stream_;  // survives call retries
  std::unique_ptr<UpstreamConnector> upstream_;      // the call to the previous stage
  std::shared_ptr<StagingPool> send_next_, send_previous_;        // slots for outgoing tensors
  std::shared_ptr<StagingPool> receive_next_, receive_previous_;  // slots for incoming tensors
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_GRPC_STAGE_LINK_H_
