// ShardRuntime's split edges (parallel.stage_link_layout scatter_gather):
// a tensor-parallel stage's edge with a neighbouring group carries each
// rank's part of every activation and gradient, and the group all-gathers
// the parts it receives.
#include "worker/runtime/shard_runtime.h"

#include "common/status_macros.h"

namespace shardline::worker::runtime {

absl::Status ShardRuntime::SplitEdges(bool previous, bool next) {
  if ((previous || next) && !tp_.split()) {
    return absl::FailedPreconditionError("only a tensor-parallel stage's edges carry parts of tensors");
  }
  if ((previous && is_first()) || (next && is_last())) {
    return absl::InvalidArgumentError("a split edge needs a neighbouring stage on that side");
  }
  split_previous_ = previous;
  split_next_ = next;
  return absl::OkStatus();
}

collective::Chunk ShardRuntime::EdgePart(int64_t n) const {
  return collective::ChunkOf(static_cast<size_t>(n), tp_.size, tp_.rank);
}

int64_t ShardRuntime::InputElements(int64_t rows) const {
  const int64_t n = rows * input_width();
  return split_previous_ ? static_cast<int64_t>(EdgePart(n).size()) : n;
}

int64_t ShardRuntime::OutputElements(int64_t rows) const {
  const int64_t n = rows * output_width();
  return split_next_ ? static_cast<int64_t>(EdgePart(n).size()) : n;
}

absl::StatusOr<HostTransfer> ShardRuntime::UploadEdgeParts(absl::Span<const float> host, DeviceSpan<float> dst,
                                                           DeviceBuffer& narrow, bool wait,
                                                           const HostTransfer& after, bool split) {
  if (!split) return UploadEdge(host, dst, narrow, wait, after);
  const collective::Chunk part = EdgePart(static_cast<int64_t>(dst.size()));
  ASSIGN_OR_RETURN(HostTransfer transfer, UploadEdge(host, dst.subspan(part.begin, part.size()), narrow, wait, after));
  // Every rank's part, in place (the gather waits for the upload: the
  // device's queue runs it first).
  RETURN_IF_ERROR(tp_.group->AllGather(dst));
  return transfer;
}

}  // namespace shardline::worker::runtime
