// Data parallelism against the reference trainer (design brief §10): d
// replicas of a p-stage pipeline, each stage's replicas summing their
// gradients through the in-process collective, must give the losses, grad
// norms and weights of shardline-train with the same spec bit for bit, for
// (p, d) in {(1,2), (2,2), (3,2), (1,4)}, uneven cuts and both schedules;
// the replicas of a stage hold the same weights after every step; and the
// run stays within 1e-4 of the d = 1 run of the same global batch, from
// which only the order of the sums differs. With shard_optimizer (ZeRO-1)
// everything stays the same bits, and the optimizer state is split.
#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_grid.h"
#include "tests/worker/nn/nn_test_util.h"
#include "tests/worker/runtime/grid_test_util.h"
#include "worker/runtime/norm_pieces.h"
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
  return testing::TinyGridSpec(static_cast<int>(c.cuts.size()) + 1, c.replicas, c.schedule, c.micro_batches,
                               c.bucket_mib);
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
    testing::ExpectReplicasAgree(**grid, step);
  }
  testing::ExpectReferenceWeights(**reference, **grid);
}

INSTANTIATE_TEST_SUITE_P(Grids, DataParallelTest,
                         ::testing::Values(Case{{}, 2, "1f1b", 2}, Case{{2}, 2, "1f1b", 3},
                                           Case{{1}, 2, "gpipe", 2}, Case{{1, 3}, 2, "1f1b", 3},
                                           Case{{1, 2}, 2, "gpipe", 2}, Case{{}, 4, "1f1b", 2},
                                           Case{{}, 4, "gpipe", 1}, Case{{2}, 2, "1f1b", 3, 1.0 / 256},
                                           Case{{1, 3}, 3, "gpipe", 2, 1.0 / 256}, Case{{1, 3}, 2, "zb", 3},
                                           Case{{2}, 2, "zb", 4, 1.0 / 256}),
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

// ZeRO-1 (parallel.shard_optimizer) against plain data parallelism: the
// same losses, norms and weights bit for bit, every replica holding the
// gathered weights after every step; the replicas' optimizer state adds up
// to the plain run's, each holding about 1/d of it; the exported state
// (weights and optimizer state, as a checkpoint holds them) is the same.
struct ShardCase {
  Case grid;
  std::string optimizer = "adamw";
  int d_model = 16;  // 256: matrices of several norm pieces, split between replicas
};

class ShardedOptimizerTest : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardedOptimizerTest, MatchesPlainDataParallelBitForBit) {
  const ShardCase& c = GetParam();
  auto plain_spec = GridSpec(c.grid);
  plain_spec.mutable_model()->set_d_model(c.d_model);
  plain_spec.mutable_train()->mutable_optimizer()->set_kind(c.optimizer);
  if (c.optimizer == "sgd") plain_spec.mutable_train()->mutable_optimizer()->set_momentum(0.9);
  auto sharded_spec = plain_spec;
  sharded_spec.mutable_parallel()->set_shard_optimizer(true);
  auto plain = shardline::testing::LocalGrid::Create(plain_spec, c.grid.cuts);
  ASSERT_TRUE(plain.ok()) << plain.status();
  auto sharded = shardline::testing::LocalGrid::Create(sharded_spec, c.grid.cuts);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  const int d = c.grid.replicas;
  for (int step = 1; step <= 3; ++step) {
    auto want = (*plain)->RunStep(step);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*sharded)->RunStep(step);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->loss, want->loss) << "step " << step;
    const auto weights = testing::ReplicaWeights((*plain)->replica(0));
    for (int r = 0; r < d; ++r) {
      EXPECT_TRUE(testing::ReplicaWeights((*sharded)->replica(r)) == weights) << "replica " << r << " after step " << step;
    }
    for (size_t s = 0; s < got->results[0].size(); ++s) {
      const size_t whole = want->results[0][s].optimizer_state_bytes;
      ASSERT_GT(whole, 0u);
      size_t sum = 0, most = 0;
      for (int r = 0; r < d; ++r) {
        const StageStepResult& stage = got->results[r][s];
        EXPECT_EQ(stage.grad_norm, want->results[r][s].grad_norm) << "step " << step << " stage " << s;
        EXPECT_EQ(want->results[r][s].optimizer_state_bytes, whole) << "plain replicas hold it all";
        sum += stage.optimizer_state_bytes;
        most = std::max(most, stage.optimizer_state_bytes);
      }
      EXPECT_EQ(sum, whole) << "stage " << s << ": the shares cover the state once";
      // One bucket per stage here: a replica's run of pieces passes its d-th
      // by less than one piece (or the stage's largest parameter, if smaller).
      size_t largest = 0;
      for (nn::Parameter* p : (*plain)->replica(0).runtime(s).parameters()) largest = std::max(largest, p->count());
      const size_t per_element = c.optimizer == "adamw" ? 2 * sizeof(float) : sizeof(float);
      EXPECT_LE(most, whole / d + std::min(largest, kNormPieceElements) * per_element) << "stage " << s;
      RecordProperty(absl::StrCat("stage", s, "_state_share"), absl::StrCat(static_cast<double>(most) / whole));
    }
  }
  // Checkpoints: the same tensors, optimizer state included, from every replica.
  for (int s = 0; s < (*plain)->replica(0).stages(); ++s) {
    auto want = (*plain)->replica(0).stage(s).ExportState();
    ASSERT_TRUE(want.ok()) << want.status();
    std::vector<absl::StatusOr<std::map<std::string, common::Tensor>>> got(d);
    std::vector<std::thread> exports;  // a collective: every replica at once
    for (int r = 0; r < d; ++r) exports.emplace_back([&, r] { got[r] = (*sharded)->replica(r).stage(s).ExportState(); });
    for (auto& t : exports) t.join();
    for (int r = 0; r < d; ++r) {
      ASSERT_TRUE(got[r].ok()) << got[r].status();
      ASSERT_EQ(got[r]->size(), want->size()) << "replica " << r << " stage " << s;
      for (const auto& [name, tensor] : *want) {
        ASSERT_TRUE(got[r]->count(name)) << name;
        const absl::Span<const float> a = tensor.values<float>(), b = got[r]->at(name).values<float>();
        EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << name << " on replica " << r;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grids, ShardedOptimizerTest,
    ::testing::Values(ShardCase{Case{{}, 2, "1f1b", 2}}, ShardCase{Case{{2}, 2, "gpipe", 2}, "sgd"},
                      ShardCase{Case{{1, 3}, 2, "1f1b", 2}}, ShardCase{Case{{}, 4, "1f1b", 1}},
                      ShardCase{Case{{}, 2, "1f1b", 2}, "adamw", 256}, ShardCase{Case{{1}, 4, "gpipe", 1}, "adamw", 256}),
    [](const ::testing::TestParamInfo<ShardCase>& info) {
      return absl::StrCat(Name(info.param.grid), "_", info.param.optimizer, "_d", info.param.d_model);
    });

// A wide model whose matrices span several small buckets (a replica owns a
// run of each): still the reference trainer's bits.
TEST(ShardedOptimizerTest, ManySmallBucketsMatchTheReferenceTrainer) {
  auto spec = GridSpec(Case{{2}, 2, "1f1b", 2});
  spec.mutable_model()->set_d_model(256);
  spec.mutable_parallel()->set_bucket_mib(0.5);  // 2 pieces per bucket; a 256×1024 matrix is 4
  spec.mutable_parallel()->set_shard_optimizer(true);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto grid = shardline::testing::LocalGrid::Create(spec, {2});
  ASSERT_TRUE(grid.ok()) << grid.status();
  for (int step = 1; step <= 3; ++step) {
    auto want = (*reference)->TrainStep(step);
    auto got = (*grid)->RunStep(step);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " / " << got.status();
    EXPECT_EQ(got->loss, want->loss) << "step " << step;
    EXPECT_EQ(got->results[1][0].grad_norm, want->grad_norm) << "step " << step;
  }
  auto want = (*reference)->runtime().ExportWeights();
  ASSERT_TRUE(want.ok());
  for (int r = 0; r < 2; ++r) {
    const auto got = testing::ReplicaWeights((*grid)->replica(r));
    for (const auto& [name, tensor] : *want) {
      const auto b = tensor.values<float>();
      ASSERT_EQ(got.at(name), std::vector<float>(b.begin(), b.end())) << name << " on replica " << r;
    }
  }
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
