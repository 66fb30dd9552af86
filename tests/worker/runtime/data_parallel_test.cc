// Data parallelism against the reference trainer (design brief §10): d
// replicas of a p-stage pipeline, each stage's replicas summing their
// gradients through the in-process collective, must give the losses, grad
// norms and weights of shardline-train with the same spec bit for bit, for
// (p, d) in {(1,2), (2,2), (3,2), (1,4)}, uneven cuts and both schedules;
// the replicas of a stage hold the same weights after every step; and the
// run stays within 1e-4 of the d = 1 run of the same global batch, from
// which only the order of the sums differs.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_grid.h"
#include "tests/worker/nn/nn_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::runtime {
namespace {

struct Case {
  std::vector<int> cuts;  // first unit of stages 1..p−1; the tiny model has 4 units
  int replicas;
  std::string schedule;
  int micro_batches;  // per replica
  double bucket_mib = 25;  // the tiny model's stages: 1/256 MiB is a few buckets each
};

std::string Name(const Case& c) {
  std::string cuts;
  for (int cut : c.cuts) absl::StrAppend(&cuts, "_", cut);
  return absl::StrCat(c.cuts.size() + 1, "stages", cuts, "_", c.replicas, "replicas_", c.schedule, "_m",
                      c.micro_batches, c.bucket_mib < 1 ? "_small_buckets" : "");
}

shardline::v1::JobSpec GridSpec(const Case& c) {
  auto spec = testing::TinySpec(c.micro_batches, /*global_batch=*/2 * c.replicas * c.micro_batches);
  spec.mutable_parallel()->set_pipeline_stages(static_cast<int>(c.cuts.size()) + 1);
  spec.mutable_parallel()->set_schedule(c.schedule);
  spec.mutable_parallel()->set_data_parallel(c.replicas);
  spec.mutable_parallel()->set_bucket_mib(c.bucket_mib);
  spec.mutable_train()->mutable_optimizer()->set_grad_clip(1.0);  // the global norm matters
  return spec;
}

// The weights of replica r's stages, by name.
std::map<std::string, std::vector<float>> Weights(shardline::testing::LocalPipeline& replica) {
  std::map<std::string, std::vector<float>> out;
  auto weights = replica.ExportWeights();
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return out;
  for (const auto& [name, tensor] : *weights) {
    const auto v = tensor.values<float>();
    out[name] = std::vector<float>(v.begin(), v.end());
  }
  return out;
}

class DataParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(DataParallelTest, LossesAndWeightsMatchTheReferenceTrainerBitForBit) {
  const Case& c = GetParam();
  const auto spec = GridSpec(c);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto grid = shardline::testing::LocalGrid::Create(spec, c.cuts);
  ASSERT_TRUE(grid.ok()) << grid.status();
  ASSERT_EQ((*grid)->replicas(), c.replicas);
  for (int step = 1; step <= 4; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*grid)->RunStep(step);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->loss, want->loss) << "step " << step;
    for (int r = 0; r < c.replicas; ++r) {
      for (const StageStepResult& stage : got->results[r]) {
        EXPECT_EQ(stage.grad_norm, want->grad_norm) << "step " << step << " replica " << r;
      }
      EXPECT_EQ(got->results[r].front().tokens, want->tokens / c.replicas) << "each replica trains 1/d";
      for (const StageStepResult& stage : got->results[r]) {
        EXPECT_GT(stage.reduce_seconds, 0.0) << "the replicas summed their gradients";
        EXPECT_GE(stage.reduce_exposed_seconds, 0.0);
      }
    }
    // The replicas of every stage hold the same weights after every step.
    const auto first = Weights((*grid)->replica(0));
    for (int r = 1; r < c.replicas; ++r) {
      EXPECT_TRUE(Weights((*grid)->replica(r)) == first) << "replica " << r << " after step " << step;
    }
  }
  const auto got = Weights((*grid)->replica(0));
  auto want = (*reference)->runtime().ExportWeights();
  ASSERT_TRUE(want.ok());
  ASSERT_EQ(got.size(), want->size());
  for (const auto& [name, tensor] : *want) {
    const auto b = tensor.values<float>();
    ASSERT_EQ(got.at(name), std::vector<float>(b.begin(), b.end())) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, DataParallelTest,
                         ::testing::Values(Case{{}, 2, "1f1b", 2}, Case{{2}, 2, "1f1b", 3},
                                           Case{{1}, 2, "gpipe", 2}, Case{{1, 3}, 2, "1f1b", 3},
                                           Case{{1, 2}, 2, "gpipe", 2}, Case{{}, 4, "1f1b", 2},
                                           Case{{}, 4, "gpipe", 1}, Case{{2}, 2, "1f1b", 3, 1.0 / 256},
                                           Case{{1, 3}, 3, "gpipe", 2, 1.0 / 256}),
                         [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

// The same global batch with d = 1 (d·m micro-batches of the same size):
// the sums run in another order (one accumulation instead of d groups added
// in rank order), nothing else differs.
TEST(DataParallelTest, StaysWithinFloatRoundingOfTheSingleReplicaRun) {
  const Case c{{2}, 2, "1f1b", 2};
  const auto spec = GridSpec(c);
  auto single = spec;
  single.mutable_parallel()->set_data_parallel(1);
  single.mutable_train()->set_micro_batches(c.replicas * c.micro_batches);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(single, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto grid = shardline::testing::LocalGrid::Create(spec, c.cuts);
  ASSERT_TRUE(grid.ok()) << grid.status();
  double worst = 0;
  for (int step = 1; step <= 25; ++step) {
    auto want = (*reference)->TrainStep(step);
    auto got = (*grid)->RunStep(step);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " / " << got.status();
    EXPECT_NEAR(got->loss, want->loss, 1e-4 * std::fabs(want->loss)) << "step " << step;
    worst = std::max(worst, std::fabs(got->loss - want->loss) / std::fabs(want->loss));
  }
  RecordProperty("worst_relative_loss_gap", absl::StrCat(worst));
}

// A replica that fails its step fails its twins at once (they do not wait
// out the group's timeout for it).
TEST(DataParallelTest, AFailedReplicaFailsItsTwinsPromptly) {
  const Case c{{2}, 2, "1f1b", 2};
  auto grid = shardline::testing::LocalGrid::Create(GridSpec(c), c.cuts, absl::Seconds(60));
  ASSERT_TRUE(grid.ok()) << grid.status();
  ASSERT_TRUE((*grid)->RunStep(1).ok());
  // Replica 1's links break (its neighbours are gone): its stages fail.
  (*grid)->replica(1).links().CloseAll("replica 1's network went away");
  const absl::Time start = absl::Now();
  auto failed = (*grid)->RunStep(2);
  EXPECT_FALSE(failed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "replica 0 waited out the collective's timeout";
}

}  // namespace
}  // namespace shardline::worker::runtime
