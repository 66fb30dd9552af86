// How often a worker heartbeats for a given lease: four times per lease and
// at least once a second (heartbeats carry what the stage is doing, which
// the hang explainer wants fresh). The coordinator uses the same interval
// to tell a worker that stopped talking from one that is merely slow.
#ifndef SHARDLINE_COMMON_HEARTBEAT_H_
#define SHARDLINE_COMMON_HEARTBEAT_H_

#include <algorithm>

#include "absl/time/time.h"

namespace shardline::common {

inline absl::Duration HeartbeatInterval(absl::Duration lease) {
  return std::clamp(lease / 4, absl::Milliseconds(10), absl::Seconds(1));
}

}  // namespace shardline::common

#endif  // SHARDLINE_COMMON_HEARTBEAT_H_
