// Measures the link from this worker to a peer's LinkProbe service: the
// round trip (the median of kPings pings after one that opens the
// connection) and the bandwidth (transfers of growing size until one takes
// at least kMinTransferSeconds, or kMaxTransferBytes is reached; then
// kTransfers of that size: their median rate, and their spread, (fastest −
// slowest) / median). A transfer's rate is its bytes over its time less one
// round trip (the receipt's). What it measures is this process's gRPC path
// (protobuf messages of kChunkBytes), the one stage links take.
#ifndef SHARDLINE_WORKER_TRANSPORT_GRPC_LINK_PROBER_H_
#define SHARDLINE_WORKER_TRANSPORT_GRPC_LINK_PROBER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardline::worker::transport {

struct LinkProbeOptions {
  int pings = 5;
  int transfers = 3;
  int64_t first_transfer_bytes = int64_t{1} << 20;
  int64_t max_transfer_bytes = int64_t{64} << 20;
  double min_transfer_seconds = 0.2;
  int64_t chunk_bytes = int64_t{1} << 20;
  absl::Duration deadline = absl::Seconds(30);  // for the whole probe
};

struct LinkProbeResult {
  double bytes_per_second = 0;
  double spread = 0;
  double rtt_seconds = 0;
  int64_t transfer_bytes = 0;  // the size the rate was measured at
};

// `credentials`: the worker's channel credentials (TLS where it runs
// with it). UNAVAILABLE / DEADLINE_EXCEEDED as the peer answers; CANCELLED
// when `cancelled` turns true between transfers.
absl::StatusOr<LinkProbeResult> ProbeLink(const std::string& address,
                                          std::shared_ptr<grpc::ChannelCredentials> credentials,
                                          const LinkProbeOptions& options, const std::atomic<bool>& cancelled);

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_GRPC_LINK_PROBER_H_
