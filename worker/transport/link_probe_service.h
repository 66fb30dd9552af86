// LinkProbeService serves LinkProbe (proto/shardline/v1/link_probe.proto)
// beside a worker's StageLink: Ping answers at once; Sink reads and
// discards what a peer streams and answers the byte count, so the peer can
// time the link. Bounded: at most kMaxProbeBytes a call and kMaxSinks calls
// at once (RESOURCE_EXHAUSTED beyond either); nothing is kept. Thread-safe.
#ifndef SHARDLINE_WORKER_TRANSPORT_LINK_PROBE_SERVICE_H_
#define SHARDLINE_WORKER_TRANSPORT_LINK_PROBE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>

#include "shardline/v1/link_probe.grpc.pb.h"

namespace shardline::worker::transport {

class LinkProbeService final : public shardline::v1::LinkProbe::CallbackService {
 public:
  static constexpr int64_t kMaxProbeBytes = int64_t{256} << 20;
  static constexpr int kMaxSinks = 2;

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context, const shardline::v1::LinkPing* request,
                                 shardline::v1::LinkPing* response) override;
  grpc::ServerReadReactor<shardline::v1::LinkProbeChunk>* Sink(grpc::CallbackServerContext* context,
                                                               shardline::v1::LinkProbeReceipt* receipt) override;

  // Sink calls open now, and the most bytes one delivered (for tests).
  int active_sinks() const { return active_.load(); }
  int64_t largest_sink() const { return largest_.load(); }

 private:
  std::atomic<int> active_{0};
  std::atomic<int64_t> largest_{0};
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_LINK_PROBE_SERVICE_H_
