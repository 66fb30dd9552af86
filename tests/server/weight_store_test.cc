#include "server/weight_store.h"

#include <filesystem>
#include <vector>

#include "common/file_util.h"
#include "common/shard_digest.h"
#include "gtest/gtest.h"
#include "tests/server/weight_store_fixture.h"

namespace shardline::server {
namespace {

TEST_F(WeightStoreTest, AStepCommitsWhenEveryShardHasArrived) {
  EXPECT_EQ(store_->CommittedStep("j").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(*store_->Report(Shard("j", 1, 100)));
  EXPECT_EQ(store_->CommittedStep("j").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(*store_->Report(Shard("j", 0, 100)));
  EXPECT_EQ(*store_->CommittedStep("j"), 100);

  auto exported = store_->ExportWeights("j", {{"format", "pt"}});
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(exported->tensors.size(), 2u) << "optimizer state is not exported";
  EXPECT_EQ(exported->metadata.at("step"), "100");
  auto shard = store_->FetchShard("j", 1);
  ASSERT_TRUE(shard.ok());
  EXPECT_EQ(shard->tensors.size(), 2u) << "recovery gets the optimizer state too";
}

TEST_F(WeightStoreTest, ExportHasTheLayoutOfOneWholeFile) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 5)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 1, 5)).ok());
  common::SafetensorsContents whole;
  whole.tensors.emplace("tok_emb.weight", Values({3, 4}, 5));
  whole.tensors.emplace("lm_head.weight", Values({3, 4}, 6));
  whole.metadata = {{"format", "pt"}, {"step", "5"}};
  auto exported = store_->ExportWeights("j", {{"format", "pt"}});
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(*common::SerializeSafetensors(*exported), *common::SerializeSafetensors(whole));
}

// An export is read as it streams, from the version committed when it
// began: a newer commit meanwhile (which deletes the older files) changes
// nothing of it.
TEST_F(WeightStoreTest, AnExportUnderWayKeepsItsVersionThroughANewerCommit) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 5)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 1, 5)).ok());
  const std::string at5 = *common::SerializeSafetensors(*store_->ExportWeights("j", {}));
  auto open = store_->OpenWeights("j", {});
  ASSERT_TRUE(open.ok()) << open.status();
  const std::string head = *(*open)->Read(0, 100);
  ASSERT_TRUE(store_->Report(Shard("j", 0, 10)).ok());
  ASSERT_TRUE(*store_->Report(Shard("j", 1, 10)));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/j/step-5")) << "the older version's files are gone";
  EXPECT_EQ(head + *(*open)->Read(100, (*open)->size()), at5);
  EXPECT_NE(*common::SerializeSafetensors(*store_->ExportWeights("j", {})), at5) << "a new export sees step 10";
}

// Another job's weights as a job's version of step 0: weights alone, one
// shard, what the other exports; refused for a job with shards.
TEST_F(WeightStoreTest, AJobIsSeededWithAnothersWeightsAsItsStepZero) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 5)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 1, 5)).ok());
  EXPECT_EQ(store_->SeedWeights("k", "none").status().code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(*store_->SeedWeights("k", "j"), 5);
  EXPECT_EQ(*store_->CommittedStep("k"), 0);
  auto seeded = store_->FetchShard("k", 0);
  ASSERT_TRUE(seeded.ok()) << seeded.status();
  const auto weights = store_->ExportWeights("j", {});
  ASSERT_EQ(seeded->tensors.size(), 2u) << "no optimizer state";
  for (const auto& [name, tensor] : weights->tensors) {
    ASSERT_EQ(seeded->tensors.count(name), 1u) << name;
    EXPECT_EQ(*common::SerializeSafetensors({{{name, seeded->tensors.at(name)}}, {}}),
              *common::SerializeSafetensors({{{name, tensor}}, {}}));
  }
  EXPECT_EQ(seeded->metadata.at("init_step"), "5");
  EXPECT_EQ(store_->SeedWeights("k", "j").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(std::filesystem::is_empty(root_ + "/.uploads")) << "nothing left behind";
  auto reopened = WeightStore::Open(root_);
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(*(*reopened)->CommittedStep("k"), 0);
}

TEST_F(WeightStoreTest, ReportsAreIdempotentAndContradictionsRefused) {
  ASSERT_FALSE(*store_->Report(Shard("j", 0, 10)));
  EXPECT_FALSE(*store_->Report(Shard("j", 0, 10))) << "a retried report is accepted once";
  EXPECT_EQ(store_->Report(Shard("j", 0, 10, /*salt=*/1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ShardReport three = Shard("j", 1, 10);
  three.key.shard_count = 3;
  EXPECT_EQ(store_->Report(three).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(*store_->Report(Shard("j", 1, 10)));
  EXPECT_FALSE(*store_->Report(Shard("j", 1, 10))) << "retry after the commit";
  EXPECT_EQ(store_->Report(Shard("j", 0, 9)).status().code(), absl::StatusCode::kFailedPrecondition)
      << "older than the committed version";
}

TEST_F(WeightStoreTest, ANewerCommitReplacesTheOlderVersionOnDisk) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 1)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 1, 1)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 0, 2)).ok());  // step 2 never completes
  ASSERT_TRUE(store_->Report(Shard("j", 0, 3)).ok());
  ASSERT_TRUE(*store_->Report(Shard("j", 1, 3)));
  EXPECT_EQ(*store_->CommittedStep("j"), 3);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/j/step-1"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/j/step-2"));
  EXPECT_TRUE(std::filesystem::exists(root_ + "/j/step-3/shard-1.safetensors"));
}

TEST_F(WeightStoreTest, ARestartedStoreServesTheCommittedVersion) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 7)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 1, 7)).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 0, 8)).ok());  // pending, lost with the restart
  const std::string before = *common::SerializeSafetensors(*store_->ExportWeights("j", {}));
  store_.reset();
  auto reopened = WeightStore::Open(root_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*(*reopened)->CommittedStep("j"), 7);
  EXPECT_EQ(*common::SerializeSafetensors(*(*reopened)->ExportWeights("j", {})), before);
  EXPECT_TRUE((*reopened)->Report(Shard("j", 1, 8)).ok());
}

int64_t BytesUnder(const std::string& dir) {
  int64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += static_cast<int64_t>(entry.file_size());
  }
  return bytes;
}

TEST_F(WeightStoreTest, ADeletedJobLosesItsCheckpointAndTakesNoMoreShards) {
  for (const std::string job : {"j", "k"}) {
    ASSERT_TRUE(store_->Report(Shard(job, 0, 3)).ok());
    ASSERT_TRUE(*store_->Report(Shard(job, 1, 3)));
  }
  ASSERT_TRUE(store_->Report(Shard("j", 0, 4)).ok());  // pending
  const int64_t bytes = BytesUnder(root_ + "/j");
  ASSERT_GT(bytes, 0);
  // The committed version's size is its shard files'.
  EXPECT_EQ(store_->CommittedVersion("j")->bytes, BytesUnder(root_ + "/j/step-3"));
  auto freed = store_->DeleteJob("j");
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_EQ(*freed, bytes);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/j"));
  EXPECT_FALSE(std::filesystem::exists(root_ + "/.deleted/j"));
  EXPECT_EQ(store_->CommittedStep("j").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ExportWeights("j", {}).status().code(), absl::StatusCode::kNotFound);
  // A shard still on its way (any epoch) is refused: the directory stays gone.
  ShardReport late = Shard("j", 1, 4);
  late.key.epoch = 1000;
  EXPECT_EQ(store_->Report(late).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->BeginUpload(late.key, 8, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/j"));
  // Nothing left to free; a malformed id is refused.
  EXPECT_EQ(*store_->DeleteJob("j"), 0);
  EXPECT_EQ(store_->DeleteJob("../k").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->DeleteJob(".uploads").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(std::filesystem::exists(root_ + "/.uploads"));

  // The other job is untouched, before and after a restart.
  EXPECT_EQ(*store_->CommittedStep("k"), 3);
  store_.reset();
  auto reopened = WeightStore::Open(root_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ(*(*reopened)->CommittedStep("k"), 3);
  EXPECT_EQ((*reopened)->CommittedVersion("k")->bytes, BytesUnder(root_ + "/k/step-3")) << "counted again on open";
  EXPECT_EQ((*reopened)->CommittedStep("j").status().code(), absl::StatusCode::kNotFound);
}

// A coordinator killed after moving a checkpoint aside: reopening removes it.
TEST_F(WeightStoreTest, ADeletionCutShortIsFinishedByTheNextOpen) {
  ASSERT_TRUE(store_->Report(Shard("k", 0, 2)).ok());
  ASSERT_TRUE(*store_->Report(Shard("k", 1, 2)));
  store_.reset();
  std::filesystem::create_directories(root_ + "/.deleted/j/step-5");
  ASSERT_TRUE(common::WriteFileAtomically(root_ + "/.deleted/j/step-5/shard-0.safetensors", "x").ok());
  auto reopened = WeightStore::Open(root_);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_FALSE(std::filesystem::exists(root_ + "/.deleted"));
  EXPECT_EQ(*(*reopened)->CommittedStep("k"), 2);
}

TEST_F(WeightStoreTest, MalformedReportsAreRefused) {
  const std::vector<std::string> bad_ids = {"", "../etc", "a/b", ".", std::string(65, 'x')};
  for (const std::string& bad : bad_ids) {
    EXPECT_EQ(store_->Report(Shard(bad, 0, 1)).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  ShardReport r = Shard("j", 2, 1);
  EXPECT_EQ(store_->Report(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Shard("j", 0, -1);
  EXPECT_EQ(store_->Report(r).status().code(), absl::StatusCode::kInvalidArgument);
  r = Shard("j", 0, 1);
  r.contents.tensors.clear();
  EXPECT_EQ(store_->Report(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->FetchShard("nope", 0).status().code(), absl::StatusCode::kNotFound);
}

// A re-plan fences the job's epoch: shards of the old epoch are refused,
// also one whose upload began before the fence (it was on the wire while
// the job moved on), and the pending shards of the old epoch are gone.
TEST_F(WeightStoreTest, ShardsBehindTheEpochFenceAreRefused) {
  ShardReport old_epoch = Shard("j", 0, 4);
  old_epoch.key.epoch = 3;
  ASSERT_FALSE(*store_->Report(old_epoch));  // pending: shard 1 is missing
  ShardReport late = Shard("j", 1, 4);
  late.key.epoch = 3;
  const std::string bytes = *common::SerializeSafetensors(late.contents);
  const uint64_t digest = common::ShardDigest::Of(bytes);
  auto writer = store_->BeginUpload(late.key, static_cast<int64_t>(bytes.size()), digest);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(bytes).ok());

  store_->DropUncommitted("j", 4);
  auto path = (*writer)->Finish();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(store_->Ingest(late.key, *path, digest).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->BeginUpload(late.key, 8, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_->Report(old_epoch).status().code(), absl::StatusCode::kFailedPrecondition);

  // The new epoch starts step 4 afresh, on another cut.
  ShardReport fresh = Shard("j", 0, 4);
  fresh.key.epoch = 4;
  fresh.key.shard_count = 1;
  EXPECT_TRUE(*store_->Report(fresh)) << "one shard makes the new cut's step";
  EXPECT_EQ(*store_->CommittedStep("j"), 4);
}

TEST_F(WeightStoreTest, ExportAndFetchReadTheTensorsByName) {
  ASSERT_TRUE(store_->Report(Shard("j", 0, 5)).ok());
  ASSERT_TRUE(*store_->Report(Shard("j", 1, 5)));
  auto fetched = store_->FetchTensors("j", {"lm_head.weight"});
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  ASSERT_EQ(fetched->tensors.size(), 2u) << "the weight and its optimizer state";
  EXPECT_EQ(fetched->tensors.at("lm_head.weight").values<float>()[0], 6.5f);
  EXPECT_EQ(fetched->metadata.at("step"), "5");
  EXPECT_EQ(store_->FetchTensors("j", {"nope"}).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shardline::server
