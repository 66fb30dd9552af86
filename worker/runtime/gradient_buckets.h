// GradientBuckets sums a shard's gradients over its data-parallel group
// (Collective) in buckets of at most `bucket_bytes`: the gradients, last
// parameters first, are cut into pieces that fill one bucket after the
// other (a parameter larger than a bucket spans several); a bucket of one
// piece is reduced in place, others are packed into one device buffer,
// reduced with one collective call and unpacked. Every rank cuts the same
// way, so the ranks' calls match; the sums are element-wise, so the bits do
// not depend on the bucket size. Not thread-safe.
#ifndef SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
#define SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/backend/device_buffer.h"
#include "worker/collective/collective.h"

namespace shardline::worker::runtime {

class GradientBuckets {
 public:
  // `backend` holds the gradients and must outlive this.
  GradientBuckets(Backend& backend, size_t bucket_bytes);

  // Every element of `gradients` becomes its sum over `group`.
  absl::Status AllReduce(const std::vector<DeviceSpan<float>>& gradients, collective::Collective& group);

  // The collective calls the last AllReduce made (buckets).
  int calls() const { return calls_; }
  // The largest chunk (bytes) one rank of `ranks` moves for a bucket of
  // `bucket_bytes`: what a collective's staging slots must hold.
  static size_t LargestChunkBytes(size_t bucket_bytes, int ranks);

 private:
  absl::Status Flush(collective::Collective& group);

  Backend& backend_;
  const size_t bucket_floats_;
  DeviceBuffer packed_;                  // a bucket of several pieces, allocated once
  std::vector<DeviceSpan<float>> pieces_;  // of the bucket being filled
  size_t filled_ = 0;                      // floats in pieces_
  int calls_ = 0;
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
