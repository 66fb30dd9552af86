#include "server/shard_uploads.h"

#include <filesystem>

#include "common/file_util.h"
#include "common/shard_digest.h"
#include "gtest/gtest.h"

namespace shardline::server {
namespace {

class ShardUploadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/uploads-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    uploads_ = std::move(*ShardUploads::Open(dir_));
  }
  std::string dir_;
  std::unique_ptr<ShardUploads> uploads_;
  const UploadKey key_{"job-1", 7, 1, 20};
  const std::string bytes_ = std::string(1000, 'a') + std::string(999, 'b');
  const uint64_t digest_ = common::ShardDigest::Of(bytes_);
};

TEST_F(ShardUploadsTest, ABrokenStreamIsResumedFromTheBytesAlreadyThere) {
  {
    auto first = uploads_->Begin(key_, static_cast<int64_t>(bytes_.size()), digest_);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ((*first)->offset(), 0);
    ASSERT_TRUE((*first)->Append(bytes_.substr(0, 1200)).ok());
    EXPECT_EQ((*first)->Finish().status().code(), absl::StatusCode::kInvalidArgument) << "short";
  }  // the stream broke
  auto second = uploads_->Begin(key_, static_cast<int64_t>(bytes_.size()), digest_);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ((*second)->offset(), 1200);
  ASSERT_TRUE((*second)->Append(bytes_.substr(1200)).ok());
  EXPECT_EQ((*second)->Append("x").code(), absl::StatusCode::kInvalidArgument) << "past the declared length";
  absl::StatusOr<std::string> path = (*second)->Finish();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*common::ReadFile(*path), bytes_);
  second->reset();
  EXPECT_EQ(uploads_->size(), 0u) << "a finished upload is over";
}

TEST_F(ShardUploadsTest, OneStreamAtATimeAndAnotherFileStartsOver) {
  auto writer = uploads_->Begin(key_, static_cast<int64_t>(bytes_.size()), digest_);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(bytes_.substr(0, 10)).ok());
  EXPECT_EQ(uploads_->Begin(key_, static_cast<int64_t>(bytes_.size()), digest_).status().code(),
            absl::StatusCode::kUnavailable);
  writer->reset();
  auto other = uploads_->Begin(key_, 50, common::ShardDigest::Of(std::string(50, 'z')));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->offset(), 0) << "another length: not the same file";
}

TEST_F(ShardUploadsTest, CorruptedBytesAreRefusedAndDiscarded) {
  std::string corrupted = bytes_;
  corrupted[1500] ^= 1;
  {
    auto writer = uploads_->Begin(key_, static_cast<int64_t>(bytes_.size()), digest_);
    ASSERT_TRUE((*writer)->Append(corrupted).ok());
    EXPECT_EQ((*writer)->Finish().status().code(), absl::StatusCode::kDataLoss);
  }
  EXPECT_EQ(uploads_->size(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

TEST_F(ShardUploadsTest, DroppedEpochsGoAlsoWhileAStreamWrites) {
  auto writing = uploads_->Begin(key_, 100, 1);
  UploadKey newer = key_;
  newer.epoch = 8;
  ASSERT_TRUE(uploads_->Begin(newer, 100, 1).ok());
  UploadKey other_job = key_;
  other_job.job_id = "job-2";
  ASSERT_TRUE(uploads_->Begin(other_job, 100, 1).ok());
  EXPECT_EQ(uploads_->size(), 3u);
  uploads_->Drop("job-1", 8);
  EXPECT_EQ(uploads_->size(), 3u) << "the one being written stays until its stream ends";
  writing->reset();
  EXPECT_EQ(uploads_->size(), 2u);
}

TEST_F(ShardUploadsTest, OpenEmptiesTheDirectory) {
  ASSERT_TRUE(uploads_->Begin(key_, 100, 1).ok());
  uploads_.reset();
  uploads_ = std::move(*ShardUploads::Open(dir_));
  EXPECT_EQ(uploads_->size(), 0u);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

}  // namespace
}  // namespace shardline::server
