#include "worker/nn/optimizer.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/backend/backend_test_util.h"
#include "tests/worker/nn/nn_test_util.h"

namespace shardline::worker::nn {
namespace {

TEST(OptimizerTest, WarmupThenCosineDecay) {
  OptimizerConfig c;
  c.lr = 1.0;
  c.warmup_steps = 10;
  c.total_steps = 110;
  c.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(c, 1), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(c, 10), 1.0);
  EXPECT_NEAR(LearningRate(c, 60), 0.55, 1e-12);  // half-way down the cosine
  EXPECT_NEAR(LearningRate(c, 110), 0.1, 1e-12);
  c.warmup_steps = 0;
  EXPECT_NEAR(LearningRate(c, 0), 1.0, 1e-12);
}

TEST(OptimizerTest, ClipFactorOnlyShrinks) {
  OptimizerConfig c;
  EXPECT_EQ(ClipFactor(c, 100.0), 1.0) << "clipping off";
  c.grad_clip = 1.0;
  EXPECT_EQ(ClipFactor(c, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(ClipFactor(c, 4.0), 0.25);
  EXPECT_EQ(ClipFactor(c, 0.0), 1.0);
}

// Two AdamW steps on two parameters, one decayed and one not, against the
// update computed by hand in double.
TEST(OptimizerTest, AdamWDecaysOnlyMarkedParameters) {
  auto backend = testing::CpuBackend();
  OptimizerConfig c;
  c.lr = 0.1;
  c.weight_decay = 0.5;
  c.total_steps = 1000;  // keeps the rate at lr for two steps
  c.min_lr_ratio = 1.0;
  auto weight = CreateParameter(*backend, 1, "w", {3}, InitKind::kOnes, 0, /*decay=*/true);
  auto bias = CreateParameter(*backend, 1, "b", {3}, InitKind::kOnes, 0, /*decay=*/false);
  ASSERT_TRUE(weight.ok() && bias.ok());
  const std::vector<float> g = {0.5f, -1.0f, 2.0f};
  Optimizer optimizer(*backend, c);
  for (int step = 1; step <= 2; ++step) {
    for (Parameter* p : {&*weight, &*bias}) {
      ASSERT_TRUE(backend->CopyToDevice(absl::Span<const float>(g), p->g()).ok());
    }
    ASSERT_TRUE(optimizer.Step({&*weight, &*bias}, step, /*grad_factor=*/0.5).ok());
  }
  for (bool decay : {true, false}) {
    std::vector<float> got(3);
    Parameter& p = decay ? *weight : *bias;
    ASSERT_TRUE(backend->CopyToHost(DeviceSpan<const float>(p.v()), absl::Span<float>(got)).ok());
    for (int i = 0; i < 3; ++i) {
      double value = 1.0, m = 0.0, v = 0.0;
      for (int t = 1; t <= 2; ++t) {
        const double gi = 0.5 * g[i];
        m = 0.9 * m + 0.1 * gi;
        v = 0.95 * v + 0.05 * gi * gi;
        const double update = (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.95, t))) + 1e-8);
        value -= 0.1 * (update + (decay ? 0.5 : 0.0) * value);
      }
      EXPECT_NEAR(got[i], value, 1e-6) << (decay ? "weight" : "bias") << "[" << i << "]";
    }
  }
}

// A share (ZeRO-1): the elements in its runs get exactly the bits a whole
// step gives them, the others stay as they were, and the state holds the
// runs alone, end to end; runs out of order or range are refused.
TEST(OptimizerTest, AShareUpdatesItsRunsAsAWholeStepWould) {
  for (bool adamw : {true, false}) {
    auto backend = testing::CpuBackend();
    OptimizerConfig c;
    c.adamw = adamw;
    c.lr = 0.1;
    c.weight_decay = 0.1;
    c.total_steps = 10;
    auto whole = CreateParameter(*backend, 1, "w", {10}, InitKind::kNormal, 1.0f, /*decay=*/true);
    auto part = CreateParameter(*backend, 1, "w", {10}, InitKind::kNormal, 1.0f, /*decay=*/true);
    ASSERT_TRUE(whole.ok() && part.ok());
    const std::vector<float> initial = testing::Download(*backend, part->value);
    Optimizer a(*backend, c), b(*backend, c);
    const Optimizer::Share share = {{1, 3}, {6, 9}};
    for (int step = 1; step <= 3; ++step) {
      const std::vector<float> g = testing::RandomVector(10, 40 + step);
      for (Parameter* p : {&*whole, &*part}) {
        ASSERT_TRUE(backend->CopyToDevice(absl::Span<const float>(g), p->g()).ok());
      }
      ASSERT_TRUE(a.Step({&*whole}, step, 0.7).ok());
      ASSERT_TRUE(b.StepShares({&*part}, {share}, step, 0.7).ok());
    }
    const std::vector<float> want = testing::Download(*backend, whole->value);
    const std::vector<float> got = testing::Download(*backend, part->value);
    for (int i = 0; i < 10; ++i) {
      const bool mine = (i >= 1 && i < 3) || (i >= 6 && i < 9);
      EXPECT_EQ(got[i], mine ? want[i] : initial[i]) << (adamw ? "adamw" : "sgd") << " element " << i;
    }
    EXPECT_EQ(part->state1.bytes(), 5 * sizeof(float));
    EXPECT_EQ(part->state2.bytes(), adamw ? 5 * sizeof(float) : 0u);
    const std::vector<float> m_whole = testing::Download(*backend, whole->state1);
    const std::vector<float> m_part = testing::Download(*backend, part->state1);
    EXPECT_EQ(m_part, (std::vector<float>{m_whole[1], m_whole[2], m_whole[6], m_whole[7], m_whole[8]}));
    EXPECT_EQ(b.StepShares({&*part}, {{{6, 9}, {1, 3}}}, 4, 1.0).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(b.StepShares({&*part}, {{{1, 11}}}, 4, 1.0).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(b.StepShares({&*part}, {{{1, 3}}}, 4, 1.0).code(), absl::StatusCode::kFailedPrecondition)
        << "another share than the state's";
    EXPECT_EQ(b.StepShares({&*part}, {}, 4, 1.0).code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(OptimizerTest, InitialisationDependsOnSeedAndNameOnly) {
  const auto a = InitialValues(7, "blocks.1.mlp.fc.weight", 100, InitKind::kNormal, 0.02f);
  EXPECT_EQ(a, InitialValues(7, "blocks.1.mlp.fc.weight", 100, InitKind::kNormal, 0.02f));
  EXPECT_NE(a, InitialValues(7, "blocks.2.mlp.fc.weight", 100, InitKind::kNormal, 0.02f));
  EXPECT_NE(a, InitialValues(8, "blocks.1.mlp.fc.weight", 100, InitKind::kNormal, 0.02f));
  double sq = 0;
  for (float v : a) sq += static_cast<double>(v) * v;
  EXPECT_NEAR(std::sqrt(sq / 100), 0.02, 0.006);
  EXPECT_EQ(InitialValues(7, "ln_f.weight", 4, InitKind::kOnes, 0), std::vector<float>(4, 1.0f));
}

}  // namespace
}  // namespace shardline::worker::nn
