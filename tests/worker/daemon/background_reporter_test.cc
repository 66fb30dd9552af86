// BackgroundReporter: reports go out in order off the stage's thread, a
// checkpoint's digest travels with its report, the upload runs while the
// stage goes on, one snapshot at a time, and errors reach the stage.
#include "worker/background_reporter.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "common/shard_digest.h"
#include "gtest/gtest.h"

namespace shardline::worker {
namespace {

class FakeReporter final : public StageReporter {
 public:
  absl::StatusOr<bool> ReportStep(const shardline::v1::ReportStepRequest& report) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(report);
    if (!step_error_.ok()) return step_error_;
    return report.step() >= stop_at_;
  }
  absl::Status ReportShard(const ShardSnapshot& shard, const std::atomic<bool>& cancelled) override {
    {
      absl::MutexLock lock(&mu_);
      uploading_ = true;
      auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return release_uploads_ || cancelled.load(); };
      while (!mu_.AwaitWithTimeout(absl::Condition(&go), absl::Milliseconds(5))) {
      }
      uploading_ = false;
      if (cancelled) return absl::CancelledError("abandoned");
      shards_.push_back(shard.Bytes());
      digests_.push_back(shard.header().digest());
    }
    return upload_error_;
  }
  absl::StatusOr<common::SafetensorsContents> FetchState(const shardline::v1::FetchStateRequest&) override {
    return absl::UnimplementedError("");
  }
  absl::StatusOr<common::SafetensorsContents> FetchStateFromTwin(const std::string&,
                                                                 const shardline::v1::FetchStateRequest&) override {
    return absl::UnimplementedError("");
  }

  absl::Mutex mu_;
  std::vector<shardline::v1::ReportStepRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> shards_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> digests_ ABSL_GUARDED_BY(mu_);
  bool release_uploads_ ABSL_GUARDED_BY(mu_) = true;
  bool uploading_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status step_error_;
  absl::Status upload_error_;
  int64_t stop_at_ = 1 << 30;
};

shardline::v1::ReportStepRequest Step(int64_t step) {
  shardline::v1::ReportStepRequest r;
  r.set_step(step);
  return r;
}

std::unique_ptr<ShardSnapshot> Snapshot(int64_t step) {
  common::SafetensorsContents c;
  c.tensors.emplace("w", *common::Tensor::FromValues<float>({3}, std::vector<float>{1, 2, float(step)}));
  shardline::v1::ShardHeader h;
  h.set_job_id("job-1");
  h.set_step(step);
  return *ShardSnapshot::Create(h, std::move(c));
}

TEST(BackgroundReporterTest, ReportsGoInOrderWithTheCheckpointsDigestAndItsShard) {
  FakeReporter fake;
  std::atomic<bool> cancelled{false};
  StateCache cache;
  BackgroundReporter background(fake, cache, cancelled);
  background.Report(Step(1));
  std::unique_ptr<ShardSnapshot> shard = Snapshot(2);
  const std::string bytes = shard->Bytes();
  background.WaitForSnapshotSlot();
  background.ReportCheckpoint(Step(2), std::move(shard), /*upload=*/true);
  background.Report(Step(3));
  ASSERT_TRUE(background.Flush().ok());
  absl::MutexLock lock(&fake.mu_);
  ASSERT_EQ(fake.steps_.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(fake.steps_[i].step(), i + 1);
  EXPECT_EQ(fake.steps_[1].shard_digest(), common::ShardDigest::Of(bytes));
  EXPECT_EQ(fake.steps_[0].shard_digest(), 0u);
  ASSERT_EQ(fake.shards_.size(), 1u);
  EXPECT_EQ(fake.shards_[0], bytes);
  EXPECT_EQ(fake.digests_[0], common::ShardDigest::Of(bytes));
}

TEST(BackgroundReporterTest, TheStageGoesOnDuringAnUploadButTheNextCheckpointWaitsForIt) {
  FakeReporter fake;
  {
    absl::MutexLock lock(&fake.mu_);
    fake.release_uploads_ = false;
  }
  std::atomic<bool> cancelled{false};
  StateCache cache;
  BackgroundReporter background(fake, cache, cancelled);
  background.ReportCheckpoint(Step(1), Snapshot(1), /*upload=*/true);
  for (int step = 2; step <= 5; ++step) background.Report(Step(step));
  {
    absl::MutexLock lock(&fake.mu_);
    auto sent = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(fake.mu_) { return fake.steps_.size() == 5 && fake.uploading_; };
    ASSERT_TRUE(fake.mu_.AwaitWithTimeout(absl::Condition(&sent), absl::Seconds(10)))
        << "the reports after a checkpoint did not go out while its upload ran";
  }
  absl::Notification slot;
  std::thread next_checkpoint([&] {
    background.WaitForSnapshotSlot();
    slot.Notify();
  });
  EXPECT_FALSE(slot.WaitForNotificationWithTimeout(absl::Milliseconds(200))) << "two snapshots at once";
  {
    absl::MutexLock lock(&fake.mu_);
    fake.release_uploads_ = true;
  }
  EXPECT_TRUE(slot.WaitForNotificationWithTimeout(absl::Seconds(10)));
  next_checkpoint.join();
  EXPECT_TRUE(background.Flush().ok());
}

// Each snapshot, once its digest is known, is the worker's cache's (what a
// restart or a twin loads from), and its memory the next snapshot's.
TEST(BackgroundReporterTest, SnapshotsGoToTheCacheAndTheirMemoryComesBack) {
  FakeReporter fake;
  std::atomic<bool> cancelled{false};
  StateCache cache;
  BackgroundReporter background(fake, cache, cancelled);
  std::unique_ptr<ShardSnapshot> first = Snapshot(4);
  const void* memory = first->tensors().at("w").raw_data();
  background.ReportCheckpoint(Step(4), std::move(first), /*upload=*/true);
  ASSERT_TRUE(background.Flush().ok());
  std::shared_ptr<const ShardSnapshot> held = cache.Get("job-1", 4);
  ASSERT_NE(held, nullptr);
  EXPECT_NE(held->header().digest(), 0u);
  EXPECT_EQ(cache.Get("job-1", 3), nullptr);
  EXPECT_EQ(cache.Get("job-2", 4), nullptr);
  EXPECT_TRUE(background.WaitForSnapshotSlot().empty()) << "read (held here): not handed out";
  held.reset();
  ASSERT_NE(cache.Get("job-1", 4), nullptr) << "still there";
  std::map<std::string, common::Tensor> reused = background.WaitForSnapshotSlot();
  ASSERT_EQ(reused.count("w"), 1u);
  EXPECT_EQ(reused.at("w").raw_data(), memory) << "the same memory, not a copy";
  EXPECT_EQ(cache.Get("job-1", 4), nullptr) << "being written over: no longer served";
}

TEST(BackgroundReporterTest, OnlyReplicaZeroUploadsTheOthersSendTheirDigest) {
  FakeReporter fake;
  std::atomic<bool> cancelled{false};
  StateCache cache;
  BackgroundReporter background(fake, cache, cancelled);
  background.ReportCheckpoint(Step(1), Snapshot(1), /*upload=*/false);
  background.WaitForSnapshotSlot();  // free once the digest went out
  ASSERT_TRUE(background.Flush().ok());
  absl::MutexLock lock(&fake.mu_);
  EXPECT_TRUE(fake.shards_.empty());
  EXPECT_NE(fake.steps_.at(0).shard_digest(), 0u);
}

TEST(BackgroundReporterTest, ErrorsAndTheCoordinatorsStopReachTheStage) {
  {
    FakeReporter fake;
    fake.upload_error_ = absl::FailedPreconditionError("epoch 3 is stale");
    std::atomic<bool> cancelled{false};
  StateCache cache;
    BackgroundReporter background(fake, cache, cancelled);
    background.ReportCheckpoint(Step(4), Snapshot(4), true);
    const absl::Status s = background.Flush();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("checkpoint of step 4"), std::string::npos) << s;
    EXPECT_EQ(background.status(), s);
  }
  {
    FakeReporter fake;
    fake.stop_at_ = 2;
    std::atomic<bool> cancelled{false};
  StateCache cache;
    BackgroundReporter background(fake, cache, cancelled);
    background.Report(Step(1));
    background.Report(Step(2));
    background.Report(Step(3));
    EXPECT_EQ(background.Flush().code(), absl::StatusCode::kCancelled);
    absl::MutexLock lock(&fake.mu_);
    EXPECT_EQ(fake.steps_.size(), 2u) << "nothing goes out after the stop";
  }
}

TEST(BackgroundReporterTest, ACancelledJobCutsTheUploadAndEndsTheWaits) {
  FakeReporter fake;
  {
    absl::MutexLock lock(&fake.mu_);
    fake.release_uploads_ = false;
  }
  std::atomic<bool> cancelled{false};
  StateCache cache;
  BackgroundReporter background(fake, cache, cancelled);
  background.ReportCheckpoint(Step(1), Snapshot(1), true);
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(100));
    cancelled = true;
  });
  EXPECT_EQ(background.Flush().code(), absl::StatusCode::kCancelled);
  cancel.join();
  background.Abandon();  // returns: the upload saw its cancellation
  absl::MutexLock lock(&fake.mu_);
  EXPECT_TRUE(fake.shards_.empty());
}

}  // namespace
}  // namespace shardline::worker
