// GradientBuckets sums a shard's gradients over its data-parallel group in
// buckets whose reductions overlap the backward pass, as PyTorch DDP does.
// The gradients, last parameters first (the backward pass finishes them
// first), are cut into buckets of at most `bucket_bytes` (a parameter larger
// than a bucket spans several; small ones share one). During the step's last
// backward pass the runtime says, layer by layer, from which parameter on
// the gradients are final (ShardRuntime::BackwardAsync's hook); each bucket
// they complete is queued for copying to host memory (pinned on CUDA) and
// handed to a reduction thread of its own, which sums it over the group
// (Collective::AllReduceSumHost, no backend involved) while the backward
// pass goes on through the earlier layers. Finish() starts what is left,
// waits for the last sum and copies the sums back into the gradients.
//
// Every rank cuts the same buckets and starts them in the same order, so the
// ranks' collective calls match; the sums are element-wise in rank order, so
// the bits depend neither on the bucket size nor on the timing. The host
// copy of the gradients is allocated once, at Create. One thread (the
// stage's) calls the methods; the reduction thread is the class's own.
#ifndef SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
#define SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"

namespace shardline::worker::runtime {

class GradientBuckets {
 public:
  // `gradients` in parameter order; they, `backend` and `group` must outlive this.
  static absl::StatusOr<std::unique_ptr<GradientBuckets>> Create(Backend& backend,
                                                                 std::vector<DeviceSpan<float>> gradients,
                                                                 size_t bucket_bytes, collective::Collective& group);
  // Waits for the reduction thread (call Finish or Abandon first).
  ~GradientBuckets();

  // The gradients of parameters [first, n) have all their step's work
  // queued: starts the buckets that are complete now. Within a step `first`
  // only decreases.
  absl::Status Ready(size_t first);
  // Starts the buckets still waiting, waits for every sum and writes the
  // sums into the gradients. The next Ready begins the next step.
  absl::Status Finish();
  // After a failed step, once the group is closed (so a call in flight
  // fails at once): waits for the reduction thread to give up and drops the
  // step's buckets.
  void Abandon();

  int buckets() const { return static_cast<int>(buckets_.size()); }
  // Of the last finished step: the seconds of reduction work (the
  // reduction thread's time on the buckets, waiting for their copies to the
  // host included, plus Finish copying the sums back), and the part of them
  // the backward pass did not hide (Finish waiting for the sums and copying
  // them back). The backward pass can hide only what overlaps the step's
  // last backward pass: earlier micro-batches' passes still add to every
  // gradient.
  double reduce_seconds() const { return last_reduce_seconds_; }
  double exposed_seconds() const { return last_exposed_seconds_; }

  // The largest chunk (bytes) one rank of `ranks` moves for a bucket of
  // `bucket_bytes`: what a collective's staging slots must hold.
  static size_t LargestChunkBytes(size_t bucket_bytes, int ranks);

 private:
  // A part of one parameter's gradient and its place in the host copy.
  struct Piece {
    DeviceSpan<float> gradient;
    size_t host_offset = 0;
  };
  struct Bucket {
    std::vector<Piece> pieces;
    size_t lowest_parameter = 0;  // complete once gradients from here on are final
    absl::Span<float> host;       // its pieces, one after the other
    std::vector<HostTransfer> copies;  // to the host, this step
  };

  GradientBuckets(Backend& backend, collective::Collective& group) : backend_(backend), group_(group) {}
  // The reduction thread: sums the started buckets in order.
  void Reduce();
  // Waits for the started buckets' sums; the step's first failure.
  absl::Status AwaitStarted();
  void EndStep();

  Backend& backend_;
  collective::Collective& group_;
  std::vector<Bucket> buckets_;
  float* host_ = nullptr;  // the host copy (AllocateHostStaging)
  size_t next_ = 0;        // the next bucket to start, this step
  double last_reduce_seconds_ = 0, last_exposed_seconds_ = 0;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);  // started, not yet summed
  size_t summed_ ABSL_GUARDED_BY(mu_) = 0;         // buckets done this step (or skipped after a failure)
  absl::Status failed_ ABSL_GUARDED_BY(mu_);       // the step's first failure
  double reduce_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardline::worker::runtime

#endif  // SHARDLINE_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
