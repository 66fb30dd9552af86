// ReplicaGradientSum is the data-parallel gradient all-reduce of d replicas,
// emulated in one process: the reference trainer runs the replicas'
// micro-batch groups one after the other, hands each group's gradients to
// Add in rank order (the sum is g₀, then sum + g₁, …: per element the order
// of collective::AddInRankOrder), and finally puts the sum back as the
// gradients (Restore). So a run with data_parallel = d computes, bit for bit,
// what d replicas and the collective layer compute. Holds one copy of the
// gradients on the device. Not thread-safe.
#ifndef SHARDLINE_WORKER_TRAINER_REPLICA_GRADIENT_SUM_H_
#define SHARDLINE_WORKER_TRAINER_REPLICA_GRADIENT_SUM_H_

#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/backend/device_buffer.h"

namespace shardline::worker::trainer {

class ReplicaGradientSum {
 public:
  // Adds replica `rank`'s gradients (ranks 0, 1, … in order; 0 starts a new
  // sum). The spans are the same parameters, in the same order, every time.
  absl::Status Add(Backend& backend, const std::vector<DeviceSpan<float>>& gradients, int rank);
  // Overwrites `gradients` with the sum.
  absl::Status Restore(Backend& backend, const std::vector<DeviceSpan<float>>& gradients);

 private:
  std::vector<DeviceBuffer> sums_;  // one per parameter, allocated once
};

}  // namespace shardline::worker::trainer

#endif  // SHARDLINE_WORKER_TRAINER_REPLICA_GRADIENT_SUM_H_
