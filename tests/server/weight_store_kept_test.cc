// WeightStore's kept version (early stopping's best weights):
// server/weight_store_kept.cc.
#include <filesystem>
#include <string>

#include "common/file_util.h"
#include "gtest/gtest.h"
#include "server/weight_store.h"
#include "tests/server/weight_store_fixture.h"

namespace shardline::server {
namespace {

namespace fs = std::filesystem;

class WeightStoreKeptTest : public WeightStoreTest {
 protected:
  void Commit(int64_t step) {
    ASSERT_TRUE(store_->Report(Shard("j", 0, step)).ok());
    ASSERT_TRUE(*store_->Report(Shard("j", 1, step))) << "step " << step << " did not commit";
  }
  bool Stored(int64_t step) { return fs::exists(root_ + "/j/step-" + std::to_string(step) + "/shard-1.safetensors"); }
  // The weights of both shards at `step`, as an export serves them.
  std::string WeightsOf(int64_t step) {
    common::SafetensorsContents whole;
    whole.tensors.emplace("tok_emb.weight", Values({3, 4}, step));
    whole.tensors.emplace("lm_head.weight", Values({3, 4}, step + 1));
    whole.metadata = {{"step", std::to_string(step)}};
    return *common::SerializeSafetensors(whole);
  }
  std::string Exported() { return *common::SerializeSafetensors(*store_->ExportWeights("j", {})); }
};

TEST_F(WeightStoreKeptTest, AVersionToKeepOutlivesNewerCommitsAndBecomesTheLastOne) {
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());  // its pass is known before it commits
  Commit(1);
  Commit(2);
  Commit(3);
  Commit(4);
  EXPECT_FALSE(Stored(1));
  EXPECT_TRUE(Stored(2));
  EXPECT_FALSE(Stored(3));
  EXPECT_TRUE(Stored(4));
  const WeightStore::Version version = *store_->CommittedVersion("j");
  EXPECT_EQ(version.step, 4);
  EXPECT_EQ(version.kept_step, 2);
  int64_t on_disk = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root_ + "/j")) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") on_disk += entry.file_size();
  }
  EXPECT_EQ(version.bytes, on_disk) << "both versions count";
  EXPECT_EQ(Exported(), WeightsOf(4)) << "exports serve the committed version until the job ends";

  auto restored = store_->RestoreKept("j");
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 2);
  EXPECT_EQ(*store_->CommittedStep("j"), 2);
  EXPECT_EQ(Exported(), WeightsOf(2));
  EXPECT_FALSE(Stored(4));
  EXPECT_EQ(store_->FetchTensors("j", {"lm_head.weight"})->metadata.at("step"), "2");
}

TEST_F(WeightStoreKeptTest, ANewBestReplacesTheKeptVersionOnceItCommits) {
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  Commit(2);
  ASSERT_TRUE(store_->KeepVersion("j", 4).ok());
  Commit(3);
  EXPECT_TRUE(Stored(2)) << "kept until the new best is stored";
  Commit(4);
  EXPECT_FALSE(Stored(2));
  EXPECT_FALSE(Stored(3));
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, 4);
  Commit(5);
  EXPECT_TRUE(Stored(4));
  EXPECT_EQ(store_->RestoreKept("j")->step, 4);
  EXPECT_EQ(Exported(), WeightsOf(4));
}

TEST_F(WeightStoreKeptTest, TheCommittedVersionCanBeKept) {
  Commit(2);
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  Commit(3);
  EXPECT_TRUE(Stored(2));
  ASSERT_TRUE(store_->KeepVersion("j", 3).ok());
  EXPECT_FALSE(Stored(2)) << "the version kept before goes";
  Commit(4);
  EXPECT_TRUE(Stored(3));
  EXPECT_FALSE(Stored(2));
}

// A validation step whose pass is not known when its version is complete
// (another replica's report late): neither it nor a later version commits
// until the pass is known (a restart from either would never run that
// pass again); then the complete ones commit in order, the best kept.
TEST_F(WeightStoreKeptTest, AVersionAndLaterOnesWaitForItsPass) {
  Commit(1);
  store_->AwaitPass("j", 2);
  store_->AwaitPass("j", 3);
  auto report = [&](int shard, int64_t step) { return *store_->Report(Shard("j", shard, step)); };
  for (int64_t step : {2, 3, 4}) {
    EXPECT_FALSE(report(0, step));
    EXPECT_FALSE(report(1, step)) << "step " << step << " is complete but waits for the pass after step 2";
  }
  EXPECT_EQ(*store_->CommittedStep("j"), 1);
  EXPECT_TRUE(Stored(2));
  EXPECT_TRUE(Stored(4));
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  EXPECT_EQ(*store_->CommittedStep("j"), 2) << "step 3's pass still holds 3 and 4 back";
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, 2);
  ASSERT_TRUE(store_->ReleaseVersion("j", 3).ok());
  EXPECT_EQ(*store_->CommittedStep("j"), 4) << "both passes known: the latest complete version";
  EXPECT_FALSE(Stored(3));
  EXPECT_TRUE(Stored(2)) << "kept";
  Commit(5);
  EXPECT_TRUE(Stored(2));
  EXPECT_FALSE(Stored(4));
  EXPECT_EQ(store_->KeepVersion("j", 4).code(), absl::StatusCode::kFailedPrecondition) << "gone";
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, 2);
  EXPECT_EQ(store_->RestoreKept("j")->step, 2);
  EXPECT_EQ(Exported(), WeightsOf(2));
}

// A failover while versions wait: they are dropped with the waits, and the
// steps run again (their passes too) commit as they come.
TEST_F(WeightStoreKeptTest, DroppingTheUncommittedDropsTheWaitingVersions) {
  Commit(1);
  store_->AwaitPass("j", 2);
  EXPECT_TRUE(store_->Report(Shard("j", 0, 2)).ok());
  EXPECT_FALSE(*store_->Report(Shard("j", 1, 2)));
  store_->DropUncommitted("j", 1);
  EXPECT_FALSE(Stored(2));
  EXPECT_EQ(*store_->CommittedStep("j"), 1);
  auto again = [](int shard) {
    ShardReport r = Shard("j", shard, 2);
    r.key.epoch = 1;
    return r;
  };
  ASSERT_TRUE(store_->Report(again(0)).ok());
  EXPECT_TRUE(*store_->Report(again(1))) << "its pass is known this time: it commits";
}

TEST_F(WeightStoreKeptTest, ARestartedStoreKnowsItsKeptVersion) {
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  Commit(2);
  Commit(3);
  EXPECT_NE(common::ReadFile(root_ + "/j/manifest.json")->find("\"kept_step\": 2"), std::string::npos);
  store_.reset();
  store_ = std::move(*WeightStore::Open(root_));
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, 2);
  Commit(4);
  EXPECT_TRUE(Stored(2));
  EXPECT_EQ(store_->RestoreKept("j")->step, 2);
  store_.reset();
  store_ = std::move(*WeightStore::Open(root_));
  EXPECT_EQ(*store_->CommittedStep("j"), 2);
  EXPECT_EQ(Exported(), WeightsOf(2));
}

TEST_F(WeightStoreKeptTest, AStoreWhoseKeptVersionLostAShardRefusesToOpen) {
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  Commit(2);
  Commit(3);
  store_.reset();
  fs::remove(root_ + "/j/step-2/shard-1.safetensors");
  auto reopened = WeightStore::Open(root_);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(reopened.status().message().find("shard 1 of step 2, the kept version, is missing"), std::string::npos)
      << reopened.status();
}

TEST_F(WeightStoreKeptTest, AKeptVersionSurvivesTheEpochFenceAndAVersionToKeepCommitsAgain) {
  ASSERT_TRUE(store_->KeepVersion("j", 2).ok());
  Commit(2);
  Commit(3);
  ASSERT_TRUE(store_->KeepVersion("j", 5).ok());
  ASSERT_TRUE(store_->Report(Shard("j", 0, 5)).ok());  // then the job restarts from step 3
  store_->DropUncommitted("j", 1);
  EXPECT_TRUE(Stored(2));
  EXPECT_FALSE(fs::exists(root_ + "/j/step-5"));
  ShardReport again = Shard("j", 0, 5);
  again.key.epoch = 1;
  ASSERT_TRUE(store_->Report(again).ok());
  again = Shard("j", 1, 5);
  again.key.epoch = 1;
  ASSERT_TRUE(*store_->Report(again));
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, 5) << "the step's pass was known: its version is kept";
  EXPECT_FALSE(Stored(2));
}

TEST_F(WeightStoreKeptTest, WithNothingKeptTheCommittedVersionStays) {
  Commit(2);
  EXPECT_EQ(store_->CommittedVersion("j")->kept_step, -1);
  EXPECT_EQ(store_->RestoreKept("j")->step, 2);
  EXPECT_EQ(store_->RestoreKept("none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->KeepVersion("../x", 1).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::server
