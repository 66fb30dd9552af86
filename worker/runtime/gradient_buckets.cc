#include "worker/runtime/gradient_buckets.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardline::worker::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

size_t GradientBuckets::LargestChunkBytes(size_t bucket_bytes, int ranks, bool shard) {
  const size_t floats = std::max<size_t>(1, bucket_bytes / sizeof(float));
  return BucketLayout::LargestChunkFloats(floats, ranks, shard) * sizeof(float);
}

absl::StatusOr<std::unique_ptr<GradientBuckets>> GradientBuckets::Create(Backend& backend,
                                                                         std::vector<DeviceSpan<float>> gradients,
                                                                         collective::Collective& group,
                                                                         GradientBucketsOptions options) {
  const bool shard = options.shard && group.size() > 1;
  std::unique_ptr<GradientBuckets> b(new GradientBuckets(backend, group, shard));
  std::vector<size_t> sizes;
  for (const DeviceSpan<float>& g : gradients) sizes.push_back(g.size());
  b->layout_ = BucketLayout::Cut(sizes, std::max<size_t>(1, options.bucket_bytes / sizeof(float)),
                                 shard ? group.size() : 1, std::max<size_t>(1, options.piece_elements));
  b->gradients_ = std::move(gradients);
  if (b->layout_.host_floats > 0) {
    ASSIGN_OR_RETURN(void* host, backend.AllocateHostStaging(b->layout_.host_floats * sizeof(float)));
    b->host_ = static_cast<float*>(host);
    std::fill(b->host_, b->host_ + b->layout_.host_floats, 0.0f);  // the chunks' padding stays zero
    if (options.int8 && group.size() > 1 && options.groups <= 1) b->residual_.assign(b->layout_.host_floats, 0.0f);
  }
  if (options.groups < 1) return absl::InvalidArgumentError(absl::StrCat(options.groups, " micro-batch groups"));
  b->held_.assign(static_cast<size_t>(options.groups - 1), std::vector<float>(b->layout_.host_floats, 0.0f));
  b->copies_.resize(b->layout_.buckets.size());
  // The rank's own elements of each parameter, as ascending runs, and
  // where each own piece sits in them (the share's state lies end to end).
  std::vector<std::vector<std::pair<size_t, size_t>>> own(sizes.size());  // (offset, size)
  for (const BucketLayout::Bucket& bucket : b->layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      if (b->Mine(piece)) own[piece.parameter].emplace_back(piece.offset, piece.size);
    }
  }
  b->owned_.resize(sizes.size());
  for (size_t p = 0; p < sizes.size(); ++p) {
    std::sort(own[p].begin(), own[p].end());
    for (auto [offset, size] : own[p]) {
      nn::Optimizer::Share& share = b->owned_[p];
      if (!share.empty() && share.back().end == offset) {
        share.back().end += size;
      } else {
        share.push_back({offset, offset + size});
      }
    }
  }
  for (const BucketLayout::Bucket& bucket : b->layout_.buckets) {
    b->share_offset_.emplace_back();
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      size_t before = 0;  // own elements of the parameter ahead of the piece
      for (const nn::Optimizer::Range& r : b->owned_[piece.parameter]) {
        before += r.begin >= piece.offset ? 0 : std::min(r.end, piece.offset) - r.begin;
      }
      b->share_offset_.back().push_back(before);
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
    const BucketLayout::Bucket& bucket = layout_.buckets[index];
    for (const HostTransfer& copy : copies_[index]) status.Update(copy.Wait());
    const absl::Span<float> host(host_ + bucket.host_begin, bucket.host_size);
    if (status.ok() && !skip) {
      if (int8()) {
        const absl::Span<float> residual(residual_.data() + bucket.host_begin, bucket.host_size);
        status = shard_ ? group_.ReduceScatterSumHostInt8(host, residual) : group_.AllReduceSumHostInt8(host, residual);
      } else {
        std::vector<const float*> held;  // the earlier groups' parts of the bucket
        for (const std::vector<float>& part : held_) held.push_back(part.data() + bucket.host_begin);
        status = shard_ ? group_.ReduceScatterSumHostParts(host, held) : group_.AllReduceSumHostParts(host, held);
      }
    }
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat("summing gradient bucket ", index, " of ", layout_.buckets.size(),
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
  for (; next_ < layout_.buckets.size() && layout_.buckets[next_].lowest_parameter >= first; ++next_) {
    std::vector<HostTransfer>& copies = copies_[next_];
    copies.clear();
    for (const BucketLayout::Piece& piece : layout_.buckets[next_].pieces) {
      const DeviceSpan<float> gradient = gradients_[piece.parameter].subspan(piece.offset, piece.size);
      ASSIGN_OR_RETURN(HostTransfer copy, backend_.CopyToHostAsync(DeviceSpan<const float>(gradient), HostOf(piece)));
      copies.push_back(std::move(copy));
    }
    absl::MutexLock lock(&mu_);
    queue_.push_back(next_);
  }
  return absl::OkStatus();
}

absl::Status GradientBuckets::Hold(int group) {
  if (group < 0 || static_cast<size_t>(group) >= held_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", group, " is not one held before the last of ",
                                                   held_.size() + 1));
  }
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      RETURN_IF_ERROR(backend_.CopyToHost(
          DeviceSpan<const float>(gradients_[piece.parameter].subspan(piece.offset, piece.size)),
          absl::Span<float>(held_[group].data() + piece.host_offset, piece.size)));
    }
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
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      if (!status.ok()) break;
      if (!Mine(piece)) continue;  // sharded: another rank's sum
      status = backend_.CopyToDevice(absl::Span<const float>(HostOf(piece)), gradients_[piece.parameter].subspan(piece.offset, piece.size));
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

absl::Status GradientBuckets::GatherPieces(
    const std::function<absl::Status(const BucketLayout::Piece&, size_t, absl::Span<float>)>& fill) {
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const BucketLayout::Bucket& bucket = layout_.buckets[b];
    for (size_t i = 0; i < bucket.pieces.size(); ++i) {
      const BucketLayout::Piece& piece = bucket.pieces[i];
      if (Mine(piece)) RETURN_IF_ERROR(fill(piece, share_offset_[b][i], HostOf(piece)));
    }
    RETURN_IF_ERROR(group_.AllGatherHost(absl::Span<float>(host_ + bucket.host_begin, bucket.host_size)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> GradientBuckets::GatheredSumsOfSquares() {
  if (!shard_) return absl::FailedPreconditionError("the gradients are not sharded");
  std::vector<DeviceSpan<const float>> spans;
  std::vector<size_t> pieces;
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      if (!Mine(piece)) continue;
      spans.push_back(gradients_[piece.parameter].subspan(piece.offset, piece.size));
      pieces.push_back(piece.norm_piece);
    }
  }
  ASSIGN_OR_RETURN(const std::vector<double> own, backend_.SumsOfSquares(spans));
  // Chunk r holds rank r's terms, as doubles, at their pieces' places.
  const size_t per_rank = 2 * layout_.norm_pieces;
  std::vector<float> gathered(per_rank * static_cast<size_t>(group_.size()), 0.0f);
  float* mine = gathered.data() + per_rank * static_cast<size_t>(group_.rank());
  for (size_t i = 0; i < own.size(); ++i) std::memcpy(mine + 2 * pieces[i], &own[i], sizeof(double));
  RETURN_IF_ERROR(group_.AllGatherHost(absl::MakeSpan(gathered)));
  std::vector<double> terms(layout_.norm_pieces, 0.0);  // an empty parameter's term stays 0
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      std::memcpy(&terms[piece.norm_piece], gathered.data() + per_rank * piece.owner + 2 * piece.norm_piece,
                  sizeof(double));
    }
  }
  return terms;
}

absl::Status GradientBuckets::GatherParameters(const std::vector<DeviceSpan<float>>& values) {
  if (!shard_) return absl::OkStatus();
  if (values.size() != gradients_.size()) return absl::InvalidArgumentError("one value span per parameter");
  RETURN_IF_ERROR(GatherPieces([&](const BucketLayout::Piece& piece, size_t, absl::Span<float> host) {
    return backend_.CopyToHost(DeviceSpan<const float>(values[piece.parameter].subspan(piece.offset, piece.size)),
                               host);
  }));
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      if (Mine(piece)) continue;
      RETURN_IF_ERROR(backend_.CopyToDevice(absl::Span<const float>(HostOf(piece)), values[piece.parameter].subspan(piece.offset, piece.size)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<float>>> GradientBuckets::GatherState(
    const std::vector<DeviceSpan<const float>>& shares) {
  if (!shard_) return absl::FailedPreconditionError("the optimizer state is not sharded");
  if (shares.size() != gradients_.size()) return absl::InvalidArgumentError("one state span per parameter");
  for (size_t p = 0; p < shares.size(); ++p) {
    size_t owned = 0;
    for (const nn::Optimizer::Range& r : owned_[p]) owned += r.end - r.begin;
    if (shares[p].size() != owned) {
      return absl::FailedPreconditionError(absl::StrCat("parameter ", p, " has ", shares[p].size(),
                                                        " elements of state for a share of ", owned));
    }
  }
  RETURN_IF_ERROR(GatherPieces([&](const BucketLayout::Piece& piece, size_t share_offset, absl::Span<float> host) {
    return backend_.CopyToHost(shares[piece.parameter].subspan(share_offset, piece.size), host);
  }));
  std::vector<std::vector<float>> out(gradients_.size());
  for (size_t p = 0; p < out.size(); ++p) out[p].assign(gradients_[p].size(), 0.0f);
  for (const BucketLayout::Bucket& bucket : layout_.buckets) {
    for (const BucketLayout::Piece& piece : bucket.pieces) {
      const absl::Span<float> host = HostOf(piece);
      std::copy(host.begin(), host.end(), out[piece.parameter].begin() + piece.offset);
    }
  }
  return out;
}

}  // namespace shardline::worker::runtime
