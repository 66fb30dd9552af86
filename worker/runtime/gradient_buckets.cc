#include "worker/runtime/gradient_buckets.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

size_t GradientBuckets::LargestChunkBytes(size_t bucket_bytes, int ranks) {
  const size_t floats = std::max<size_t>(1, bucket_bytes / sizeof(float));
  const size_t d = static_cast<size_t>(std::max(1, ranks));
  return (floats + d - 1) / d * sizeof(float);
}

absl::StatusOr<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(Backend& backend,
                                                                         std::vector<DeviceSpan<float>> gradients,
                                                                         size_t bucket_bytes,
                                                                         collective::Collective& group) {
  const size_t bucket_floats = std::max<size_t>(1, bucket_bytes / sizeof(float));
  std::unique_ptr<GradientBuckets> b(new GradientBuckets(backend, group));
  size_t total = 0;
  for (const DeviceSpan<float>& g : gradients) total += g.size();
  if (total > 0) {
    ASSIGN_OR_RETURN(void* host, backend.AllocateHostStaging(total * sizeof(float)));
    b->host_ = static_cast<float*>(host);
  }
  // Last parameters first: the backward pass finishes them first.
  size_t at = 0;  // in the host copy
  for (size_t p = gradients.size(); p-- > 0;) {
    const DeviceSpan<float> g = gradients[p];
    for (size_t offset = 0; offset < g.size();) {
      if (b->buckets_.empty() || b->buckets_.back().host.size() == bucket_floats) {
        b->buckets_.emplace_back();
        b->buckets_.back().host = absl::Span<float>(b->host_ + at, 0);
      }
      Bucket& bucket = b->buckets_.back();
      const size_t take = std::min(bucket_floats - bucket.host.size(), g.size() - offset);
      bucket.pieces.push_back({g.subspan(offset, take), at});
      bucket.lowest_parameter = p;
      bucket.host = absl::Span<float>(bucket.host.data(), bucket.host.size() + take);
      offset += take;
      at += take;
    }
  }
  b->thread_ = std::thread([raw = b.get()] { raw->Reduce(); });
  return b;
}

GradientBuckets::~GradientBuckets() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  if (host_ != nullptr) backend_.FreeHostStaging(host_);
}

void GradientBuckets::Reduce() {
  for (;;) {
    size_t index = 0;
    bool skip = false;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (queue_.empty()) return;  // stopping
      index = queue_.front();
      queue_.pop_front();
      skip = !failed_.ok();  // the group is closing: no more calls
    }
    const auto start = Clock::now();
    absl::Status status;
    Bucket& bucket = buckets_[index];
    for (const HostTransfer& copy : bucket.copies) status.Update(copy.Wait());
    if (status.ok() && !skip) status = group_.AllReduceSumHost(bucket.host);
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("summing gradient bucket ", index, " of ", buckets_.size(),
                                                        " over the replicas: ", status.message()));
    }
    const double seconds = Since(start);
    absl::MutexLock lock(&mu_);
    reduce_seconds_ += seconds;
    if (failed_.ok()) failed_ = status;
    ++summed_;
  }
}

absl::Status GradientBuckets::Ready(size_t first) {
  for (; next_ < buckets_.size() && buckets_[next_].lowest_parameter >= first; ++next_) {
    Bucket& bucket = buckets_[next_];
    bucket.copies.clear();
    for (const Piece& piece : bucket.pieces) {
      ASSIGN_OR_RETURN(HostTransfer copy,
                       backend_.CopyToHostAsync(DeviceSpan<const float>(piece.gradient),
                                                absl::Span<float>(host_ + piece.host_offset, piece.gradient.size())));
      bucket.copies.push_back(std::move(copy));
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(next_);
  }
  return absl::OkStatus();
}

absl::Status GradientBuckets::AwaitStarted() {
  absl::MutexLock lock(&mu_);
  auto all_summed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return summed_ == next_; };
  mu_.Await(absl::Condition(&all_summed));
  return failed_;
}

void GradientBuckets::EndStep() {
  absl::MutexLock lock(&mu_);
  last_reduce_seconds_ = reduce_seconds_;
  reduce_seconds_ = 0;
  summed_ = 0;
  failed_ = absl::OkStatus();
  next_ = 0;
}

absl::Status GradientBuckets::Finish() {
  absl::Status status = Ready(0);
  const auto start = Clock::now();
  status.Update(AwaitStarted());
  const auto copy_start = Clock::now();
  for (const Bucket& bucket : buckets_) {
    for (const Piece& piece : bucket.pieces) {
      if (!status.ok()) break;
      status = backend_.CopyToDevice(absl::Span<const float>(host_ + piece.host_offset, piece.gradient.size()),
                                     piece.gradient);
    }
  }
  last_exposed_seconds_ = Since(start);
  const double copy_seconds = Since(copy_start);
  EndStep();
  last_reduce_seconds_ += copy_seconds;  // the copy back is reduction work too, never hidden
  return status;
}

void GradientBuckets::Abandon() {
  (void)AwaitStarted();
  EndStep();
}

}  // namespace shardline::worker::runtime
