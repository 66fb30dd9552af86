// The rule GrpcCollective follows for one round or two, and the tensor
// groups' bytes the cost model counts from it.
#include <string>

#include "common/cost_model.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace shardline::common {
namespace {

TEST(AllReduceRoundsTest, APairTakesOneRoundUpToTheLimitALargerGroupWhileTheExtraBytesAreSmall) {
  EXPECT_TRUE(AllReduceInOneRound(4, 2));
  EXPECT_TRUE(AllReduceInOneRound(kOneRoundAllReduceBytes, 2));
  EXPECT_FALSE(AllReduceInOneRound(kOneRoundAllReduceBytes + 4, 2));
  // d = 3: one round sends (2 − 4/3) = 2/3 of the buffer more: 64 KiB at 96 KiB.
  EXPECT_TRUE(AllReduceInOneRound(96 << 10, 3));
  EXPECT_FALSE(AllReduceInOneRound((96 << 10) + 4, 3));
  // d = 4: 3 − 3/2 = 3/2 of the buffer more: 64 KiB at 43,690.7 bytes.
  EXPECT_TRUE(AllReduceInOneRound(43688, 4));
  EXPECT_FALSE(AllReduceInOneRound(43692, 4));
  EXPECT_FALSE(AllReduceInOneRound(4, 2, /*one_round_bytes=*/0));
}

TEST(AllReduceRoundsTest, ARankReceivesTheOthersWholeBuffersOrItsShareOfTwoRounds) {
  EXPECT_EQ(AllReduceBytesReceived(4000, 1), 0.0);
  EXPECT_EQ(AllReduceBytesReceived(4000, 2), 4000.0);           // one round: the other's buffer
  EXPECT_EQ(AllReduceBytesReceived(4 << 20, 2), 4 << 20);       // two: half, twice
  EXPECT_EQ(AllReduceBytesReceived(4000, 4), 12000.0);          // one round: three buffers
  EXPECT_EQ(AllReduceBytesReceived(1 << 20, 4), 1.5 * (1 << 20));  // two: 2 · 3/4
}

// A 2-block model on one stage, vocabulary-parallel: per micro-batch 8 block
// all-reduces and 2 more (embedding, head), of 2 × 16 tokens × 64 floats (8
// KiB: one round for 2 and 4 ranks), the loss parts' all-gather, the norm's.
TEST(AllReduceRoundsTest, TheTensorGroupsBytesFollowTheRounds) {
  auto spec = ParseJobSpec(R"({
    "model": {"kind": "gpt", "vocab_size": 16, "context": 16, "d_model": 64, "n_heads": 4, "n_layers": 2},
    "data": {"kind": "addition", "digits": 2},
    "train": {"steps": 1, "global_batch": 8, "micro_batches": 4, "optimizer": {"kind": "adamw", "lr": 0.001}},
    "parallel": {"pipeline_stages": 1, "tensor_parallel": 2, "vocab_parallel": true}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(VocabParallel(*spec));
  const int units = PipelineUnits(spec->model());
  const double tokens = 2 * 16, activation = tokens * 64 * 4;  // bytes
  for (int t : {2, 4}) {
    spec->mutable_parallel()->set_tensor_parallel(t);
    const double per_micro_batch = 10 * (t - 1) * activation + (t - 1.0) / t * 3 * tokens * t * 4;
    EXPECT_DOUBLE_EQ(TensorGroupBytesPerRank(*spec, 0, units), 4 * per_micro_batch + (t - 1) * 8.0) << t << " ranks";
  }
}

}  // namespace
}  // namespace shardline::common
