#include "worker/background_reporter.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"

namespace shardline::worker {

BackgroundReporter::BackgroundReporter(StageReporter& inner, StateCache& cache, const std::atomic<bool>& cancelled,
                                       size_t max_queued)
    : inner_(inner), cache_(cache), cancelled_(cancelled), max_queued_(max_queued) {
  reports_ = std::thread([this] { SendReports(); });
  uploads_ = std::thread([this] { SendShards(); });
}

BackgroundReporter::~BackgroundReporter() { Abandon(); }

void BackgroundReporter::Fail(const absl::Status& error) {
  if (status_.ok()) status_ = error;
}

void BackgroundReporter::Prepare(std::map<std::string, std::vector<int64_t>> layout) {
  absl::MutexLock lock(&mu_);
  if (closing_ || snapshot_held_ || layout.empty()) return;
  snapshot_held_ = true;  // until it is ready
  to_prepare_ = std::move(layout);
}

bool BackgroundReporter::Idle() const { return queue_.empty() && !sending_ && !snapshot_held_; }

void BackgroundReporter::AwaitOrCancelled(const absl::Condition& condition) {
  while (!mu_.AwaitWithTimeout(condition, absl::Milliseconds(20))) {
    if (cancelled_) {
      abandoned_ = true;  // the upload stops too
      return;
    }
  }
}

void BackgroundReporter::Report(shardline::v1::ReportStepRequest report) {
  absl::MutexLock lock(&mu_);
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() < max_queued_ || closing_ || !status_.ok();
  };
  AwaitOrCancelled(absl::Condition(&room));
  if (closing_ || !status_.ok()) return;  // the stage reads status() before its next step
  queue_.push_back({std::move(report), nullptr, false});
}

std::map<std::string, common::Tensor> BackgroundReporter::WaitForSnapshotSlot() {
  absl::MutexLock lock(&mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !snapshot_held_ || closing_ || !status_.ok(); };
  AwaitOrCancelled(absl::Condition(&free));
  if (snapshot_held_) return {};
  if (!spare_.empty()) return std::move(spare_);
  return cache_.TakeMemory();  // the last snapshot's, unless a twin is reading it
}

void BackgroundReporter::ReportCheckpoint(shardline::v1::ReportStepRequest report,
                                          std::unique_ptr<ShardSnapshot> shard, bool upload) {
  absl::MutexLock lock(&mu_);
  if (closing_ || !status_.ok()) return;
  snapshot_held_ = true;
  queue_.push_back({std::move(report), std::move(shard), upload});
}

absl::Status BackgroundReporter::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

absl::Status BackgroundReporter::Flush() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Idle() || !status_.ok(); };
  AwaitOrCancelled(absl::Condition(&done));
  if (status_.ok() && !Idle()) return absl::CancelledError("the job was cancelled");
  return status_;
}

void BackgroundReporter::Abandon() {
  abandoned_ = true;
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
    queue_.clear();
    to_upload_.reset();
  }
  if (reports_.joinable()) reports_.join();
  if (uploads_.joinable()) uploads_.join();
}

void BackgroundReporter::SendReports() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (closing_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (!status_.ok()) {  // the stage is about to stop: nothing more goes out
        if (item.shard != nullptr) snapshot_held_ = false;
        continue;
      }
      sending_ = true;
    }
    if (item.shard != nullptr) {
      item.report.set_shard_digest(item.shard->ComputeDigest());
      cache_.Put(item.shard);
    }
    absl::StatusOr<bool> stop = inner_.ReportStep(item.report);
    absl::MutexLock lock(&mu_);
    sending_ = false;
    if (!stop.ok()) {
      Fail(stop.status());
    } else if (*stop) {
      Fail(absl::CancelledError("the coordinator stopped the job"));
    }
    if (item.shard != nullptr) {
      if (item.upload && status_.ok() && !closing_) {
        to_upload_ = std::move(item.shard);
      } else {
        snapshot_held_ = false;
      }
    }
  }
}

void BackgroundReporter::SendShards() {
  while (true) {
    std::shared_ptr<ShardSnapshot> shard;
    std::map<std::string, std::vector<int64_t>> layout;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return closing_ || to_upload_ != nullptr || !to_prepare_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (closing_) return;
      shard = std::move(to_upload_);
      layout = std::move(to_prepare_);
      to_prepare_.clear();
    }
    if (shard == nullptr) {
      // Fresh pages are slow to fault in (seconds per GiB): here, not at
      // the first checkpoint. A tensor that cannot be had now is left to
      // the snapshot.
      std::map<std::string, common::Tensor> tensors;
      for (const auto& [name, shape] : layout) {
        absl::StatusOr<common::Tensor> t = common::Tensor::Zeros(common::DType::kF32, shape);
        if (t.ok()) tensors.emplace(name, *std::move(t));
      }
      absl::MutexLock lock(&mu_);
      spare_ = std::move(tensors);
      snapshot_held_ = false;
      continue;
    }
    const absl::Time start = absl::Now();
    const absl::Status uploaded = inner_.ReportShard(*shard, abandoned_);
    if (uploaded.ok()) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      LOG(INFO) << "job " << shard->header().job_id() << " stage " << shard->header().stage() << ": checkpoint of step "
                << shard->header().step() << " stored (" << shard->size() / (1 << 20) << " MiB in " << seconds
                << " s, in the background)";
    }
    absl::MutexLock lock(&mu_);
    if (!uploaded.ok() && !closing_) {
      Fail(absl::Status(uploaded.code(), absl::StrCat("the checkpoint of step ", shard->header().step(),
                                                      " was not stored: ", uploaded.message())));
    }
    shard.reset();  // the cache's alone now
    snapshot_held_ = false;
  }
}

}  // namespace shardline::worker
