// WirePace: what a stream measured of its wire while the neighbour kept it
// busy. The sender marks a data frame it writes with the next one ready to
// follow at once (StageFrame.followed: queued, with credit); the receiver
// times the arrival of each frame that came behind a marked one. bytes /
// seconds is the rate the wire (or the sender) carries back-to-back frames
// at, whatever the stages do between bursts: a link that got slower shows
// here before anywhere else (the coordinator's server/link_pace.h).
#ifndef SHARDLINE_WORKER_TRANSPORT_WIRE_PACE_H_
#define SHARDLINE_WORKER_TRANSPORT_WIRE_PACE_H_

#include <cstdint>

namespace shardline::worker::transport {

struct WirePace {
  uint64_t bytes = 0;   // payload bytes of frames that followed a marked one
  uint64_t nanos = 0;   // the time from the arrival of the frame before each
  WirePace& operator+=(const WirePace& o) {
    bytes += o.bytes;
    nanos += o.nanos;
    return *this;
  }
  // What came since `before` (a running total's earlier value).
  WirePace Since(const WirePace& before) const { return {bytes - before.bytes, nanos - before.nanos}; }
};

}  // namespace shardline::worker::transport

#endif  // SHARDLINE_WORKER_TRANSPORT_WIRE_PACE_H_
