// A Collective is one rank's handle on a group of size() ranks that make the
// same sequence of collective calls: the data-parallel replicas of a pipeline
// stage (later, a tensor-parallel group). The n-th call of every rank meets
// the n-th call of every other rank (its sequence number); ranks that
// disagree on what that call is (operation, element count, root) all fail
// with FAILED_PRECONDITION, and a rank that does not come within the group's
// timeout fails the others with DEADLINE_EXCEEDED.
//
// Results are deterministic: every element of a sum is added in rank order,
// ((x₀ + x₁) + x₂) + …, in float, whatever the timing (AddInRankOrder). So
// the single-process trainer, which sums its micro-batch groups the same
// way, computes the same bits.
//
// Buffers are the rank's own device memory (its Backend's). A buffer of n
// elements is cut into size() chunks, chunk r = ChunkOf(n, size(), r), which
// rank r owns in ReduceScatterSum and AllGather.
//
// Each operation also comes on host memory (…Host): such a call touches no
// backend, so a thread of its own may make it while the rank's backend
// thread goes on queuing work (the gradient reduction overlapping the
// backward pass). The calls of one rank must not overlap: one thread at a
// time calls it (handing over with a lock). Close() may be called from any
// thread.
#ifndef SHARDLINE_WORKER_COLLECTIVE_COLLECTIVE_H_
#define SHARDLINE_WORKER_COLLECTIVE_COLLECTIVE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/backend/device_span.h"
#include "worker/transport/wire_pace.h"

namespace shardline::worker::collective {

class Collective {
 public:
  virtual ~Collective() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Every rank's `data` becomes the element-wise sum over the ranks.
  virtual absl::Status AllReduceSum(DeviceSpan<float> data) = 0;
  // Chunk rank() of `data` becomes that chunk's sum over the ranks; the
  // other chunks keep this rank's own values.
  virtual absl::Status ReduceScatterSum(DeviceSpan<float> data) = 0;
  // Every rank's chunk r of `data` becomes rank r's chunk r.
  virtual absl::Status AllGather(DeviceSpan<float> data) = 0;
  // Every rank's `data` becomes rank `root`'s.
  virtual absl::Status Broadcast(DeviceSpan<float> data, int root) = 0;
  // The same on host memory.
  virtual absl::Status AllReduceSumHost(absl::Span<float> data) = 0;
  virtual absl::Status ReduceScatterSumHost(absl::Span<float> data) = 0;
  virtual absl::Status AllGatherHost(absl::Span<float> data) = 0;
  // The sums on host memory over 8-bit blocks with error feedback
  // (error_feedback.h; parallel.wire_dtype "int8": lossy, so outside the
  // determinism contract): each rank's parts travel as 8-bit blocks of
  // data + residual, and `residual` (data.size() floats, zero at first,
  // kept by the caller between calls on the same buffer) keeps what the
  // blocks missed; an all-reduce's owner of each chunk does the same with
  // the chunk's sum before it goes to the others (a rank's own part of its
  // own chunk is never quantized). Every rank ends with the same values.
  // After ReduceScatterSumHostInt8 the chunks other than rank()'s are
  // unspecified. The defaults quantize here and call the f32 operations,
  // for collectives whose values cross no wire.
  virtual absl::Status AllReduceSumHostInt8(absl::Span<float> data, absl::Span<float> residual);
  virtual absl::Status ReduceScatterSumHostInt8(absl::Span<float> data, absl::Span<float> residual);
  // The sums on host memory where each rank stands for several ranks of a
  // larger group (a replica running several replicas' micro-batch groups
  // after the grid shrank): this rank's parts are `held` (each
  // data.size() floats, read only) and then `data`, in that order, and
  // every rank of the group brings as many. The sum adds every rank's
  // parts in (rank, part) order, so it has the bits of the larger group's
  // sum: ((x₀ + x₁) + x₂) + … over all of them. With `held` empty, the
  // plain calls. In a group of one the parts are added here. The defaults
  // do no more than that (UNIMPLEMENTED otherwise).
  virtual absl::Status AllReduceSumHostParts(absl::Span<float> data, absl::Span<const float* const> held);
  virtual absl::Status ReduceScatterSumHostParts(absl::Span<float> data, absl::Span<const float* const> held);

  // Fails this rank's calls, now and later, and those of the ranks waiting
  // for it, with UNAVAILABLE `reason` (the step has failed; no hang).
  virtual void Close(const std::string& reason) = 0;

  // Payload bytes received from the other ranks so far (0 where nothing
  // crosses a wire).
  virtual uint64_t BytesReceived() { return 0; }
  // What the frames received so far from rank `peer` showed of the wire
  // between us (transport/wire_pace.h; nothing where none is crossed).
  virtual transport::WirePace PaceFrom(int /*peer*/) { return {}; }
};

// Elements [begin, end) of a buffer of `n` cut into `ranks` chunks: chunk r
// is [r·n/ranks, (r+1)·n/ranks), so sizes differ by at most one.
struct Chunk {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};
Chunk ChunkOf(size_t n, int ranks, int rank);

// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + … for i in
// [0, out.size()): the one order every sum of the collective layer uses.
// Each part holds at least out.size() elements.
void AddInRankOrder(absl::Span<const float* const> parts, absl::Span<float> out);

}  // namespace shardline::worker::collective

#endif  // SHARDLINE_WORKER_COLLECTIVE_COLLECTIVE_H_
