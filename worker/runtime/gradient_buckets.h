// GradientBuckets sums a shard's gradients over its data-parallel group in
// buckets whose reductions overlap the backward pass, as PyTorch DDP does.
// The buckets (BucketLayout: whole norm pieces, last parameters first) are
// cut once, at Create. During the step's last backward pass the runtime
// says, layer by layer, from which parameter on the gradients are final
// (ShardRuntime::BackwardAsync's hook); each bucket they complete is queued
// for copying to host memory (pinned on CUDA) and handed to a reduction
// thread of its own, which sums it over the group (a host-memory collective
// call, no backend involved) while the backward pass goes on through the
// earlier layers. Finish() starts what is left, waits for the last sum and
// copies the sums back into the gradients.
//
// Sharded (ZeRO-1), each bucket is reduce-scattered instead of all-reduced:
// a rank gets the sums of the pieces it owns only, and only those are
// copied back; it computes their norm terms (GatheredSumsOfSquares), updates
// its own elements (owned_ranges()) and then hands its pieces of the new
// weights to the others (GatherParameters). The same wire bytes as the
// all-reduce; the optimizer state is the rank's share only.
//
// A rank that stands for several replicas of the spec (GradientBucketsOptions
// ::groups: the grid shrank to fewer replicas, each running several
// replicas' micro-batch groups) keeps each earlier group's gradients on the
// host (Hold, at the end of that group's backward passes) and sums them
// with the last group's as parts of the collective call
// (Collective::AllReduceSumHostParts): the bits of the spec's replicas.
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
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/collective/collective.h"
#include "worker/nn/optimizer.h"
#include "worker/runtime/bucket_layout.h"

namespace shardline::worker::runtime {

struct GradientBucketsOptions {
  size_t bucket_bytes = size_t{25} << 20;  // parallel.bucket_mib
  bool shard = false;                      // ZeRO-1, as above
  // Sums over 8-bit blocks with error feedback (the collective's …Int8
  // calls; parallel.wire_dtype "int8"): a residual per bucket, kept on the
  // host from step to step.
  bool int8 = false;
  size_t piece_elements = kNormPieceElements;  // others for tests
  // The micro-batch groups the rank runs a step, each of one of the spec's
  // replicas (above); > 1 sums over f32, whatever `int8` says.
  int groups = 1;
};

class GradientBuckets {
 public:
  // `gradients` in parameter order; they, `backend` and `group` must
  // outlive this.
  static absl::StatusOr<std::unique_ptr<GradientBuckets>> Create(Backend& backend,
                                                                 std::vector<DeviceSpan<float>> gradients,
                                                                 collective::Collective& group,
                                                                 GradientBucketsOptions options = {});
  // Waits for the reduction thread (call Finish or Abandon first).
  ~GradientBuckets();

  // The gradients of parameters [first, n) have all their step's work
  // queued: starts the buckets that are complete now. Within a step `first`
  // only decreases.
  absl::Status Ready(size_t first);
  // With groups: the step's group `group` (0-based, before the last) has
  // its gradients complete: copies them to the host, to be summed as its
  // part. The caller then zeroes the gradients for the next group.
  absl::Status Hold(int group);
  // Starts the buckets still waiting, waits for every sum and writes the
  // sums into the gradients (sharded: of the rank's own pieces). The next
  // Ready begins the next step.
  absl::Status Finish();
  // After a failed step, once the group is closed (so a call in flight
  // fails at once): waits for the reduction thread to give up and drops the
  // step's buckets.
  void Abandon();

  // Sharded, after Finish: the Σ grad² of every norm piece of the shard, in
  // order (as ShardRuntime::GradSumsOfSquares gives them unsharded), each
  // computed by the piece's owner and gathered over the group.
  absl::StatusOr<std::vector<double>> GatheredSumsOfSquares();
  // The elements of each parameter this rank updates: all of them
  // unsharded, its own pieces sharded (a run per bucket of the parameter).
  const std::vector<nn::Optimizer::Share>& owned() const { return owned_; }
  // Sharded, after this rank's update: every rank's `values` (the
  // parameters, in order) get every owner's pieces of them.
  absl::Status GatherParameters(const std::vector<DeviceSpan<float>>& values);
  // Sharded: every parameter's whole optimizer state, gathered from the
  // owners' shares (`shares[i]`: parameter i's state for owned()[i], its
  // runs end to end; empty where the rank owns nothing). One host vector
  // per parameter.
  absl::StatusOr<std::vector<std::vector<float>>> GatherState(const std::vector<DeviceSpan<const float>>& shares);

  bool sharded() const { return shard_; }
  bool int8() const { return !residual_.empty(); }
  int buckets() const { return static_cast<int>(layout_.buckets.size()); }
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
  static size_t LargestChunkBytes(size_t bucket_bytes, int ranks, bool shard = false);

 private:
  GradientBuckets(Backend& backend, collective::Collective& group, bool shard)
      : backend_(backend), group_(group), shard_(shard) {}
  bool Mine(const BucketLayout::Piece& piece) const { return piece.owner < 0 || piece.owner == group_.rank(); }
  absl::Span<float> HostOf(const BucketLayout::Piece& piece) { return {host_ + piece.host_offset, piece.size}; }
  // Every rank's host copy gets every owner's pieces, each rank having
  // filled in its own (`fill`: the piece, its place in the rank's share,
  // its host memory).
  absl::Status GatherPieces(
      const std::function<absl::Status(const BucketLayout::Piece&, size_t, absl::Span<float>)>& fill);
  // The reduction thread: sums the started buckets in order.
  void Reduce();
  // Waits for the started buckets' sums; the step's first failure.
  absl::Status AwaitStarted();
  void EndStep();

  Backend& backend_;
  collective::Collective& group_;
  const bool shard_;
  BucketLayout layout_;
  std::vector<DeviceSpan<float>> gradients_;
  std::vector<nn::Optimizer::Share> owned_;
  std::vector<std::vector<size_t>> share_offset_;  // [bucket][piece]: an own piece's place in its share
  float* host_ = nullptr;                         // the host copy (AllocateHostStaging)
  std::vector<float> residual_;                   // int8: error feedback, laid out as the host copy
  std::vector<std::vector<float>> held_;          // groups: each earlier group's gradients, as host_
  std::vector<std::vector<HostTransfer>> copies_;  // by bucket: to the host, this step
  size_t next_ = 0;                               // the next bucket to start, this step
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
