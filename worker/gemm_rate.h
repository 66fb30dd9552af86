// The f32 GEMM rate a worker reports to the planner: measured at start-up
// (WorkerCapabilities) and again when the coordinator asks (an idle worker
// whose jobs ran slower than its probe: HeartbeatResponse.measure_compute).
#ifndef SHARDLINE_WORKER_GEMM_RATE_H_
#define SHARDLINE_WORKER_GEMM_RATE_H_

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace shardline::worker {

// The f32 GEMM rate of `backend` on 1024³ from repeated probes (after a
// warm-up: 7, or at least 3 when they take over half a second): the median
// rate, and how much the probes disagreed, (slowest − fastest) / median.
struct GemmRate {
  double flops = 0;
  double spread = 0;
};
absl::StatusOr<GemmRate> MeasureGemmRate(Backend& backend);

}  // namespace shardline::worker

#endif  // SHARDLINE_WORKER_GEMM_RATE_H_
