// GrpcCollective is a Collective between worker daemons: one rank of a group
// whose ranks are joined pairwise by StageLink.Exchange streams (each rank
// calls every lower rank and serves every higher one through its worker's
// StageLinkService), so it reuses the stage links' frame coding (frames that
// alias the tensor), staging slots (pinned on CUDA workers) and credits.
//
// A reduce-scatter sends chunk q of the buffer to rank q and adds the d
// chunks it receives for its own chunk in rank order; an all-gather sends its
// chunk to every rank. Each rank so moves (d − 1)/d of the buffer out and in
// per phase, as a ring does, and every element is summed in rank order
// whatever the timing. AllReduceSum is a reduce-scatter and an all-gather
// (two sequence numbers), or, for a small buffer, one round: every rank
// sends all of it to every other rank and adds the d buffers in rank order
// itself (the same additions in the same order, so the same bits, in half
// the round trips: a tensor-parallel layer's activations are latency-bound).
// That sends (d − 1) buffers where the two rounds send 2(d − 1)/d: as many
// bytes for a pair of ranks, more for a larger group. When it does is
// common::AllReduceInOneRound's rule (never over 8-bit blocks). Every frame
// carries its call's sequence number and chunk, checked on arrival: a
// stale, out-of-order or mismatched one fails
// the call with FAILED_PRECONDITION; a rank that does not answer in the
// exchange timeout, with DEADLINE_EXCEEDED; a vanished one, UNAVAILABLE. Any
// failure closes every stream of this rank, so its peers fail at once too,
// and sticks. Memory stays bounded whatever the peers' speeds (the streams'
// credits and queues). Not thread-safe (one thread per rank); Close() from
// any thread.
//
// Ending: a rank whose calls are all done leaves with Leave(), in order, so
// that a peer still waiting for this rank's last frames gets them. Destroyed
// without leaving (a rank that failed or is cancelled) it aborts its streams,
// and its peers' waits fail at once, not at their timeout.
#ifndef SHARDLINE_WORKER_COLLECTIVE_GRPC_COLLECTIVE_H_
#define SHARDLINE_WORKER_COLLECTIVE_GRPC_COLLECTIVE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cost_model.h"
#include "worker/backend/backend.h"
#include "worker/collective/call_buffer.h"
#include "worker/collective/collective.h"
#include "worker/transport/exchange_stream.h"
#include "worker/transport/stage_link_service.h"
#include "worker/transport/staging_pool.h"
#include "worker/transport/upstream_connector.h"

namespace shardline::worker::collective {

struct GrpcCollectiveOptions {
  std::string job_id;
  uint64_t plan_epoch = 0;
  std::string group;                        // e.g. "stage-1": the data-parallel replicas of stage 1
  int rank = 0;
  std::vector<std::string> peer_addresses;  // every rank's StageLink address, by rank (own unused)
  transport::StageLinkService* service = nullptr;  // this worker's: higher ranks call it
  transport::ExchangeOptions exchange;             // timeout, chunk size, flow control
  // Staging slots for the chunks a call moves (the largest chunk's bytes),
  // allocated at Create; 0: chunks live on the heap.
  size_t staging_slot_bytes = 0;
  transport::HostMemory staging_memory = transport::PlainHostMemory();  // pinned on CUDA workers
  // The largest all-reduce that may go in one round, in bytes (0: none).
  size_t one_round_bytes = common::kOneRoundAllReduceBytes;
};

class GrpcCollective final : public Collective {
 public:
  // Registers with the service and starts calling the lower ranks; returns
  // at once (calls wait for their peers, up to the exchange timeout).
  // `backend` holds the buffers and must outlive the collective.
  static absl::StatusOr<std::unique_ptr<GrpcCollective>> Create(Backend& backend, GrpcCollectiveOptions options);
  ~GrpcCollective() override;

  int rank() const override { return options_.rank; }
  int size() const override { return static_cast<int>(options_.peer_addresses.size()); }
  absl::Status AllReduceSum(DeviceSpan<float> data) override;
  absl::Status ReduceScatterSum(DeviceSpan<float> data) override;
  absl::Status AllGather(DeviceSpan<float> data) override;
  absl::Status Broadcast(DeviceSpan<float> data, int root) override;
  absl::Status AllReduceSumHost(absl::Span<float> data) override { return AllReduce(CallBuffer::OnHost(data)); }
  absl::Status ReduceScatterSumHost(absl::Span<float> data) override {
    return ReduceScatterOnly(CallBuffer::OnHost(data));
  }
  absl::Status AllGatherHost(absl::Span<float> data) override { return AllGatherOnly(CallBuffer::OnHost(data)); }
  // The parts and sums go as the 8-bit blocks error feedback made
  // (StageMessage::int8_blocks).
  absl::Status AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual) override;
  absl::Status ReduceScatterSumHostInt8(absl::Span<float> data, absl::Span<float> residual) override;
  // Each held part goes to a chunk's owner as a message of its own, before
  // the rank's `data` (the owner adds them in that order): at most
  // common::kMaxReplicaGroups parts and the exchange's max_waiting
  // (INVALID_ARGUMENT otherwise).
  absl::Status AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override;
  absl::Status ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held) override;
  void Close(const std::string& reason) override;
  // Leaves the group once this rank's calls are done: waits (up to `drain`)
  // until every frame it queued is written, then ends its streams in order
  // (its dialled streams half-close and wait, up to the same bound, for the
  // peer to end them), so that each peer reads every frame before it sees
  // the end. Later calls fail with UNAVAILABLE; once failed or closed, it
  // only closes.
  void Leave(absl::Duration drain = absl::Seconds(5));

  uint64_t BytesReceived() override;
  transport::WirePace PaceFrom(int peer) override;

 private:
  GrpcCollective(Backend& backend, GrpcCollectiveOptions options)
      : backend_(backend), options_(std::move(options)) {}

  CallBuffer OnDevice(DeviceSpan<float> data) { return CallBuffer::OnDevice(backend_, data); }
  // The operations on either kind of memory; with a residual (host
  // memory only), over 8-bit blocks with error feedback.
  // `held`: this rank's parts before `data` (AllReduceSumHostParts).
  using Residual = std::optional<absl::Span<float>>;
  using Held = absl::Span<const float* const>;
  absl::Status AllReduce(const CallBuffer& data, Residual residual = std::nullopt, Held held = {});
  absl::Status ReduceScatterOnly(const CallBuffer& data, Residual residual = std::nullopt, Held held = {});
  absl::Status AllGatherOnly(const CallBuffer& data);
  // The reduce-scatter of call `sequence`: this rank's chunk of the sum, on
  // the host (also written to `data`); `whole`: every rank's whole buffer to
  // every other rank, and the whole sum (an all-reduce in one round).
  absl::StatusOr<transport::HostBuffer> ReduceScatter(const CallBuffer& data, Held held, uint64_t sequence,
                                                      Residual residual, bool whole = false);
  // Host memory for a chunk of `elements`: a staging slot when one is free.
  transport::HostBuffer HostChunk(size_t elements);
  // Sends `mine` (this rank's chunk) to every peer and writes theirs into `data`.
  absl::Status Gather(const CallBuffer& data, uint64_t sequence, std::shared_ptr<const transport::StageMessage> mine);
  // A message for chunk `chunk` of call `sequence`: elements `range` of
  // `data` (with a residual: as 8-bit blocks of them and their residual).
  absl::StatusOr<std::shared_ptr<const transport::StageMessage>> Outgoing(uint64_t sequence, int chunk,
                                                                          const CallBuffer& data, Chunk range,
                                                                          Residual residual = std::nullopt);
  // A message for chunk `chunk` of call `sequence` with room for `elements`
  // floats (a staging slot when one is free).
  std::shared_ptr<transport::StageMessage> NewMessage(uint64_t sequence, int chunk, size_t elements);
  // A message for chunk `chunk` of call `sequence`: elements `range` of a held part.
  std::shared_ptr<const transport::StageMessage> HeldPart(uint64_t sequence, int chunk, const float* part, Chunk range);
  absl::Status Send(int peer, std::shared_ptr<const transport::StageMessage> message);
  // Rank `peer`'s next message, which must be chunk `chunk` of call
  // `sequence` with `elements` floats.
  absl::StatusOr<transport::StageMessage> Expect(int peer, uint64_t sequence, int chunk, size_t elements);
  // Runs one call: a failure closes every stream and sticks.
  template <typename Fn>
  absl::Status Run(Fn&& call);
  std::string Describe() const;
  absl::Status CheckParts(size_t parts) const;

  Backend& backend_;
  const GrpcCollectiveOptions options_;
  std::vector<std::shared_ptr<transport::ExchangeStream>> streams_;           // by rank; null for our own
  std::vector<std::unique_ptr<transport::UpstreamConnector>> connectors_;     // by rank, lower ranks only
  std::shared_ptr<transport::StagingPool> send_pool_;
  std::vector<std::shared_ptr<transport::StagingPool>> receive_pools_;
  uint64_t next_sequence_ = 0;
  std::vector<float> own_;  // this rank's own chunk on the host, reused
  bool left_ = false;  // Leave ran: the destructor aborts nothing
  absl::Mutex mu_;
  absl::Status failed_ ABSL_GUARDED_BY(mu_);  // sticky
};

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_GRPC_COLLECTIVE_H_
