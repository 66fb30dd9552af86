#include "worker/runtime/gradient_buckets.h"

#include <algorithm>

#include "common/status_macros.h"

namespace shardline::worker::runtime {

GradientBuckets::GradientBuckets(Backend& backend, size_t bucket_bytes)
    : backend_(backend), bucket_floats_(std::max<size_t>(1, bucket_bytes / sizeof(float))) {}

size_t GradientBuckets::LargestChunkBytes(size_t bucket_bytes, int ranks) {
  const size_t floats = std::max<size_t>(1, bucket_bytes / sizeof(float));
  const size_t d = static_cast<size_t>(std::max(1, ranks));
  return (floats + d - 1) / d * sizeof(float);
}

absl::Status GradientBuckets::AllReduce(const std::vector<DeviceSpan<float>>& gradients,
                                        collective::Collective& group) {
  calls_ = 0;
  pieces_.clear();
  filled_ = 0;
  // Last parameters first: the backward pass finishes them first.
  for (auto it = gradients.rbegin(); it != gradients.rend(); ++it) {
    for (size_t offset = 0; offset < it->size();) {
      const size_t take = std::min(bucket_floats_ - filled_, it->size() - offset);
      pieces_.push_back(it->subspan(offset, take));
      filled_ += take;
      offset += take;
      if (filled_ == bucket_floats_) RETURN_IF_ERROR(Flush(group));
    }
  }
  return Flush(group);
}

absl::Status GradientBuckets::Flush(collective::Collective& group) {
  if (pieces_.empty()) return absl::OkStatus();
  ++calls_;
  if (pieces_.size() == 1) {
    RETURN_IF_ERROR(group.AllReduceSum(pieces_[0]));
  } else {
    if (packed_.bytes() < filled_ * sizeof(float)) {
      ASSIGN_OR_RETURN(packed_, backend_.Allocate(bucket_floats_ * sizeof(float)));
    }
    const DeviceSpan<float> packed = packed_.span<float>().subspan(0, filled_);
    size_t at = 0;
    for (const DeviceSpan<float>& piece : pieces_) {
      RETURN_IF_ERROR(backend_.CopyOnDevice(DeviceSpan<const float>(piece), packed.subspan(at, piece.size())));
      at += piece.size();
    }
    RETURN_IF_ERROR(group.AllReduceSum(packed));
    at = 0;
    for (const DeviceSpan<float>& piece : pieces_) {
      RETURN_IF_ERROR(backend_.CopyOnDevice(DeviceSpan<const float>(packed.subspan(at, piece.size())), piece));
      at += piece.size();
    }
  }
  pieces_.clear();
  filled_ = 0;
  return absl::OkStatus();
}

}  // namespace shardline::worker::runtime
