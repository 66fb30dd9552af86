// A grid shrunk to fewer data-parallel replicas than its spec's (the
// coordinator's re-plan after a loss): each replica runs d / d′ of the
// spec's replicas' micro-batch groups one after the other, keeping each
// group's gradients apart and adding them as parts of the data-parallel sum
// (PipelineStageOptions::groups), so the losses, grad norms and weights are
// the reference trainer's with the spec, bit for bit: one replica standing
// for all, or several for some; both schedules and zero-bubble; ZeRO-1.
// The same grid summing its groups together (as a plain d′-replica spec
// would) drifts from them, which is what the groups are for.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/local_grid.h"
#include "tests/worker/nn/nn_test_util.h"
#include "tests/worker/runtime/grid_test_util.h"
#include "worker/trainer/trainer.h"

namespace shardline::worker::runtime {
namespace {

struct Case {
  std::vector<int> cuts;  // first unit of stages 1..p−1; the tiny model has 4 units
  int replicas;           // the spec's d
  int folded;             // the grid's d′
  std::string schedule;
  int micro_batches;  // per replica of the spec
  bool shard_optimizer = false;
  double bucket_mib = 25;
};

std::string Name(const Case& c) {
  return absl::StrCat(c.cuts.size() + 1, "stages_", c.replicas, "replicas_on_", c.folded, "_", c.schedule, "_m",
                      c.micro_batches, c.shard_optimizer ? "_zero1" : "", c.bucket_mib < 1 ? "_small_buckets" : "");
}

shardline::v1::JobSpec GridSpec(const Case& c) {
  auto spec = testing::TinyGridSpec(static_cast<int>(c.cuts.size()) + 1, c.replicas, c.schedule, c.micro_batches,
                                    c.bucket_mib);
  spec.mutable_parallel()->set_shard_optimizer(c.shard_optimizer);
  return spec;
}

class FoldedReplicasTest : public ::testing::TestWithParam<Case> {};

TEST_P(FoldedReplicasTest, LossesAndWeightsMatchTheReferenceTrainerWithTheSpecBitForBit) {
  const Case& c = GetParam();
  const auto spec = GridSpec(c);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto grid = shardline::testing::LocalGrid::Create(spec, c.cuts, absl::Seconds(30), c.folded);
  ASSERT_TRUE(grid.ok()) << grid.status();
  ASSERT_EQ((*grid)->replicas(), c.folded);
  const int groups = c.replicas / c.folded;
  for (int step = 1; step <= 4; ++step) {
    auto want = (*reference)->TrainStep(step);
    ASSERT_TRUE(want.ok()) << want.status();
    auto got = (*grid)->RunStep(step);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->loss, want->loss) << "step " << step;
    for (int r = 0; r < c.folded; ++r) {
      for (const StageStepResult& stage : got->results[r]) {
        EXPECT_EQ(stage.grad_norm, want->grad_norm) << "step " << step << " replica " << r;
      }
      EXPECT_EQ(got->results[r].back().group_losses.size(), static_cast<size_t>(groups));
      EXPECT_EQ(got->results[r].front().tokens, want->tokens / c.folded) << "each replica trains 1/d′";
    }
    testing::ExpectReplicasAgree(**grid, step);
  }
  testing::ExpectReferenceWeights(**reference, **grid);
}

INSTANTIATE_TEST_SUITE_P(
    Grids, FoldedReplicasTest,
    ::testing::Values(Case{{}, 2, 1, "1f1b", 2}, Case{{}, 4, 2, "1f1b", 2}, Case{{}, 4, 1, "gpipe", 1},
                      Case{{2}, 2, 1, "1f1b", 3}, Case{{1, 3}, 2, 1, "gpipe", 2}, Case{{2}, 4, 2, "zb", 2},
                      Case{{1, 3}, 2, 1, "zb", 3, false, 1.0 / 256}, Case{{}, 4, 2, "1f1b", 1, true},
                      Case{{2}, 4, 2, "gpipe", 2, true, 1.0 / 256}, Case{{2}, 2, 1, "1f1b", 2, true}),
    [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

// The folded spec run as a plain grid (each replica's groups summed as one
// accumulation) is not the spec's arithmetic: within rounding, not the bits.
TEST(FoldedReplicasTest, SummingTheGroupsTogetherIsNotTheSpecsBits) {
  const Case c{{2}, 2, 1, "1f1b", 2};
  const auto spec = GridSpec(c);
  auto backend = testing::CpuBackend();
  auto reference = trainer::Trainer::Create(spec, *backend);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto plain = shardline::testing::LocalGrid::Create(common::FoldReplicas(spec, 1), c.cuts);
  ASSERT_TRUE(plain.ok()) << plain.status();
  bool differs = false;
  for (int step = 1; step <= 4; ++step) {
    auto want = (*reference)->TrainStep(step);
    auto got = (*plain)->RunStep(step);
    ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " / " << got.status();
    EXPECT_NEAR(got->loss, want->loss, 1e-4 * std::fabs(want->loss));
    differs |= got->loss != want->loss;
  }
  auto want = (*reference)->runtime().ExportWeights();
  ASSERT_TRUE(want.ok());
  const auto got = testing::ReplicaWeights((*plain)->replica(0));
  for (const auto& [name, tensor] : *want) {
    const auto b = tensor.values<float>();
    differs |= got.at(name) != std::vector<float>(b.begin(), b.end());
  }
  EXPECT_TRUE(differs);
}

TEST(FoldedReplicasTest, GroupsThatDoNotDivideTheMicroBatchesAreRefused) {
  auto spec = GridSpec(Case{{}, 4, 2, "1f1b", 2});
  EXPECT_EQ(shardline::testing::LocalGrid::Create(spec, {}, absl::Seconds(30), 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardline::worker::runtime
